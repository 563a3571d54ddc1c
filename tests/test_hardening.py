"""Issue 11: no silent wrong answer, no lost file, no runaway run.

One test (or a parametrised family) per numbered case of the issue, with the
inputs it describes; the real-process tests (Ctrl-C, kill -9, a FIFO) run the
installed ``comet-dse`` so that signals and exit statuses are the real ones.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from comet_dse.base import loading
from comet_dse.base.errors import InputError
from comet_dse.design_space import engine, study as study_module
from comet_dse.design_space.space import SearchSpace, count_strategies, enumerate_strategies
from comet_dse.design_space.study import load_study
from comet_dse.presets.catalog import load_model, preset_data
from cli_run import one_line_error, run
from hang import no_hang

# megatron-22b on 64 A100s, the study of issue 11's case 1, kept to a few hundred points.
BASE = {
    "name": "hardening",
    "models": ["megatron-22b"],
    "cluster": "dgx-a100-80gb",
    "devices": [64],
    "global_batch": 64,
    "strategy": {"tp": [4, 8], "zero": [0, 1]},
}
COMET = [sys.executable, "-m", "comet_dse.cli"]


def write_study(path: Path, **changes) -> Path:
    data = {**BASE, **changes}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def files_under(root: Path) -> set:
    return {p.relative_to(root) for p in root.rglob("*")}


# --- 1. study axes get the cluster file's validation -----------------------------------------

AXIS_CASES = [
    ("network_latency: {values: [-1.0]}", "axes.network_latency.values", "-1.0 is outside the plausible range"),
    ("hbm_bandwidth: {scale: [1.0, .nan]}", "axes.hbm_bandwidth.scale", "finite"),
    ("hbm_capacity: [80 TB]", "axes.hbm_capacity.values", "80 TB is outside the plausible range"),
    ("network.infiniband.efficiency: [5.0]", "axes.network.infiniband.efficiency.values", "outside"),
    ("peak_flops: {scale: [1.0e+30]}", "axes.peak_flops.scale", "outside the plausible range"),
    ("peak_flops: {scale: [1e30]}", "axes.peak_flops.scale", "outside the plausible range"),   # YAML 1.1: a string
    ("hbm_capacity: {scale: [.inf]}", "axes.hbm_capacity.scale", "finite"),
    ("hbm_bandwidth: {values: [.inf]}", "axes.hbm_bandwidth.values", "finite"),
    ("expansion_capacity: {values: [-64 GiB]}", "axes.expansion_capacity.values", "cannot read"),
    ("expansion_capacity: {values: [-68719476736]}", "axes.expansion_capacity.values", "outside"),
    ("network_bandwidth: {scale: [0]}", "axes.network_bandwidth.scale", "positive"),
    ("network_latency: {scale: [1.0e+9]}", "axes.network_latency.scale", "outside"),
]


@pytest.mark.parametrize("axis,field,message", AXIS_CASES)
def test_study_axis_values_are_checked_like_a_cluster_file(tmp_path, capsys, axis, field, message):
    """Case 1: network_latency -1 once ranked a step of -450,035 s first; NaN rows were marked feasible."""
    text = yaml.safe_dump({**BASE, "expansion": {"capacity": "64 GiB", "bandwidth": "64 GB/s"}}, sort_keys=False)
    path = tmp_path / "study.yaml"
    path.write_text(text + "axes:\n  " + axis + "\n")
    out = tmp_path / "r.parquet"
    one_line_error(run(capsys, "sweep", path, "--output", out, "--no-progress"), field, message)
    assert not out.exists() and not Path(f"{out}.parts").exists()


def test_study_axis_bound_is_the_cluster_files_bound(tmp_path, capsys):
    """The same HBM capacity is accepted, or refused, by a study axis and by a cluster file."""
    cluster = preset_data("clusters", "dgx-a100-80gb")
    for capacity, ok in (("4 TiB", True), ("4.01 TiB", False)):
        cluster["accelerator"]["memory"]["hbm"]["capacity"] = capacity
        cfile = tmp_path / "c.yaml"
        cfile.write_text(yaml.safe_dump(cluster))
        code, _, err = run(capsys, "estimate", "--model", "megatron-22b", "--cluster", cfile, "--devices", 64,
                           "--tp", 8, "--global-batch", 64)
        assert (code == 0) == ok, err
        study = write_study(tmp_path / "s.yaml", axes={"hbm_capacity": [capacity]})
        if ok:
            assert load_study(study).variants[0].cluster.accelerator.hbm.capacity == 4 * 2**40
        else:
            with pytest.raises(InputError, match="axes.hbm_capacity.values"):
                load_study(study)


def test_every_feasible_row_has_a_positive_finite_step_time(tmp_path):
    """Case 1's symptom, asserted on a study over every kind of axis at valid extremes."""
    path = write_study(tmp_path / "s.yaml", axes={
        "network_latency": {"values": [0.0, "1 s"]}, "hbm_bandwidth": {"scale": [0.01, 100]},
        "peak_flops": {"scale": [0.001, 100]}, "network.infiniband.efficiency": [0.01, 1.0]})
    engine.run_study(load_study(path), tmp_path / "r.parquet", progress=False)
    table = pq.read_table(tmp_path / "r.parquet", columns=["feasible", "step_time_s"]).to_pydict()
    step = np.array(table["step_time_s"], dtype=float)[np.array(table["feasible"])]
    assert step.size > 0 and np.all(np.isfinite(step)) and np.all(step > 0)


# --- 3. resume fingerprints every file the study refers to -----------------------------------

def _interrupted_run(study_path: Path, out: Path, monkeypatch) -> None:
    monkeypatch.setattr(engine, "CHUNK_ROWS", 100)

    def stop(index):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.run_study(load_study(study_path), out, progress=False, on_chunk=stop)


@pytest.mark.parametrize("kind", ["cluster", "model"])
def test_resume_refuses_an_edited_cluster_or_model_file(tmp_path, monkeypatch, capsys, kind):
    """Case 3: after editing a file the study names, --resume once mixed 1.4 M stale rows into 3.0 M."""
    model, cluster = preset_data("models", "megatron-22b"), preset_data("clusters", "dgx-a100-80gb")
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(model))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    path = write_study(tmp_path / "s.yaml", models=[str(tmp_path / "m.yaml")], cluster=str(tmp_path / "c.yaml"))
    out = tmp_path / "r.parquet"
    _interrupted_run(path, out, monkeypatch)
    if kind == "cluster":
        cluster["accelerator"]["memory"]["hbm"]["bandwidth"] = "1 TB/s"
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    else:
        model["ffn"] = 4 * model["ffn"]
        (tmp_path / "m.yaml").write_text(yaml.safe_dump(model))
    result = run(capsys, "sweep", path, "--output", out, "--resume", "--no-progress")
    one_line_error(result, "resume: ", f"changed: {kind} {tmp_path / (kind[0] + '.yaml')}")
    assert not out.exists() and len(list(Path(f"{out}.parts").glob("part-*.parquet"))) == 1


def test_resume_accepts_a_comment_added_to_a_file_and_matches_a_clean_run(tmp_path, monkeypatch):
    """Only what changes results counts: a comment in the cluster file does not block --resume."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(preset_data("clusters", "dgx-a100-80gb")))
    path = write_study(tmp_path / "s.yaml", cluster=str(tmp_path / "c.yaml"))
    _interrupted_run(path, tmp_path / "r.parquet", monkeypatch)
    (tmp_path / "c.yaml").write_text("# edited\n" + (tmp_path / "c.yaml").read_text())
    engine.run_study(load_study(path), tmp_path / "r.parquet", progress=False, resume=True)
    engine.run_study(load_study(path), tmp_path / "clean.parquet", progress=False)
    assert (tmp_path / "r.parquet").read_bytes() == (tmp_path / "clean.parquet").read_bytes()


def test_resume_refuses_a_changed_code_digest(tmp_path, monkeypatch, capsys):
    """The package code is an input too: a run started by other code is not continued."""
    path = write_study(tmp_path / "s.yaml")
    out = tmp_path / "r.parquet"
    _interrupted_run(path, out, monkeypatch)
    plan = Path(f"{out}.parts") / "plan.json"
    saved = json.loads(plan.read_text())
    saved["inputs"]["code"] = "0" * 16
    plan.write_text(json.dumps(saved))
    one_line_error(run(capsys, "sweep", path, "--output", out, "--resume", "--no-progress"),
                          "changed: code")


# --- 4. non-positive degrees ------------------------------------------------------------------

@pytest.mark.parametrize("command", ["search", "estimate"])
@pytest.mark.parametrize("option", ["--ep", "--cp", "--tp"])
def test_zero_degrees_are_refused(capsys, command, option):
    """Case 4: `search --ep 0` reported '0 feasible'; `--cp 0` was a ZeroDivisionError."""
    argv = [command, "--model", "llama3-8b", "--cluster", "dgx-a100-80gb", "--devices", 64,
            "--global-batch", 32, option, 0]
    one_line_error(run(capsys, *argv), option, "positive")


@pytest.mark.parametrize("knob", ["ep", "cp"])
def test_zero_degrees_are_refused_in_a_study(tmp_path, capsys, knob):
    path = write_study(tmp_path / "s.yaml", strategy={knob: [0]})
    one_line_error(run(capsys, "sweep", path, "--output", tmp_path / "r.parquet"), f"strategy.{knob}")


# --- 5. a key given twice ---------------------------------------------------------------------

def test_yaml_key_given_twice_is_refused(tmp_path, capsys):
    """Case 5: `layers` twice once ran with the second value."""
    text = yaml.safe_dump(preset_data("models", "megatron-22b"), sort_keys=False)
    (tmp_path / "m.yaml").write_text(text + "layers: 96\n")
    one_line_error(run(capsys, "estimate", "--model", tmp_path / "m.yaml", "--cluster", "dgx-a100-80gb",
                              "--devices", 64, "--tp", 8, "--global-batch", 64), "model: ", "'layers' twice")


def test_json_key_given_twice_is_refused(tmp_path, capsys):
    config = '{"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_layer": 48}'
    (tmp_path / "config.json").write_text(config)
    one_line_error(run(capsys, "estimate", "--model", tmp_path / "config.json", "--cluster",
                              "dgx-a100-80gb", "--devices", 8, "--tp", 4, "--global-batch", 8),
                          "model: ", "'n_layer' twice")


def test_study_and_cluster_key_given_twice_are_refused(tmp_path, capsys):
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(BASE, sort_keys=False) + "devices: [128]\n")
    one_line_error(run(capsys, "sweep", study, "--output", tmp_path / "r.parquet"), "'devices' twice")
    text = (Path(__file__).parent.parent / "src/comet_dse/presets/clusters/dgx-a100-80gb.yaml").read_text()
    (tmp_path / "c.yaml").write_text(text.replace("accelerator:", "max_devices: 8\nmax_devices: 16\naccelerator:", 1))
    one_line_error(run(capsys, "estimate", "--model", "megatron-22b", "--cluster", tmp_path / "c.yaml",
                              "--devices", 8, "--tp", 8, "--global-batch", 8), "'max_devices' twice")


def test_misspelled_study_key_names_the_valid_ones(tmp_path, capsys):
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({**BASE, "axis": {"hbm_capacity": [1.0]}}, sort_keys=False))
    one_line_error(run(capsys, "sweep", study, "--output", tmp_path / "r.parquet"),
                          "axis: unknown field; did you mean axes?", "strategy")


@pytest.mark.parametrize("changes,field,needle", [
    ({"models": []}, "models: ", "megatron-22b"), ({"models": None}, "models: ", "llama3-8b"),
    ({"cluster": ""}, "cluster: ", "dgx-a100-80gb"), ({"cluster": None}, "cluster: ", "tpu-v4"),
    ({"strategy": {"": [1]}}, "strategy.: ", "tp"), ({"axes": {"": [1]}}, "axes.: unknown axis", "hbm_capacity"),
])
def test_empty_keys_list_the_valid_ones(tmp_path, capsys, changes, field, needle):
    path = write_study(tmp_path / "s.yaml", **changes)
    one_line_error(run(capsys, "sweep", path, "--output", tmp_path / "r.parquet"), field, needle)


# --- 6. report --output -----------------------------------------------------------------------

def _study_folder(root: Path) -> Path:
    folder = root / "mystudies"
    folder.mkdir()
    write_study(folder / "one.yaml")
    (folder / "notes.txt").write_text("my notes")
    return folder


def test_report_refuses_an_output_that_holds_the_studies(tmp_path, capsys):
    """Case 6: `report mystudies --output mystudies` once deleted the study files and everything else."""
    folder = _study_folder(tmp_path)
    before = {p: p.read_bytes() for p in folder.iterdir()}
    one_line_error(run(capsys, "report", folder, "--output", folder), "output: ", "holds the input")
    one_line_error(run(capsys, "report", folder, "--output", tmp_path), "output: ", "holds the input")
    assert {p: p.read_bytes() for p in folder.iterdir()} == before
    assert files_under(tmp_path) == {Path("mystudies")} | {p.relative_to(tmp_path) for p in before}


def test_report_refuses_an_existing_file_or_foreign_folder_as_output(tmp_path, capsys):
    """Case 6: an existing FILE given as --output was renamed away and the run ended in a traceback."""
    folder = _study_folder(tmp_path)
    target = tmp_path / "results.txt"
    target.write_text("keep me")
    one_line_error(run(capsys, "report", folder, "--output", target), "is a file")
    assert target.read_text() == "keep me"
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "a.jpg").write_text("x")
    one_line_error(run(capsys, "report", folder, "--output", foreign), "did not write")
    assert files_under(foreign) == {Path("a.jpg")}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_report_output_dot_is_refused(tmp_path, capsys, monkeypatch):
    """`report --output .` was a traceback; the current folder is not a report folder."""
    folder = _study_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    one_line_error(run(capsys, "report", folder, "--output", "."), "output: ")


def test_report_replaces_its_own_earlier_report_and_fills_an_empty_folder(tmp_path, capsys):
    folder = _study_folder(tmp_path)
    out = tmp_path / "out"
    out.mkdir()                                       # empty: used
    assert run(capsys, "report", folder, "--output", out, "--no-progress")[0] == 0
    first = (out / "report.html").stat().st_mtime_ns
    assert (out / ".comet-dse-report").exists()
    assert run(capsys, "report", folder, "--output", out, "--no-progress")[0] == 0
    assert (out / "report.html").stat().st_mtime_ns != first
    assert {p.name for p in tmp_path.iterdir()} == {"mystudies", "out"}


def test_a_result_file_the_tool_did_not_write_is_never_replaced(tmp_path, capsys):
    """Output safety for sweep and search: only an earlier comet-dse result (or an empty file) is replaced."""
    import pyarrow as pa

    notes, table = tmp_path / "notes.csv", tmp_path / "mine.parquet"
    notes.write_text("a,b\n1,2\n")
    pq.write_table(pa.table({"x": [1, 2]}), table)
    before = {p: p.read_bytes() for p in (notes, table)}
    path = write_study(tmp_path / "s.yaml")
    for out in (notes, table):
        one_line_error(run(capsys, "sweep", path, "--output", out), "not a comet-dse result file")
        one_line_error(run(capsys, "search", "--model", "megatron-22b", "--cluster", "dgx-a100-80gb",
                                  "--devices", 8, "--global-batch", 8, "--tp", 8, "--output", out),
                              "not a comet-dse result file")
    assert {p: p.read_bytes() for p in (notes, table)} == before
    for out in (tmp_path / "r.csv", tmp_path / "r.parquet"):          # its own result: replaced on a rerun
        for _ in range(2):
            assert run(capsys, "sweep", path, "--output", out, "--no-progress")[0] == 0


# --- 7. names and paths stay inside the output -------------------------------------------------

@pytest.mark.parametrize("name", ["/some/abs/path", "../../../x", "..", "a/../../b", "\x1b[31mred"])
def test_study_name_never_becomes_a_path_outside_the_report(tmp_path, capsys, name):
    """Case 7: a study name of /some/abs/path or ../../../x made report write outside its folder."""
    work = tmp_path / "a" / "b" / "c"
    folder = work / "studies"
    folder.mkdir(parents=True)
    write_study(folder / "one.yaml", name=name)
    assert run(capsys, "report", folder, "--output", work / "out", "--no-progress")[0] == 0
    outside = {p for p in tmp_path.rglob("*") if not p.is_relative_to(work / "out") and not p.is_relative_to(folder)}
    assert outside == {tmp_path / "a", tmp_path / "a" / "b", work}
    assert len(list((work / "out" / "data").glob("*.parquet"))) == 1
    assert not Path("/some/abs/path.parquet").exists()


@pytest.mark.parametrize("output", ["/tmp/elsewhere.parquet", "../../x.parquet", "out/../../x.parquet"])
def test_study_output_field_stays_in_the_current_folder(tmp_path, capsys, output):
    path = write_study(tmp_path / "s.yaml", output=output)
    one_line_error(run(capsys, "sweep", path), "output: ", "relative path")


# --- 8. alias bombs, huge files, deep nesting, FIFOs ---------------------------------------------

def _model_argv(path):
    return ["estimate", "--model", path, "--cluster", "dgx-a100-80gb", "--devices", 8, "--tp", 8, "--global-batch", 8]


def test_alias_bomb_in_a_name_is_refused_before_it_is_expanded(tmp_path, capsys, monkeypatch):
    """Case 8: a YAML alias bomb in `name` ran to a MemoryError after 45 s. Now its values are counted on
    the composed document, stopping past MAX_NODES, and no value is built."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    study = tmp_path / "s.yaml"
    study.write_text("\n".join(lines) + "\n" + yaml.safe_dump(BASE).replace("name: hardening", "name: *a9"))
    counted, built = [], []
    count_nodes, construct = loading._count_nodes, loading._StrictLoader.construct_document
    monkeypatch.setattr(loading, "_count_nodes", lambda root: counted.append(count_nodes(root)) or counted[-1])
    monkeypatch.setattr(loading._StrictLoader, "construct_document",
                        lambda self, node: built.append(node) or construct(self, node))
    with no_hang():
        one_line_error(run(capsys, "sweep", study, "--output", tmp_path / "r.parquet"), "study: ", "aliases")
    assert counted == [loading.MAX_NODES + 1] and built == []     # 9**10 values: counting stopped, nothing built


def test_huge_yaml_is_refused_without_parsing(tmp_path, capsys, monkeypatch):
    """Case 8: a 22 MB YAML took 64 s. Now its size is refused from the file's metadata: nothing is parsed."""
    path = tmp_path / "m.yaml"
    path.write_text("name: x\nlayers: [" + ", ".join(["1"] * 7_000_000) + "]\n")
    size = path.stat().st_size
    assert size > 20e6
    parsed = []
    parse = loading._StrictLoader.get_single_node
    monkeypatch.setattr(loading._StrictLoader, "get_single_node", lambda self: parsed.append(1) or parse(self))
    with no_hang():
        one_line_error(run(capsys, *_model_argv(path)), "model: ", f"holds {size:,} bytes")
    assert parsed == []


@pytest.mark.parametrize("suffix,text", [(".yaml", "layers: " + "[" * 20000 + "]" * 20000),
                                          (".json", '{"n_layer": ' + "[" * 20000 + "]" * 20000 + "}")])
def test_deep_nesting_is_refused(tmp_path, capsys, suffix, text):
    """Case 8: 20,000 nested brackets were a RecursionError."""
    path = tmp_path / f"config{suffix}"
    path.write_text(text)
    one_line_error(run(capsys, *_model_argv(path)), "model: ", "deep")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("name", ["m.yaml", "config.json"])
def test_fifo_as_model_file_does_not_block(tmp_path, name):
    """Case 8: a FIFO as a model file blocked forever (the real process, with a timeout)."""
    os.mkfifo(tmp_path / name)
    proc = subprocess.run(COMET + [str(a) for a in _model_argv(tmp_path / name)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr and "Traceback" not in proc.stderr


def test_huge_integer_is_one_line(tmp_path, capsys):
    """`layers: 10**400` was an OverflowError traceback."""
    model = preset_data("models", "megatron-22b")
    model["layers"] = 10**400
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(model))
    one_line_error(run(capsys, *_model_argv(tmp_path / "m.yaml")), "model.layers: ", "401-digit")


# --- 9. terminal control characters -------------------------------------------------------------

def test_control_characters_in_names_are_not_printed(tmp_path, capsys):
    """Case 9: escape sequences in a model name were printed raw. Since the fourth hardening round (issue 39)
    a model or cluster name with control characters is refused, with the characters escaped in the line; a
    study's name is still printed escaped."""
    model = preset_data("models", "megatron-22b")
    model["name"] = "\x1b]0;pwned\x07\x1b[2J\x1b[31mevil\x9b1m"
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(model))
    for command in (["estimate", "--tp", 8], ["search", "--tp", 8]):
        code, out, err = run(capsys, command[0], "--model", tmp_path / "m.yaml", "--cluster", "dgx-a100-80gb",
                             "--devices", 64, "--global-batch", 64, *command[1:])
        assert code == 2 and "model.name" in err and "control characters" in err, err
        assert not any(c in out + err for c in "\x1b\x07\x9b"), err
    path = write_study(tmp_path / "s.yaml", models=["megatron-22b"], name="\x1b[5mblink")
    code, out, err = run(capsys, "sweep", path, "--output", tmp_path / "r.parquet", "--no-progress")
    assert code == 0 and "blink" in out and not any(c in out + err for c in "\x1b\x07\x9b")
    bad = tmp_path / "\x1b[31mmissing.yaml"
    code, out, err = run(capsys, *_model_argv(bad))
    assert code == 2 and "\x1b" not in err and "missing.yaml" in err


# --- 10. runaway studies --------------------------------------------------------------------------

def test_a_study_of_1e12_points_is_refused_with_its_count(tmp_path, capsys, monkeypatch):
    """Case 10: a study of 1e12 points started with no warning and grew memory without bound."""
    scales = {"scale": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}
    axes = {a: scales for a in ("hbm_capacity", "hbm_bandwidth", "peak_flops", "network_bandwidth",
                                "network_latency", "sram_capacity", "sram_bandwidth", "network.infiniband.latency")}
    path = write_study(tmp_path / "s.yaml", axes=axes, devices=[64, 128, 256, 512], strategy={})
    counts, real_count = [], study_module.count_strategies
    monkeypatch.setattr(study_module, "count_strategies", lambda *a, **k: counts.append(a[1]) or real_count(*a, **k))
    monkeypatch.setattr(study_module, "_variants", lambda *a, **k: pytest.fail("cluster variants were built"))
    monkeypatch.setattr(engine, "run_study", lambda *a, **k: pytest.fail("the study ran"))
    with no_hang():
        code, out, err = run(capsys, "sweep", path, "--output", tmp_path / "r.parquet")
    assert counts == [64, 128, 256, 512]         # counted once per device count: not per point, not per variant
    one_line_error((code, out, err), "max-points: the study has ", "above the limit of 1,000,000,000")
    count = int(err.split("the study has ")[1].split(" design")[0].replace(",", ""))
    assert count > 1e12
    assert files_under(tmp_path) == {Path("s.yaml")}


def test_max_points_limit_and_printed_count(tmp_path, capsys):
    """The count printed before the run is the number of rows written; --max-points below it refuses."""
    path = write_study(tmp_path / "s.yaml", axes={"hbm_capacity": {"scale": [1, 2]}})
    points = load_study(path).points
    out = tmp_path / "r.parquet"
    one_line_error(run(capsys, "sweep", path, "--output", out, "--max-points", points - 1),
                          f"the study has {points:,} design points, above the limit of {points - 1:,}")
    code, _, err = run(capsys, "sweep", path, "--output", out, "--max-points", points, "--no-progress")
    assert code == 0
    assert err.strip().splitlines()[0] == f"comet-dse: hardening: {points:,} design points in 2 chunks"
    assert pq.read_metadata(out).num_rows == points


def test_dry_run_prints_count_and_first_points_and_writes_nothing(tmp_path, capsys):
    path = write_study(tmp_path / "s.yaml", axes={"hbm_capacity": {"scale": [1, 2]}})
    code, out, err = run(capsys, "sweep", path, "--output", tmp_path / "r.parquet", "--dry-run")
    assert code == 0 and err == ""
    study = load_study(path)
    assert f"{study.points:,} design points" in out
    first = enumerate_strategies(study.models[0], 64, 64, study.space)
    assert f"tp{int(first.tp[0])} pp{int(first.pp[0])} dp{int(first.dp[0])}" in out.splitlines()[5]
    assert len([line for line in out.splitlines() if "megatron-22b" in line]) == 10
    assert files_under(tmp_path) == {Path("s.yaml")}


@pytest.mark.parametrize("model,devices,batch,space", [
    ("megatron-1t", 4096, 2048, SearchSpace()),
    ("mixtral-8x7b", 64, 256, SearchSpace.of(tp_overlap=(False, True), dtype=("bf16", "fp8"), ep_overlap=(False, True))),
    ("llama3-8b", 64, 32, SearchSpace.of(cp_algorithm=("ring", "all-gather"), flash_attention=(False, True))),
])
def test_count_strategies_equals_the_enumeration(model, devices, batch, space):
    m = load_model(model)
    assert count_strategies(m, devices, batch, space) == len(enumerate_strategies(m, devices, batch, space))


# --- 11. workers, Ctrl-C --------------------------------------------------------------------------

RUNNING = {**BASE, "models": ["megatron-22b", "llama3-8b", "gpt3-175b"], "devices": [64, 128, 256, 512, 1024],
           "global_batch": 1024, "axes": {"hbm_capacity": {"scale": [1, 2, 3, 4]}},
           "strategy": {"dtype": ["bf16", "fp16"], "tp_overlap": [False, True]}}


def _children(pid: int) -> list:
    """Live processes whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _start_sweep(tmp_path: Path, *extra) -> tuple:
    """A sweep in its own session, running until its first chunk is written: (process, output, stderr file).
    Its output goes to files, not pipes, so that processes it leaves behind cannot hang the test."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(RUNNING, sort_keys=False))
    out, err = tmp_path / "r.parquet", tmp_path / "stderr.txt"
    with open(err, "w") as handle:
        proc = subprocess.Popen(COMET + ["sweep", str(path), "--output", str(out), "--no-progress", *extra],
                                stdout=subprocess.DEVNULL, stderr=handle, start_new_session=True)
    deadline = time.monotonic() + 120    # a hang bound, not a speed limit
    while not list(Path(f"{out}.parts").glob("part-*.parquet")):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop_group(proc)
            pytest.fail(f"the sweep did not write a chunk: {err.read_text()}")
        time.sleep(0.05)
    return proc, out, err


def _stop_group(proc) -> None:
    """Kill what is left of the sweep's session (its own process group), if anything."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_kill_9_of_a_worker_sweep_leaves_no_worker(tmp_path):
    """Case 11: `kill -9` of a `--workers 2` sweep left its pool workers running for 15 minutes."""
    proc, _, _ = _start_sweep(tmp_path, "--workers", "2")
    workers = _children(proc.pid)
    assert len(workers) >= 2
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 120    # a hang bound: workers notice within PARENT_POLL_S on an idle machine
    while [w for w in workers if _running(w)] and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [w for w in workers if _running(w)]
    _stop_group(proc)                                        # workers keep the group: end them if they outlived it
    assert not left, f"workers {left} outlived their parent"


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("extra", [("--workers", "2"), ("--engine", "dask", "--workers", "2")])
def test_ctrl_c_is_one_line_and_status_130(tmp_path, extra):
    """Case 11: Ctrl-C with workers or Dask printed 13-63 lines of worker tracebacks."""
    if "dask" in extra:
        pytest.importorskip("distributed")
    proc, out, err_file = _start_sweep(tmp_path, *extra)
    os.killpg(proc.pid, signal.SIGINT)                       # what a terminal sends: the whole group
    try:
        proc.wait(timeout=120)
    finally:
        _stop_group(proc)
    err = err_file.read_text()
    lines = err.strip().splitlines()
    assert proc.returncode == 130, err
    assert lines[1:] == [f"comet-dse: interrupted; finished chunks are kept in {out}.parts; run the same command "
                         "with --resume to continue"], err
    assert lines[0].startswith("comet-dse: hardening: ")     # the count, printed before the start


# --- 12. temporaries and concurrent runs -------------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporaries_of_dead_runs_are_removed(tmp_path, capsys):
    """Case 12: `.out.tmp-PID` files (up to 332 MB) and `.rep.tmp-PID` folders were never removed."""
    dead, live = _dead_pid(), os.getppid()
    out = tmp_path / "out.parquet"
    stale = [tmp_path / f".out.parquet.tmp-{dead}", tmp_path / f".out.parquet.summary.json.tmp-{dead}"]
    kept = tmp_path / f".out.parquet.tmp-{live}"
    for p in stale + [kept]:
        p.write_bytes(b"x" * 1000)
    path = write_study(tmp_path / "s.yaml")
    assert run(capsys, "sweep", path, "--output", out, "--no-progress")[0] == 0
    assert not any(p.exists() for p in stale) and kept.exists()

    folder = tmp_path / "studies"
    folder.mkdir()
    write_study(folder / "one.yaml")
    report_tmp, foreign = tmp_path / f".rep.tmp-{dead}", tmp_path / f".rep.tmp-{_dead_pid()}"
    report_tmp.mkdir()
    (report_tmp / ".comet-dse-report").write_text("")
    foreign.mkdir()                                          # no marker: not ours, left alone
    assert run(capsys, "report", folder, "--output", tmp_path / "rep", "--no-progress")[0] == 0
    assert not report_tmp.exists() and foreign.exists()


def test_two_runs_on_one_output_do_not_collide(tmp_path, monkeypatch, capsys):
    """Case 12: two concurrent --resume runs collided; a lock lets one run at a time."""
    path = write_study(tmp_path / "s.yaml")
    out = tmp_path / "r.parquet"
    _interrupted_run(path, out, monkeypatch)
    study = load_study(path)
    chunks, _ = engine.plan(study)
    holder = engine.PartStore(out, study, chunks, resume=True)             # a run in progress
    try:
        one_line_error(run(capsys, "sweep", path, "--output", out, "--resume", "--no-progress"),
                              "output: another comet-dse run", f"pid {os.getpid()}")
    finally:
        holder.release()
    assert run(capsys, "sweep", path, "--output", out, "--resume", "--no-progress")[0] == 0


def test_truncated_part_file_is_evaluated_again(tmp_path, monkeypatch):
    """A truncated part file on resume was a traceback; it is now redone and the file equals a clean run."""
    monkeypatch.setattr(engine, "CHUNK_ROWS", 100)
    path = write_study(tmp_path / "s.yaml")
    seen = []

    def stop_after_two(index):
        seen.append(index)
        if len(seen) == 2:
            raise KeyboardInterrupt

    out = tmp_path / "r.parquet"
    with pytest.raises(KeyboardInterrupt):
        engine.run_study(load_study(path), out, progress=False, on_chunk=stop_after_two)
    part = sorted(Path(f"{out}.parts").glob("part-*.parquet"))[0]
    part.write_bytes(part.read_bytes()[:200])
    ranking = engine.run_study(load_study(path), out, progress=False, resume=True)
    assert ranking["skipped"] == 1
    engine.run_study(load_study(path), tmp_path / "clean.parquet", progress=False)
    assert out.read_bytes() == (tmp_path / "clean.parquet").read_bytes()


# --- 13. an unreachable scheduler ------------------------------------------------------------------

def test_unreachable_scheduler_fails_fast_with_one_line(tmp_path, capsys, monkeypatch):
    """Case 13: a bad --scheduler address waited 30 s and ended in a traceback."""
    pytest.importorskip("distributed")
    assert engine.SCHEDULER_TIMEOUT_S <= 10
    monkeypatch.setattr(engine, "SCHEDULER_TIMEOUT_S", 1)        # keeps the test short
    import distributed

    asked = []
    client = distributed.Client
    monkeypatch.setattr(distributed, "Client", lambda *a, **k: asked.append(k.get("timeout")) or client(*a, **k))
    path = write_study(tmp_path / "s.yaml")
    out = tmp_path / "r.parquet"
    with no_hang():          # the real client gives up after its timeout; a hang would be the bug of case 13
        result = run(capsys, "sweep", path, "--output", out, "--engine", "dask", "--scheduler", "tcp://127.0.0.1:9")
    assert asked == []       # Dask's handshake (engine._handshake) failed within its timeout, before any Client
    one_line_error(result, "scheduler: no Dask scheduler answered", "within 1 s")
    one_line_error(run(capsys, "sweep", path, "--output", out, "--engine", "dask", "--scheduler", "nonsense"),
                          "scheduler: ", "not a scheduler address")
    assert files_under(tmp_path) == {Path("s.yaml")}


# --- tracebacks where one line is promised ---------------------------------------------------------

def test_sweep_output_that_is_a_folder_is_refused_before_the_run(tmp_path, capsys):
    (tmp_path / "r.parquet").mkdir()
    path = write_study(tmp_path / "s.yaml")
    one_line_error(run(capsys, "sweep", path, "--output", tmp_path / "r.parquet"), "is a folder")
    assert files_under(tmp_path) == {Path("s.yaml"), Path("r.parquet")}


def test_output_in_a_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    path = write_study(tmp_path / "s.yaml")
    one_line_error(run(capsys, "sweep", path, "--output", tmp_path / "file" / "r.parquet"), "output: ",
                          "cannot create")
    one_line_error(run(capsys, "search", "--model", "megatron-22b", "--cluster", "dgx-a100-80gb",
                              "--devices", 8, "--global-batch", 8, "--tp", 8, "--output",
                              tmp_path / "file" / "r.parquet"), "output: ", "cannot create")
    one_line_error(run(capsys, "report", tmp_path, "--output", tmp_path / "file" / "rep"), "output: ")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_folder_is_one_line(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    path = write_study(tmp_path / "s.yaml")
    one_line_error(run(capsys, "sweep", path, "--output", locked / "r.parquet"), "output: ", status=74)


@pytest.mark.parametrize("edit,needle", [
    (lambda rows: rows.replace(",48,6144,", ",48,six,", 1), "not valid"),
    (lambda rows: rows.replace("recompute", "recomp", 1), "lacks the column 'recompute'"),
])
def test_malformed_validation_csv_is_one_line(tmp_path, capsys, edit, needle):
    source = Path(__file__).parent.parent / "src/comet_dse/data/validation"
    for csv in source.glob("*.csv"):
        (tmp_path / csv.name).write_text(csv.read_text())
    table5 = tmp_path / "korthikanti2022_table5.csv"
    table5.write_text(edit(table5.read_text()))
    one_line_error(run(capsys, "validate", "--data", tmp_path), "data: ", needle)
