"""The command line: ``comet-dse estimate | presets | validate`` and its bad-input contract.

Most tests call ``comet_dse.cli.main`` in-process (fast); one test runs the real
interpreter to check exit statuses and that nothing prints a traceback.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import yaml

from comet_dse.answers.validation import STEP_TIME_DATASETS
from comet_dse.base.units import format_time
from cli_run import one_line_error, run

PACKAGE = Path(str(resources.files("comet_dse")))
MODEL_PRESETS = sorted(p.stem for p in (PACKAGE / "presets" / "models").glob("*.yaml"))
CLUSTER_PRESETS = sorted(p.stem for p in (PACKAGE / "presets" / "clusters").glob("*.yaml"))
VALIDATION_DIR = PACKAGE / "data" / "validation"
VALIDATION_CSVS = sorted(STEP_TIME_DATASETS)      # the step-time datasets (memory.csv and the simulator's rows are not)

README_EXAMPLE = [
    "estimate", "--model", "megatron-1t", "--cluster", "dgx-a100-80gb", "--devices", "512",
    "--tp", "8", "--pp", "64", "--dp", "1", "--global-batch", "512", "--micro-batch", "1",
    "--recompute", "selective", "--sequence-parallel",
]
# Fits neither in weights nor optimizer state: ~2.2 TiB per device on an 80 GiB part.
INFEASIBLE = [
    "estimate", "--model", "megatron-1t", "--cluster", "dgx-a100-80gb", "--devices", "8",
    "--tp", "8", "--pp", "1", "--global-batch", "8",
]
SMALL = ["--cluster", "dgx-a100-80gb", "--devices", "8", "--tp", "8", "--global-batch", "8"]


def run_json(capsys, *argv) -> dict:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    assert err == ""
    return json.loads(out)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def preset_yaml(kind: str, name: str) -> dict:
    return yaml.safe_load((PACKAGE / "presets" / kind / f"{name}.yaml").read_text(encoding="utf-8"))


SMALL_MODEL = {"name": "tiny", "layers": 24, "hidden": 1024, "heads": 16, "ffn": 4096, "vocab": 51200, "seq_len": 2048}


# --- version ----------------------------------------------------------------------------------

def test_version_prints_the_package_version(capsys):
    """``comet-dse --version`` prints version.py's version, which is also the installed distribution's
    (pyproject.toml reads it from version.py), and exits 0."""
    from importlib.metadata import version

    from comet_dse.version import __version__

    code, out, err = run(capsys, "--version")
    assert code == 0, err
    assert out == f"comet-dse {__version__}\n"
    assert version("comet-dse") == __version__


# --- estimate ---------------------------------------------------------------------------------

def test_readme_example_prints_breakdown(capsys):
    code, out, err = run(capsys, *README_EXAMPLE)
    assert code == 0, err
    assert err == ""
    for text in ("Step time", "Throughput", "MFU / HFU", "Time per iteration", "Memory per device",
                 "pipeline bubble (idle)", "Feasible: yes"):
        assert text in out, text
    assert "Feasible: NO" not in out
    assert out.splitlines()[0] == "megatron-1t on 512 x dgx-a100-80gb"
    assert "tp=8 pp=64 dp=1" in out
    assert "recompute selective, sequence parallel on" in out
    assert "2 layers on the busiest stage" in out  # 128 layers / pp 64

    # The text shows the same numbers as --json.
    data = run_json(capsys, *README_EXAMPLE)
    step_line = next(line for line in out.splitlines() if line.startswith("Step time"))
    assert step_line.split(None, 2)[2] == format_time(data["step_time_s"])
    mfu_line = next(line for line in out.splitlines() if line.startswith("MFU / HFU"))
    assert f"{data['mfu'] * 100:.1f}% / {data['hfu'] * 100:.1f}%" in mfu_line


def test_json_contract(capsys):
    data = run_json(capsys, *README_EXAMPLE)
    assert isinstance(data, dict)
    assert data["feasible"] is True
    assert data["reasons"] == []
    step = data["step_time_s"]
    assert isinstance(step, float) and math.isfinite(step) and step > 0
    # tokens/s is the global batch of 2048-token sequences over the step time.
    assert data["tokens_per_second"] == pytest.approx(512 * 2048 / step, rel=1e-12)
    for key in ("mfu", "hfu"):
        assert isinstance(data[key], float)
        assert 0.0 < data[key] <= 1.0, (key, data[key])
    assert data["hfu"] >= data["mfu"]  # selective recomputation adds hardware FLOPs, never removes model FLOPs
    parts = data["memory_bytes"]
    assert set(parts) >= {"weights", "gradients", "optimizer", "activations"}
    assert all(isinstance(v, int) and v >= 0 for v in parts.values())
    total = data["memory_per_device_bytes"]
    assert isinstance(total, int) and not isinstance(total, bool)
    assert abs(total - sum(parts.values())) <= len(parts)
    assert 0 < total <= 80 * 2**30  # feasible: fits in the 80 GiB of HBM
    breakdown = data["breakdown_s"]
    assert all(isinstance(v, float) and v >= 0 for v in breakdown.values())
    assert math.fsum(breakdown.values()) == pytest.approx(step, rel=1e-9)
    assert breakdown["pipeline_bubble"] > 0  # pp = 64
    assert data["inputs"]["model"] == "megatron-1t"
    assert data["inputs"]["cluster"] == "dgx-a100-80gb"
    assert data["inputs"]["devices"] == 512
    strategy = data["inputs"]["strategy"]
    assert (strategy["tp"], strategy["pp"], strategy["dp"]) == (8, 64, 1)
    assert strategy["recompute"] == "selective" and strategy["sequence_parallel"] is True
    assert data["layers_per_stage"] == 2
    assert data["microbatches"] == 512


def test_dp_defaults_to_devices_over_tp_pp(capsys):
    i = README_EXAMPLE.index("--dp")
    argv = README_EXAMPLE[:i] + README_EXAMPLE[i + 2:]
    assert "--dp" not in argv
    data = run_json(capsys, *argv)
    assert data["inputs"]["strategy"]["dp"] == 1
    assert data["step_time_s"] == run_json(capsys, *README_EXAMPLE)["step_time_s"]


def test_infeasible_but_valid_config_is_a_result_not_an_error(capsys):
    data = run_json(capsys, *INFEASIBLE)
    assert data["feasible"] is False
    assert len(data["reasons"]) == 1
    reason = data["reasons"][0]
    assert reason.startswith("needs ")
    assert "per device (" in reason
    assert reason.endswith("HBM holds 80.0 GiB")
    assert data["memory_per_device_bytes"] > 80 * 2**30
    assert data["step_time_s"] > 0

    code, out, err = run(capsys, *INFEASIBLE)
    assert code == 0 and err == ""
    assert "Feasible: NO" in out and "Feasible: yes" not in out
    assert f"  - {reason}" in out.splitlines()


def test_seq_len_override(capsys):
    base = run_json(capsys, *README_EXAMPLE)
    longer = run_json(capsys, *README_EXAMPLE, "--seq-len", "4096")
    assert base["tokens_per_second"] * base["step_time_s"] == pytest.approx(512 * 2048)
    assert longer["tokens_per_second"] * longer["step_time_s"] == pytest.approx(512 * 4096)
    assert longer["step_time_s"] > 1.5 * base["step_time_s"]


# --- presets ----------------------------------------------------------------------------------

def test_preset_folders_hold_the_documented_presets():
    for name in ("megatron-1t", "gpt3-175b", "llama3-405b", "llama3-8b"):
        assert name in MODEL_PRESETS
    assert {"dgx-a100-80gb", "dgx-h100", "dojo", "tpu-v4"} <= set(CLUSTER_PRESETS)


def test_presets_lists_every_model_and_cluster(capsys):
    code, out, err = run(capsys, "presets")
    assert code == 0 and err == ""
    first_words = {line.split()[0] for line in out.splitlines() if line.strip()}
    for name in MODEL_PRESETS + CLUSTER_PRESETS:
        assert name in first_words, name
    assert "Models" in first_words and "Clusters" in first_words
    megatron = next(line for line in out.splitlines() if line.startswith("megatron-1t "))
    assert "1008.0B" in megatron and "25600" in megatron
    dgx = next(line for line in out.splitlines() if line.startswith("dgx-a100-80gb "))
    assert "80 GiB" in dgx and "312 TFLOP/s bf16" in dgx and "nvlink(8, switch, 300 GB/s)" in dgx


def test_presets_json(capsys):
    data = run_json(capsys, "presets")
    assert sorted(m["name"] for m in data["models"]) == MODEL_PRESETS
    assert sorted(c["name"] for c in data["clusters"]) == CLUSTER_PRESETS
    models = {m["name"]: m for m in data["models"]}
    assert models["megatron-1t"]["layers"] == 128
    assert models["megatron-1t"]["hidden"] == 25600
    assert models["gpt3-175b"]["params"] == pytest.approx(175e9, rel=0.01)
    assert models["llama3-405b"]["params"] == pytest.approx(405e9, rel=0.01)
    devices = {c["name"]: c["device"] for c in data["clusters"]}
    assert devices["dgx-a100-80gb"] == "NVIDIA A100 SXM4 80GB"


# --- validate ---------------------------------------------------------------------------------

def test_validate_table_has_a_line_per_dataset(capsys):
    assert VALIDATION_CSVS  # the packaged copy is there
    code, out, err = run(capsys, "validate", "--data", VALIDATION_DIR)
    assert code == 0 and err == ""
    data = run_json(capsys, "validate", "--data", VALIDATION_DIR)
    lines = out.splitlines()
    header = lines.index(next(line for line in lines if line.split()[:2] == ["dataset", "rows"]))
    summary_lines = lines[header + 2:]  # after the header and the dashes, up to the recall line
    summary_lines = summary_lines[:summary_lines.index("")] if "" in summary_lines else summary_lines
    assert len(summary_lines) == len(VALIDATION_CSVS)
    for csv_name, line in zip(sorted(VALIDATION_CSVS), sorted(summary_lines)):
        cells = line.split()
        assert cells[0] == csv_name.removesuffix(".csv")
        assert int(cells[1]) == sum(1 for r in data["rows"] if r["dataset"] == csv_name)
        assert cells[2].endswith("%") and cells[3].endswith("%")
    # one line per run in the first table
    for row in data["rows"]:
        assert any(row["label"] in line for line in lines), row["label"]


def test_validate_json_rows_and_summary(capsys):
    data = run_json(capsys, "validate", "--data", VALIDATION_DIR)
    assert set(data) >= {"rows", "summary"}
    assert Path(data["data"]) == VALIDATION_DIR
    assert sorted(data["summary"]) == VALIDATION_CSVS
    rows = data["rows"]
    assert len(rows) == sum(s["rows"] for s in data["summary"].values())
    assert len(rows) >= 20
    for row in rows:
        assert row["dataset"] in VALIDATION_CSVS
        assert row["predicted_s"] > 0 and row["measured_s"] > 0
        assert row["error"] == pytest.approx((row["predicted_s"] - row["measured_s"]) / row["measured_s"])
    for name, stats in data["summary"].items():
        errors = [abs(r["error"]) for r in rows if r["dataset"] == name]
        assert stats["rows"] == len(errors)
        assert stats["max_abs_error"] == pytest.approx(max(errors))
        assert stats["mean_abs_error"] == pytest.approx(sum(errors) / len(errors))


def test_validate_missing_folder(capsys, tmp_path):
    one_line_error(run(capsys, "validate", "--data", tmp_path / "nope"), "comet-dse: error: data: ", "is not a folder")


# --- bad input: one line on stderr, exit 2 ----------------------------------------------------

def test_unknown_model_preset_lists_valid_presets(capsys):
    line = one_line_error(run(capsys, "estimate", "--model", "gpt-5", *SMALL),
                            "comet-dse: error: model: ", "unknown preset 'gpt-5'")
    for name in MODEL_PRESETS:
        assert name in line


def test_unknown_cluster_preset(capsys):
    line = one_line_error(
        run(capsys, "estimate", "--model", "megatron-1t", "--cluster", "dgx-z900", "--devices", "8", "--global-batch", "8"),
        "comet-dse: error: cluster: ", "unknown preset 'dgx-z900'")
    for name in CLUSTER_PRESETS:
        assert name in line


def test_malformed_yaml_model(capsys, tmp_path):
    path = write(tmp_path / "broken.yaml", "name: broken\nlayers: [24,\nhidden: 1024\n")
    one_line_error(run(capsys, "estimate", "--model", path, *SMALL),
                     "comet-dse: error: model: ", "is not valid YAML at line")


def test_model_yaml_missing_field(capsys, tmp_path):
    data = {k: v for k, v in SMALL_MODEL.items() if k != "layers"}
    path = write(tmp_path / "nolayers.yaml", yaml.safe_dump(data))
    one_line_error(run(capsys, "estimate", "--model", path, *SMALL), "comet-dse: error: model.layers: is missing")


def test_model_yaml_negative_field(capsys, tmp_path):
    path = write(tmp_path / "neg.yaml", yaml.safe_dump({**SMALL_MODEL, "hidden": -5}))
    one_line_error(run(capsys, "estimate", "--model", path, *SMALL), "comet-dse: error: model.hidden: ", "-5")


def test_model_yaml_that_is_valid_runs(capsys, tmp_path):
    """Control for the bad-YAML tests: the same small model, intact, estimates fine."""
    path = write(tmp_path / "ok.yaml", yaml.safe_dump(SMALL_MODEL))
    data = run_json(capsys, "estimate", "--model", path, *SMALL)
    assert data["inputs"]["model"] == "tiny"
    assert data["feasible"] is True


def test_model_yaml_unknown_field(capsys, tmp_path):
    path = write(tmp_path / "extra.yaml", yaml.safe_dump({**SMALL_MODEL, "hiden": 10}))
    one_line_error(run(capsys, "estimate", "--model", path, *SMALL), "comet-dse: error: model.hiden: unknown field")


def test_model_file_not_utf8(capsys, tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00\x81 not text")
    one_line_error(run(capsys, "estimate", "--model", path, *SMALL), "comet-dse: error: model: ", "not UTF-8")


def cluster_file(tmp_path: Path, hbm_capacity) -> Path:
    data = preset_yaml("clusters", "dgx-a100-80gb")
    data["accelerator"]["memory"]["hbm"]["capacity"] = hbm_capacity
    return write(tmp_path / "cluster.yaml", yaml.safe_dump(data))


def estimate_on(path: Path) -> list:
    return ["estimate", "--model", "megatron-1.7b", "--cluster", path, "--devices", "8", "--global-batch", "8"]


def test_cluster_yaml_copy_of_preset_runs(capsys, tmp_path):
    """Control: the unmodified preset, written to a file, loads; so the failures below are the edit."""
    path = cluster_file(tmp_path, "80 GiB")
    from_file = run_json(capsys, *estimate_on(path))
    from_preset = run_json(capsys, *estimate_on("dgx-a100-80gb"))
    assert from_file["step_time_s"] == from_preset["step_time_s"]
    # A larger but plausible part (4 TiB is the loader's cap) is accepted.
    assert run_json(capsys, *estimate_on(cluster_file(tmp_path, "4 TiB")))["feasible"] is True


def test_cluster_hbm_implausible_capacity(capsys, tmp_path):
    # 80 TB = 8e13 bytes = 72.8 TiB, far beyond the 4 TiB per-device cap.
    one_line_error(run(capsys, *estimate_on(cluster_file(tmp_path, "80 TB"))),
                     "comet-dse: error: cluster.accelerator.memory.hbm.capacity: ", "'80 TB'", "plausible range")


def test_cluster_hbm_capacity_with_wrong_unit(capsys, tmp_path):
    one_line_error(run(capsys, *estimate_on(cluster_file(tmp_path, "80 GFLOP/s"))),
                     "comet-dse: error: cluster.accelerator.memory.hbm.capacity: ", "'GFLOP/s'", "bytes unit")


def test_degrees_must_multiply_to_devices(capsys):
    one_line_error(
        run(capsys, "estimate", "--model", "megatron-1t", "--cluster", "dgx-a100-80gb", "--devices", "512",
            "--tp", "8", "--pp", "8", "--dp", "2", "--global-batch", "512"),
        "comet-dse: error: devices: ", "8*1*8*2 = 128", "512")


def test_devices_not_a_multiple_of_tp_pp(capsys):
    one_line_error(
        run(capsys, "estimate", "--model", "megatron-1t", "--cluster", "dgx-a100-80gb", "--devices", "24",
            "--tp", "16", "--global-batch", "24"),
        "comet-dse: error: devices: ", "not a multiple of tp*cp*pp = 16")


@pytest.mark.parametrize("option, value, needles", [
    ("--tp", "0", ("argument --tp", "positive integer", "0")),
    ("--tp", "abc", ("argument --tp", "positive integer", "'abc'")),
    ("--pp", "-1", ("argument --pp", "positive integer")),
    ("--recompute", "bogus", ("argument --recompute", "'bogus'", "none", "selective", "full")),
    ("--dtype", "fp64", ("argument --dtype", "'fp64'")),
])
def test_bad_option_values(capsys, option, value, needles):
    argv = ["estimate", "--model", "megatron-1t", "--cluster", "dgx-a100-80gb", "--devices", "8",
            "--global-batch", "8", option, value]
    one_line_error(run(capsys, *argv), "comet-dse: error: ", *needles)


def test_config_json_not_json(capsys, tmp_path):
    path = write(tmp_path / "config.json", '{"n_layer": 48,\n  oops')
    one_line_error(run(capsys, "estimate", "--model", path, *SMALL),
                     "comet-dse: error: model: ", "is not valid JSON (line 2)")


def test_config_json_missing_hidden_size(capsys, tmp_path):
    path = write(tmp_path / "config.json", json.dumps({"n_layer": 12, "n_head": 12, "vocab_size": 50257}))
    one_line_error(run(capsys, "estimate", "--model", path, *SMALL),
                     "comet-dse: error: config.json: ", "n_embd or hidden_size")


def test_config_json_that_does_not_exist(capsys, tmp_path):
    one_line_error(run(capsys, "estimate", "--model", tmp_path / "config.json", *SMALL),
                     "comet-dse: error: model: no such file")


# --- the real process -------------------------------------------------------------------------

def test_subprocess_exit_status_and_no_traceback(tmp_path):
    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "comet_dse.cli", *map(str, argv)],
                              capture_output=True, text=True, cwd=tmp_path, timeout=120)

    good = cli(*README_EXAMPLE, "--json")
    assert good.returncode == 0, good.stderr
    assert good.stderr == ""
    assert json.loads(good.stdout)["feasible"] is True

    bad_file = write(tmp_path / "neg.yaml", yaml.safe_dump({**SMALL_MODEL, "hidden": -5}))
    for result in (cli("estimate", "--model", bad_file, *SMALL),   # InputError path
                   cli("estimate", "--model", "megatron-1t", *SMALL, "--tp", "abc")):  # argparse path
        assert result.returncode == 2
        assert "Traceback" not in result.stderr
        assert result.stdout == ""
        assert len(result.stderr.splitlines()) == 1
        assert result.stderr.startswith("comet-dse: error: ")


def test_dtype_the_device_cannot_run(capsys):
    argv = ["estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "64",
            "--tp", "8", "--pp", "8", "--global-batch", "64", "--dtype", "fp8"]
    one_line_error(run(capsys, *argv), "comet-dse: error: dtype: ", "has no fp8 rate", "bf16")


def test_folder_as_model(capsys, tmp_path):
    one_line_error(run(capsys, "estimate", "--model", str(tmp_path), *SMALL),
                     "comet-dse: error: model: ", "is a folder")


def test_config_json_string_boolean(capsys, tmp_path):
    config = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000,
              "intermediate_size": 512, "tie_word_embeddings": "false"}
    path = write(tmp_path / "config.json", json.dumps(config))
    one_line_error(run(capsys, "estimate", "--model", path, *SMALL),
                     "comet-dse: error: config.json:tie_word_embeddings: ", "true or false")


def test_infeasible_without_expansion_tier_keeps_everything_in_hbm(capsys):
    out = run_json(capsys, "estimate", "--model", "megatron-1t", "--cluster", "dgx-a100-80gb", "--devices", "8",
                   "--tp", "8", "--global-batch", "8")
    assert out["feasible"] is False
    assert out["memory_tiers_bytes"]["expansion"] == 0
    assert out["memory_tiers_bytes"]["hbm"] == out["memory_per_device_bytes"]


def test_cluster_zero_bandwidth_is_rejected(capsys, tmp_path):
    data = preset_yaml("clusters", "dgx-a100-80gb")
    data["accelerator"]["memory"]["hbm"]["bandwidth"] = "0 TB/s"
    path = write(tmp_path / "c.yaml", yaml.safe_dump(data))
    one_line_error(run(capsys, "estimate", "--model", "gpt3-175b", "--cluster", path, "--devices", "8",
                         "--tp", "8", "--global-batch", "8"),
                     "comet-dse: error: cluster.accelerator.memory.hbm.bandwidth: ", "outside the plausible range")


# --- timing ------------------------------------------------------------------------------------

TIMED_SEARCH_IMPORTS = """
import contextlib, io, sys
import comet_dse.design_space.search as searching
real, imported = searching.search, []

def timed(*args, **kwargs):
    before = set(sys.modules)
    result = real(*args, **kwargs)
    imported.extend(sorted(set(sys.modules) - before))
    return result

searching.search = timed
from comet_dse.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(sys.argv[1:]) == 0
print(" ".join(imported))
"""


def test_search_times_no_import():
    """What `search` prints as "evaluated in" times the evaluation, not imports: in a fresh interpreter the
    timed call imports no module (pyarrow's first array conversion imports pandas; cli.search imports it
    before the timer starts)."""
    argv = ["search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--global-batch", "64",
            "--top", "1"]
    done = subprocess.run([sys.executable, "-c", TIMED_SEARCH_IMPORTS, *argv], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


# --- fused attention without a rate --------------------------------------------------------------

@pytest.mark.parametrize("cluster", CLUSTER_PRESETS)
def test_a_device_without_a_fused_attention_rate_says_how_attention_was_costed(capsys, cluster):
    """estimate and search print one line where the accelerator lists no fused attention rate: unfused by
    default, at the GEMM efficiency with --flash-attention on; nothing where it lists one."""
    from comet_dse.presets.catalog import load_cluster

    accelerator = load_cluster(cluster).accelerator
    devices = 10 if cluster == "dojo" else 8          # dojo's tile is 5 x 5 D1 dies
    small = ["--model", "llama3-8b", "--cluster", cluster, "--devices", devices, "--global-batch", devices]
    runs = [(["estimate", *small], "attention costed unfused"),
            (["search", *small, "--top", "1"], "attention costed unfused")]
    if not accelerator.attention_efficiency:
        runs.append((["estimate", *small, "--flash-attention"], "fused attention costed at the GEMM efficiency"))
    for argv, costed in runs:
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        notes = [line for line in out.splitlines() if line.startswith("no fused attention rate for")]
        if argv[0] == "search":
            data = run_json(capsys, *argv)
            assert data["notes"] == notes, (data["notes"], notes)       # --json carries the same line
        if accelerator.attention_efficiency:
            assert notes == [], (argv, notes)
        else:
            assert len(notes) == 1 and notes[0].startswith(
                f"no fused attention rate for {accelerator.name}: {costed}"), (argv, out)


def test_flash_attention_without_a_kernel_runs_one_the_device_lists(capsys):
    """`estimate --flash-attention` on B200 (which lists only fa4) runs fa4, as a search would, instead of
    refusing the fa2 nobody asked for; a kernel named on the command line is still held to its rate."""
    small = ["--model", "llama3-8b", "--cluster", "dgx-b200", "--devices", "8", "--global-batch", "8",
             "--flash-attention"]
    data = run_json(capsys, "estimate", *small)
    code, out, err = run(capsys, "estimate", *small)
    assert code == 0 and "flash attention, fa4 kernel" in out, err
    assert data["feasible"]
    one_line_error(run(capsys, "estimate", *small, "--attention-kernel", "fa2"), "attention-kernel", "fa4")


TINY_STUDY = """name: tiny
description: a study that names no baseline
models: [llama3-8b]
cluster: {cluster}
devices: [8]
global_batch: 8
axes:
  hbm_bandwidth: {{scale: [0.5, 1.0]}}
strategy:
  tp: [1, 8]
  recompute: [full]
token_budget: 1T
"""


@pytest.mark.parametrize("cluster, unknown", [("dgx-h100", False), ("tpu-v5p", True)])
def test_sweep_says_what_its_baseline_is_and_explains_unknown_only_when_shown(capsys, tmp_path, cluster, unknown):
    """Without `baseline:` the speed-ups are over the first variant, and the output says so; the note on
    'unknown' figures appears only where a row shows one (TPU v5p has no power figure, DGX H100 has all)."""
    study = write(tmp_path / "s.yaml", TINY_STUDY.format(cluster=cluster))
    code, out, err = run(capsys, "sweep", study, "--output", tmp_path / "out.parquet", "--no-progress")
    assert code == 0, err
    assert "baseline: hbm_bandwidth=x0.5 (the study names no baseline: every axis at its first value)" in out
    # the best-per-variant table: its rows hold "feasible/evaluated" strategies
    rows = [line for line in out.splitlines() if line.startswith("llama3-8b") and re.search(r" \d+/\d+ ", line)]
    assert len(rows) == 2 and any("unknown" in row for row in rows) == unknown
    assert ("unknown: no rent figure" in out) == unknown
    named = write(tmp_path / "named.yaml", TINY_STUDY.format(cluster=cluster) + "baseline: {hbm_bandwidth: 0.5}\n")
    code, out, err = run(capsys, "sweep", named, "--output", tmp_path / "named.parquet", "--no-progress")
    assert code == 0 and "baseline: hbm_bandwidth=x0.5\n" in out, err


@pytest.mark.parametrize("cluster, note", [("tpu-v5e", True), ("dgx-h100", False)])
def test_whatif_says_how_attention_was_costed_where_no_rate_is_listed(capsys, cluster, note):
    code, out, err = run(capsys, "whatif", "--model", "llama3-8b", "--cluster", cluster, "--devices", "8",
                         "--global-batch", "8", "--resources", "peak_flops", "--no-fit")
    assert code == 0, err
    assert ("no fused attention rate for" in out and "attention costed unfused" in out) == note, out
