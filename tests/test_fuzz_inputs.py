"""Fuzzed study files and cluster files: the CLI exits 0 or 2, never with a traceback (issue 11).

Hypothesis edits a small valid file: a field set to a value of another type or
an extreme (NaN, infinity, huge or negative numbers, text, lists, mappings), a
field removed or an unknown one added. Each edited file goes through the real
command (``sweep`` for studies, ``estimate`` for clusters) in-process; any
exception escaping ``main`` is a failure, and so is an exit status other than
0 or 2 or, with status 2, anything but one ``comet-dse: error:`` line. Studies
run with a low ``--max-points`` so that every example stays fast.
"""
from __future__ import annotations

import contextlib
import copy
import io
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from comet_dse.cli import main
from comet_dse.presets.catalog import preset_data

STUDY = {
    "name": "fuzz",
    "models": ["megatron-1.7b"],
    "cluster": "dgx-a100-80gb",
    "devices": [8],
    "global_batch": 16,
    "expansion": {"capacity": "64 GiB", "bandwidth": "64 GB/s", "latency": "1 us"},
    "axes": {"hbm_capacity": {"scale": [0.5, 1.0]}, "network.nvlink.link_bandwidth": {"values": ["25 GB/s"]},
             "expansion_capacity": {"values": ["0 GiB", "32 GiB"]}},
    "baseline": {"hbm_capacity": 1.0},
    "strategy": {"tp": [2, 8], "zero": [0, 1], "micro_batch": [1, 2]},
    "figures": ["speedup"],
}
CLUSTER = preset_data("clusters", "dgx-a100-80gb")

SCALARS = hs.one_of(
    hs.none(), hs.booleans(),
    hs.integers(min_value=-(10**30), max_value=10**30),
    hs.sampled_from([0, -1, 1, 2, 3, 7, 8, 64, 4096, 10**9, 10**12, 2**63, 10**400]),
    hs.floats(allow_nan=True, allow_infinity=True),
    hs.sampled_from(["80 GiB", "80 TB", "-1 GiB", "1 us", "5 s", "25 GB/s", "200 Gb/s", "1e30", ".nan", "x2",
                     "312 TFLOP/s", "", " ", "base", "switch", "ring", "torus", "mesh", "\x1b[31m", "../x",
                     "/abs/path", "nvlink", "infiniband", "bf16", "fp8", "selective", "none", "on"]),
    hs.text(max_size=8),
)
VALUES = hs.one_of(
    SCALARS,
    hs.lists(SCALARS, max_size=4),
    hs.dictionaries(hs.sampled_from(["values", "scale", "capacity", "bandwidth", "x", "size", "name"]), SCALARS,
                    max_size=2),
    hs.dictionaries(hs.sampled_from(["values", "scale"]), hs.lists(SCALARS, min_size=1, max_size=3), max_size=1),
)


def _paths(data, prefix=()) -> list:
    """Every key path of a nested mapping (lists of mappings by index), leaves and inner nodes."""
    out = []
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        out.append(prefix + (key,))
        out.extend(_paths(value, prefix + (key,)))
    return out


def _edit(data, path: tuple, action: str, value):
    """Apply one edit at ``path``: set it to ``value``, delete it, or add an unknown key beside it."""
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "set":
        parent[last] = value
    elif action == "delete" and isinstance(parent, dict):
        del parent[last]
    elif isinstance(parent, dict):
        parent[f"{last}x"] = value


def _edits(base: dict):
    paths = _paths(base) + [("axes", name) for name in ("peak_flops", "network_latency", "sram_capacity",
                                                         "network", "expansion_bandwidth", "device_price_usd",
                                                         "network.infiniband.topology", "network.nvlink.efficiency")]
    paths += [("strategy", knob) for knob in ("ep", "cp", "pp", "dp", "dtype", "recompute", "placement",
                                             "moe_imbalance", "max_micro_batch")]
    paths += [(key,) for key in ("seq_len", "token_budget", "networks", "output", "clusters")]
    return hs.lists(hs.tuples(hs.sampled_from(paths), hs.sampled_from(["set", "set", "set", "delete", "add"]),
                              VALUES), min_size=1, max_size=3)


def _run(argv: list) -> None:
    """Run the CLI in-process; fail on a traceback, another status than 0 or 2, or a messy error."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:       # argparse errors
            code = exc.code
    lines = err.getvalue().strip().splitlines()
    assert code in (0, 2), (code, err.getvalue())
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("comet-dse: error: "), err.getvalue()


def _apply(base: dict, edits: list) -> dict:
    data = copy.deepcopy(base)
    for path, action, value in edits:
        try:
            _edit(data, path, action, value)
        except (KeyError, IndexError, TypeError):
            pass                        # an earlier edit removed or replaced the parent: skip
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_edits(STUDY))
def test_fuzzed_study_exits_0_or_2(edits):
    data = _apply(STUDY, edits)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "study.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        _run(["sweep", path, "--output", Path(folder) / "r.parquet", "--no-progress", "--max-points", 4000])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_edits(CLUSTER))
def test_fuzzed_cluster_exits_0_or_2(edits):
    data = _apply(CLUSTER, edits)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cluster.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        _run(["estimate", "--model", "megatron-1.7b", "--cluster", path, "--devices", 8, "--tp", 8,
              "--global-batch", 8])
        _run(["search", "--model", "megatron-1.7b", "--cluster", path, "--devices", 16, "--global-batch", 16,
              "--tp", "2,8", "--recompute", "none"])


@settings(max_examples=30, deadline=None)
@given(hs.binary(max_size=300))
def test_arbitrary_bytes_as_study_or_cluster_exit_2(raw):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "input.yaml"
        path.write_bytes(raw)
        _run(["sweep", path, "--output", Path(folder) / "r.parquet", "--no-progress", "--max-points", 4000])
        _run(["estimate", "--model", "megatron-1.7b", "--cluster", path, "--devices", 8, "--tp", 8,
              "--global-batch", 8])


def test_a_baseline_beyond_float_range_is_one_line():
    """Found by the fuzzer: baseline {hbm_capacity: 10**400} raised OverflowError (int too large for a float)."""
    data = copy.deepcopy(STUDY)
    data["baseline"] = {"hbm_capacity": 10**400}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "study.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        _run(["sweep", path, "--output", Path(folder) / "r.parquet", "--no-progress", "--max-points", 4000])
