"""The second hardening issue: one table of bounds, work bounded before it starts, one line per failure.

One test (or a parametrised family) per numbered probe of the issue, with the inputs it describes. Bad
input is one ``comet-dse: error: <field>: <what is valid>`` line and exit status 2 (the API raises
InputError); a failure of the machine is one line and exit status 1. No test asserts a speed: a hang is
bounded at 120 s or more (``no_hang``, a subprocess timeout), and the work is asserted refused before it
starts (docs/reliability.md).
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses as dc
import json
import math
import os
import re
import signal
import socket
import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

import comet_dse
from comet_dse.base import jsonout
from comet_dse.base.bounds import BOUNDS
from comet_dse.base.errors import InputError
from comet_dse.design_space import engine, space as space_module
from comet_dse.design_space.space import SearchSpace, enumerate_strategies
from comet_dse.presets.catalog import load_cluster, load_model, preset_data
from cli_run import one_line_error, run
from hang import no_hang

ROOT = Path(__file__).resolve().parents[1]
STUDY = {"name": "hardening2", "models": ["megatron-22b"], "cluster": "dgx-a100-80gb", "devices": [64],
         "global_batch": 64, "strategy": {"tp": [4, 8], "zero": [0, 1]}}
ESTIMATE = ["estimate", "--model", "megatron-22b", "--cluster", "dgx-a100-80gb", "--devices", 64, "--tp", 8,
            "--global-batch", 64]
SEARCH = ["--model", "megatron-22b", "--cluster", "dgx-a100-80gb", "--devices", 64]


def write_study(path: Path, **changes) -> Path:
    path.write_text(yaml.safe_dump({**STUDY, **changes}, sort_keys=False))
    return path


def strict_json(text: str):
    """``text`` parsed by a strict JSON parser: bare NaN, Infinity and -Infinity are refused."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


# --- 1. one table of bounds --------------------------------------------------------------------

@pytest.mark.parametrize("option, value, needle", [
    ("--seq-len", 10**12, "argument --seq-len: expected a positive integer up to 1,000,000,000"),
    ("--global-batch", 10**15, "argument --global-batch: must be a positive integer up to 1,000,000,000"),
    ("--devices", 10**8, "argument --devices: expected a positive integer up to 10,000,000"),
    ("--micro-batch", 10**10, "argument --micro-batch: must be a positive integer up to 1,000,000,000"),
])
def test_command_line_integers_have_the_files_bounds(capsys, option, value, needle):
    """Probe 1: --seq-len 1e12 and --global-batch 1e15 passed, although a file's integers stop at 1e9."""
    argv = list(ESTIMATE)
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    one_line_error(run(capsys, *argv), needle)


def test_the_bound_itself_is_accepted_everywhere(capsys, tmp_path):
    """1e9 is a valid sequence length on the command line, in the API and in a model file alike."""
    code, out, err = run(capsys, *ESTIMATE, "--seq-len", 10**9)
    assert code == 0 and "Feasible: NO" in out, err
    assert not comet_dse.estimate("megatron-22b", "dgx-a100-80gb", 64, tp=8, global_batch=64,
                                  seq_len=10**9).feasible
    model = preset_data("models", "megatron-22b")
    for seq_len, ok in ((10**9, True), (10**9 + 1, False)):
        (tmp_path / "m.yaml").write_text(yaml.safe_dump({**model, "seq_len": seq_len}))
        code, _, err = run(capsys, "estimate", "--model", tmp_path / "m.yaml", *ESTIMATE[3:])
        assert (code == 0) == ok, err
        with (contextlib.nullcontext() if ok else pytest.raises(InputError, match="seq_len")):
            comet_dse.load_model("megatron-22b", seq_len=seq_len)


def test_api_and_explorer_refuse_what_the_command_line_refuses():
    for kw, field in ((dict(seq_len=10**12), "seq_len"), (dict(global_batch=10**15), "global-batch"),
                      (dict(devices=10**8), "devices"), (dict(micro_batch=10**10), "micro-batch")):
        args = {"devices": 64, "tp": 8, "global_batch": 64, **kw}
        with pytest.raises(InputError) as info:
            comet_dse.estimate("megatron-22b", "dgx-a100-80gb", **args)
        assert info.value.field == field, info.value
    pytest.importorskip("dash")
    from comet_dse.web.app import controls_from

    for devices, batch in ((10**8, 64), (64, 10**15), (64, 1e30), (64, float("inf")), (64.5, 64)):
        with pytest.raises(InputError):
            controls_from("megatron-22b", "", "dgx-a100-80gb", devices, batch, 1, [], [])


def _docs_bounds() -> dict:
    """The rows of docs/reliability.md's Bounds table: name -> (low, high)."""
    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    section = text.split("## Bounds", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"^\|\s*`([a-z_]+)`\s*\|\s*([^|]+)\|\s*([^|]+)\|", line)
        if match:
            rows[match.group(1)] = tuple(float(x.strip().replace(",", "")) for x in match.group(2, 3))
    return rows


def test_the_documented_bounds_are_the_code_bounds():
    """docs/reliability.md lists every row of bounds.BOUNDS, with the same low and high."""
    documented = _docs_bounds()
    assert set(documented) == set(BOUNDS), set(documented) ^ set(BOUNDS)
    for name, bound in BOUNDS.items():
        assert documented[name] == pytest.approx((bound.low, bound.high), rel=1e-3), name


# --- 2. the work a request implies is bounded before it starts ----------------------------------

@pytest.mark.parametrize("command", ["search", "whatif"])
def test_global_batch_of_2_to_the_60_is_refused_before_any_divisor_is_tried(capsys, monkeypatch, command):
    """Probe 2: search and whatif with --global-batch 2^60 never returned (divisors of a huge batch)."""
    from comet_dse.base import divisors

    monkeypatch.setattr(divisors, "_divisors", lambda n: pytest.fail("divisors enumerated"))
    with no_hang():
        one_line_error(run(capsys, command, *SEARCH, "--global-batch", 2**60), "global-batch", "1,000,000,000")
        with pytest.raises(InputError, match="global_batch"):
            getattr(comet_dse, command)("megatron-22b", "dgx-a100-80gb", 64, 2**60)


def test_explorer_request_with_a_huge_batch_is_refused_before_it_computes(monkeypatch):
    """Probe 2: one explorer request with a global batch of 1e30 spun a server thread."""
    pytest.importorskip("dash")
    from comet_dse.web import view
    from comet_dse.web.app import build_app
    from comet_dse.web.view import STRATEGY_CONTROLS

    monkeypatch.setattr(view, "enumerate_strategies", lambda *a, **k: pytest.fail("enumerated"))
    app = build_app()
    update = next(c for key, c in app.callback_map.items() if "status.children" in key)["callback"].__wrapped__
    # the callback's inputs in order: model, file, cluster, devices, batch, rank, resource values, tokens, one
    # value per strategy control (left empty), TP across nodes, then the resource ids (a State)
    args = ["megatron-22b", "", "dgx-a100-80gb", 64, 1e30, 1, [], None, *[None] * len(STRATEGY_CONTROLS), [], []]
    with no_hang():
        outputs = update(*args)
    assert "global batch" in str(outputs[1]), outputs[1]


def test_a_search_space_past_the_bound_is_refused_before_it_is_built(capsys, monkeypatch):
    """7,207,200 devices have thousands of degree splits: more strategies than one search may hold. The
    count passes the bound during the enumeration and nothing is built."""
    monkeypatch.setattr(space_module, "_block", lambda *a: pytest.fail("strategies built"))
    with no_hang():
        line = one_line_error(run(capsys, "search", "--model", "megatron-22b", "--cluster", "dgx-b200",
                                  "--devices", 7_207_200, "--global-batch", 735_134_400, "--tp-across-nodes"),
                              "strategy: ")
    assert f"more than {BOUNDS['strategies'].high:,} strategies" in line
    with pytest.raises(InputError, match="strategies"):
        enumerate_strategies(load_model("megatron-22b"), 7_207_200, 735_134_400, SearchSpace())


# --- 3. workers ----------------------------------------------------------------------------------

def test_sweep_workers_are_capped_at_the_cpus_with_one_note(tmp_path, capsys, monkeypatch):
    """Probe 3: sweep --workers 100000 forked over 1,000 processes."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    asked = []

    def serial(todo, payload, finished, workers, parts=None):
        asked.append(workers)
        for c in todo:
            finished(*engine._task(payload(c)))

    monkeypatch.setattr(engine, "_run_processes", serial)
    path = write_study(tmp_path / "s.yaml")
    code, out, err = run(capsys, "sweep", path, "--output", tmp_path / "r.parquet", "--workers", 100_000,
                         "--no-progress")
    assert code == 0, err
    assert asked == [2]
    notes = [line for line in err.splitlines() if line.startswith("comet-dse: note: --workers")]
    assert notes == ["comet-dse: note: --workers 100,000 is more than this machine's 2 CPUs; running 2 worker "
                     "processes"]
    assert engine.local_workers(100_000) == 2 and engine.local_workers(1) == 1


def test_report_workers_are_capped_with_the_same_note(tmp_path, capsys, monkeypatch):
    from comet_dse.report import build

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(build, "build_report", lambda *a, **k: tmp_path / "out" / "report.html")
    code, _, err = run(capsys, "report", tmp_path, "--output", tmp_path / "out", "--workers", 100_000)
    assert code == 0 and "--workers 100,000 is more than this machine's 2 CPUs" in err, err


# --- 4. a scheduler address that is not a Dask scheduler ----------------------------------------

@contextlib.contextmanager
def loopback_server(reply: bytes | None):
    """A TCP server on 127.0.0.1 that accepts and, with ``reply``, answers it once something arrives (an HTTP
    server's answer), or says nothing; yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop, held = threading.Event(), []

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            if reply is not None:
                with contextlib.suppress(OSError):
                    conn.settimeout(5)
                    conn.recv(65536)
                    conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.parametrize("reply, needle", [(None, "no Dask scheduler answered"),
                                           (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "scheduler: ")])
def test_a_port_that_is_not_a_dask_scheduler_is_one_line(tmp_path, capsys, monkeypatch, reply, needle):
    """Probe 4: a port that accepts and says nothing hung forever; one that answers HTTP was a traceback."""
    pytest.importorskip("distributed")
    monkeypatch.setattr(engine, "SCHEDULER_TIMEOUT_S", 2)
    path = write_study(tmp_path / "s.yaml")
    with loopback_server(reply) as port, no_hang():
        result = run(capsys, "sweep", path, "--output", tmp_path / "r.parquet", "--engine", "dask",
                     "--scheduler", f"tcp://127.0.0.1:{port}", "--no-progress")
    one_line_error(result, needle, f"tcp://127.0.0.1:{port}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


# --- 5. a killed pool worker ---------------------------------------------------------------------

def _dying_task(job):
    """engine._task, but the worker process evaluating the second chunk is killed (as by the OOM killer)."""
    if job.chunk.index == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return engine.__dict__["_real_task"](job)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the pool forks its workers here")
def test_a_killed_pool_worker_is_one_line_and_resume_finishes(tmp_path, capsys, monkeypatch):
    """Probe 5: a killed ProcessPoolExecutor worker was a BrokenProcessPool traceback."""
    monkeypatch.setattr(engine, "CHUNK_ROWS", 100)
    monkeypatch.setattr(engine, "local_workers", lambda n: n)        # 2 processes even on a 1-CPU machine
    monkeypatch.setitem(engine.__dict__, "_real_task", engine._task)
    monkeypatch.setattr(engine, "_task", _dying_task)
    path, out = write_study(tmp_path / "s.yaml"), tmp_path / "r.parquet"
    with no_hang():
        code, _, err = run(capsys, "sweep", path, "--output", out, "--workers", 2, "--no-progress")
    errors = [line for line in err.splitlines() if line.startswith("comet-dse: error: ")]
    assert code == 1 and "Traceback" not in err and len(errors) == 1, err     # the other line: the announcement
    assert "a worker process died" in errors[0] and f"{out}.parts" in errors[0]
    assert errors[0].endswith("run again with --resume")
    monkeypatch.setattr(engine, "_task", engine.__dict__["_real_task"])
    code, _, err = run(capsys, "sweep", path, "--output", out, "--workers", 2, "--no-progress", "--resume")
    assert code == 0, err
    points = engine.plan(__import__("comet_dse.design_space.study", fromlist=["x"]).load_study(path))[0]
    assert pq.read_metadata(out).num_rows == sum(c.stop - c.start for c in points)


# --- 6. calibrate: each row is checked -----------------------------------------------------------

HEADER = ["id", "model", "gpus", "tp", "dp", "global_batch", "recompute", "metric", "measured"]
ROW = ["a", "megatron-22b", "64", "8", "8", "64", "full", "iter_s", "2.5"]


def _runs_file(path: Path, rows: list, header: list = HEADER) -> Path:
    path.write_text("\n".join(",".join(map(str, r)) for r in [header, *rows]) + "\n")
    return path


@pytest.mark.parametrize("rows, needles", [
    ([ROW[:5]], ("runs line 2: ", "has 5 fields, the header 9")),
    ([ROW + ["extra"]], ("runs line 2: ", "has 10 fields, the header 9")),
    ([ROW[:-1] + ["1e-300"]], ("runs line 2: measured", "[1e-06, 1e+06] s")),
    ([ROW[:-1] + ["1e300"]], ("runs line 2: measured", "[1e-06, 1e+06] s")),
    ([ROW[:-2] + ["tokens_per_s", "1e300"]], ("runs line 2: measured", "tokens/s")),
    ([ROW[:-2] + ["mfu", "1e-300"]], ("runs line 2: measured", "an MFU in [1e-06, 1]")),
    ([ROW[:-1] + ["nan"]], ("runs line 2: measured", "positive number")),
    ([ROW[:2] + ["9" * 5000] + ROW[3:]], ("runs line 2: gpus", "positive integer up to 10,000,000")),
])
def test_a_bad_calibration_row_is_one_line(tmp_path, capsys, rows, needles):
    """Probe 6: a short row and measured=1e-300 were tracebacks."""
    line = one_line_error(run(capsys, "calibrate", _runs_file(tmp_path / "runs.csv", rows), "--cluster",
                              "dgx-a100-80gb", "--no-cv", "--fit", "gemm"), *needles)
    assert len(line) < 400


def test_a_bad_architecture_column_is_one_line(tmp_path, capsys):
    header = ["id", "model_style", "layers", "hidden", "heads", "ffn", "vocab", "seq_len", "gpus", "tp",
              "global_batch", "metric", "measured"]
    for heads, needle in (("0", "heads: must be a positive integer"), ("x", "heads: must be a positive integer"),
                          ("", "heads: must be a positive integer")):
        row = ["a", "gpt", "24", "2304", heads, "9216", "51200", "2048", "8", "8", "8", "iter_s", "1.0"]
        one_line_error(run(capsys, "calibrate", _runs_file(tmp_path / "runs.csv", [row], header), "--cluster",
                           "dgx-a100-80gb", "--no-cv", "--fit", "gemm"), "runs line 2: ", needle)


# --- 7. calibrate: linear in the runs, k-fold past a few dozen -----------------------------------

def test_cross_validation_is_leave_one_out_then_k_fold():
    from comet_dse.answers.calibrate import CV_FOLDS, MAX_LEAVE_ONE_OUT, cross_validation

    assert cross_validation(MAX_LEAVE_ONE_OUT) == (MAX_LEAVE_ONE_OUT, "leave-one-out")
    assert cross_validation(MAX_LEAVE_ONE_OUT + 1) == (CV_FOLDS, f"{CV_FOLDS}-fold cross-validation")


def test_runs_evaluated_together_equal_each_run_alone():
    """A RunSet evaluates a group's runs at every parameter vector in one call of more than 64 points (past
    the size at which the cost model groups points): each error equals the run evaluated alone."""
    from comet_dse.answers.calibrate import Run, RunSet, parameters, step_errors
    from comet_dse.cost.distinct import MIN_POINTS
    from comet_dse.strategy.declared import Strategy

    a100 = load_cluster("dgx-a100-80gb")
    model = load_model("megatron-22b")
    params = [parameters(a100)[n] for n in ("gemm", "memory", "network.infiniband.efficiency")]
    runs = [Run(f"r{i}", model, 64, Strategy(tp=tp, dp=64 // tp, global_batch=64, micro_batch=mb,
                                              recompute=recompute), "iter_s", 2.0)
            for i, (tp, mb, recompute) in enumerate([(8, 1, "full"), (8, 2, "full"), (4, 1, "selective"),
                                                     (8, 1, "none"), (2, 4, "full"), (4, 2, "full"),
                                                     (8, 4, "selective"), (8, 8, "full")])]
    runs.append(dc.replace(runs[0], metric="mfu", measured=0.4))
    runs.append(dc.replace(runs[1], metric="tokens_per_s", measured=50_000.0))
    values = np.column_stack([np.linspace(0.5, 0.95, 9), np.linspace(0.4, 1.0, 9), np.linspace(0.2, 0.9, 9)])
    together = RunSet(runs, a100).errors(params, values)
    assert len(runs) * len(values) > MIN_POINTS
    for one, row in zip(runs, together):          # one point at a time: nothing to group
        alone = np.array([step_errors(one, a100, params, v[None, :])[0] for v in values])
        np.testing.assert_allclose(row, alone, rtol=1e-12)


def test_200_runs_calibrate_with_k_fold_cross_validation(tmp_path, capsys):
    """Probe 7: 100 runs gave no answer in 300 s. 200 runs finish (bounded at a hang, not timed) and are
    cross-validated 10-fold (benchmarks/bench_calibrate.py measures the rate)."""
    source = ROOT / "examples" / "calibration" / "narayanan2021_runs.csv"
    with source.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    runs = tmp_path / "runs.csv"
    with runs.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        for i in range(200):
            row = dict(rows[i % len(rows)], id=f"r{i}")
            row["measured"] = repr(float(row["measured"]) * (1 + 0.02 * math.sin(i)))
            writer.writerow(row)
    with no_hang(900):
        code, out, err = run(capsys, "calibrate", runs, "--cluster", "dgx-a100-80gb", "--json")
    assert code == 0, err
    result = strict_json(out)
    assert result["cross_validation"] == "10-fold cross-validation"
    assert len(result["runs"]) == 200 and all(r["error_cross_validated"] is not None for r in result["runs"])
    assert result["summary"]["cross_validated"]["mean_abs_error"] < 0.10


# --- 8. huge numbers in any file; the two model readers share their bounds ----------------------

HUGE = "9" * 5000


@pytest.mark.parametrize("name, text", [
    ("m.yaml", f"name: x\nlayers: {HUGE}\n"),
    ("config.json", '{"n_layer": ' + HUGE + ', "n_embd": 64, "n_head": 4, "vocab_size": 100}'),
])
def test_a_5000_digit_integer_in_a_model_file_is_one_line(tmp_path, capsys, name, text):
    (tmp_path / name).write_text(text)
    one_line_error(run(capsys, "estimate", "--model", tmp_path / name, *ESTIMATE[3:]),
                   "model: ", "more than 4,300 digits")


def test_a_5000_digit_integer_in_a_study_or_cluster_file_is_one_line(tmp_path, capsys):
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(STUDY, sort_keys=False).replace("global_batch: 64", f"global_batch: {HUGE}"))
    one_line_error(run(capsys, "sweep", study, "--output", tmp_path / "r.parquet"), "study: ", "4,300 digits")
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump(preset_data("clusters", "dgx-a100-80gb")).replace("max_devices: 4480",
                                                                                        f"max_devices: {HUGE}"))
    one_line_error(run(capsys, "estimate", "--model", "megatron-22b", "--cluster", cluster, *ESTIMATE[5:]),
                   "cluster: ", "4,300 digits")


LLAMA = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192, "model_type": "llama"}


@pytest.mark.parametrize("change, field, needle", [
    ({"num_hidden_layers": 10**400}, "config.json:num_hidden_layers", "a 401-digit number"),
    ({"num_hidden_layers": 10**9 + 1}, "config.json:num_hidden_layers", "up to 1,000,000,000, got 1000000001"),
    ({"intermediate_size": 10**400}, "config.json:ffn", "401-digit"),
    ({"max_position_embeddings": 10**12}, "config.json:seq_len", "up to 1,000,000,000"),
    ({"num_key_value_heads": 0}, "config.json:kv_heads", "positive integer"),
    ({"num_key_value_heads": 3}, "config.json:kv_heads", "must divide heads=32"),
    ({"attention_dropout": 10**400}, "config.json:attention_dropout", "must be a number"),
])
def test_config_json_counts_have_the_model_files_bounds(tmp_path, change, field, needle):
    """Probe 8: 10^400 layers were an OverflowError, 1,000,000,001 layers were accepted (a model YAML
    refuses them), and num_key_value_heads: 0 silently became multi-head attention."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **change}))
    with pytest.raises(InputError) as info:
        comet_dse.load_model(str(path))
    assert info.value.field == field and needle in info.value.message, info.value


def test_layers_past_the_bound_are_refused_by_both_model_readers(tmp_path, capsys):
    model = preset_data("models", "megatron-22b")
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**model, "layers": 10**9 + 1}))
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "num_hidden_layers": 10**9 + 1}))
    for path in (tmp_path / "m.yaml", tmp_path / "config.json"):
        one_line_error(run(capsys, "estimate", "--model", path, *ESTIMATE[3:]), "layers",
                       "a positive integer up to 1,000,000,000, got 1000000001")


# --- 9. the API refuses what the command line refuses --------------------------------------------

@pytest.mark.parametrize("kw, field", [(dict(tp=0), "tp"), (dict(tp="x"), "tp"), (dict(cp=0), "cp"),
                                       (dict(pp=-1), "pp"), (dict(seq_len=0), "seq_len"),
                                       (dict(seq_len=-5), "seq_len"), (dict(devices=0), "devices"),
                                       (dict(devices="64"), "devices"), (dict(global_batch=0), "global-batch")])
def test_api_estimate_bad_values_are_input_errors(kw, field):
    """Probe 9: tp=0 was a ZeroDivisionError and seq_len=0 was ignored."""
    args = {"devices": 64, "tp": 8, "global_batch": 64, **kw}
    with pytest.raises(InputError) as info:
        comet_dse.estimate("megatron-22b", "dgx-a100-80gb", **args)
    assert info.value.field == field, info.value


def test_api_search_and_whatif_bad_values_are_input_errors():
    for call in (comet_dse.search, comet_dse.whatif):
        for args, kw in (((64, 64), dict(tp=0)), ((64, 64), dict(seq_len=0)), ((0, 64), {}), ((64, 0), {})):
            with pytest.raises(InputError):
                call("megatron-22b", "dgx-a100-80gb", *args, **kw)


# --- 10. a resource set twice ---------------------------------------------------------------------

def test_a_resource_set_twice_is_refused(capsys):
    """Probe 10: --set x=2x given twice silently multiplied the first value."""
    one_line_error(run(capsys, *ESTIMATE, "--set", "peak_flops=x2", "--set", "peak_flops=x2"),
                   "--set peak_flops: is given twice")
    one_line_error(run(capsys, "search", *SEARCH, "--global-batch", 64, "--set", "hbm_capacity=40GiB",
                       "--set", "hbm_capacity=x2"), "--set hbm_capacity: is given twice")
    with pytest.raises(InputError, match="overrides hbm_capacity: is given twice"):
        comet_dse.load_cluster("dgx-a100-80gb", overrides=[("hbm_capacity", "x2"), ("hbm_capacity", "x2")])
    code, _, err = run(capsys, *ESTIMATE, "--set", "peak_flops=x2", "--set", "peak_flops.fp8=1PFLOP/s")
    assert code == 0, err


# --- 11. an override outside the plausible bounds; a non-finite step is never feasible ----------

@pytest.mark.parametrize("setting, field", [
    ("peak_flops=x1e-308", "--set peak_flops"), ("peak_flops.bf16=1e-300", "--set peak_flops.bf16"),
    ("hbm_bandwidth=x1e-300", "--set hbm_bandwidth"), ("network_bandwidth=x1e-300", "--set network_bandwidth"),
    ("network.infiniband.efficiency=1e-300", "--set network.infiniband.efficiency"),
])
def test_an_override_below_the_plausible_range_is_refused(capsys, setting, field):
    """Probe 11: --set peak_flops=x1e-308 gave a feasible point with an infinite step time."""
    one_line_error(run(capsys, *ESTIMATE, "--set", setting), field, "outside the plausible range")


def test_a_file_with_a_vanishing_rate_or_efficiency_is_refused(tmp_path, capsys):
    for edit, field in ((lambda d: d["accelerator"]["peak_flops"].update(bf16=1e-300), "peak_flops.bf16"),
                        (lambda d: d["accelerator"]["memory"]["hbm"].update(efficiency=1e-300), "hbm.efficiency")):
        data = preset_data("clusters", "dgx-a100-80gb")
        edit(data)
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
        one_line_error(run(capsys, "estimate", "--model", "megatron-22b", "--cluster", tmp_path / "c.yaml",
                           *ESTIMATE[5:]), field)


def test_a_step_time_that_is_not_finite_is_never_feasible():
    """Past every input check (a cluster built in code with a rate of 1e-300 FLOP/s), the point is infeasible
    with the step_time rule, in an estimate and in a search."""
    from comet_dse.answers.estimate import estimate
    from comet_dse.design_space.search import search
    from comet_dse.strategy.declared import Strategy

    a100 = load_cluster("dgx-a100-80gb")
    acc = a100.accelerator
    broken = dc.replace(a100, accelerator=dc.replace(acc, peak_flops={k: 1e-300 for k in acc.peak_flops},
                                                     vector_flops=1e-300))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        result = estimate(load_model("megatron-22b"), broken, 64, Strategy(tp=8, dp=8, global_batch=64))
        found = search(load_model("megatron-22b"), broken, 64, 64, SearchSpace.of(tp=(8,)))
    assert not result.feasible and "step_time" in result.broken_rules, result.broken_rules
    assert found.feasible == 0 and found.infeasible_by_rule.get("step_time", 0) > 0


# --- 12. strict JSON everywhere -------------------------------------------------------------------

def test_every_json_output_is_strict_json(tmp_path, capsys):
    """Probe 12: sweep --json and every summary.json held a bare NaN (no device price: cost_usd NaN)."""
    cluster = preset_data("clusters", "dgx-a100-80gb")
    cluster.pop("device_price_usd")
    cluster.pop("device_power_w")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    study = write_study(tmp_path / "s.yaml", cluster=str(tmp_path / "c.yaml"))
    code, out, err = run(capsys, "sweep", study, "--output", tmp_path / "r.parquet", "--json", "--no-progress")
    assert code == 0, err
    ranking = strict_json(out)
    assert ranking["variants"][0]["best"]["cost_usd"] is None
    assert strict_json((tmp_path / "r.parquet.summary.json").read_text()) == ranking
    code, out, err = run(capsys, "sweep", study, "--output", tmp_path / "d", "--json", "--no-progress")
    assert code == 0, err
    strict_json(out)
    outputs = [run(capsys, *ESTIMATE, "--json"),
               run(capsys, *ESTIMATE[:3], "--cluster", tmp_path / "c.yaml", *ESTIMATE[5:], "--json",
                   "--set", "hbm_capacity=1GiB"),
               run(capsys, "search", *SEARCH, "--global-batch", 64, "--tp", 8, "--json"),
               run(capsys, "whatif", *SEARCH, "--global-batch", 64, "--tp", 8, "--json"),
               run(capsys, "presets", "--json"), run(capsys, "validate", "--json")]
    for code, out, err in outputs:
        assert code == 0, err
        strict_json(out)


def test_a_chunk_summary_read_back_equals_the_one_kept_in_memory(tmp_path):
    """The summary a worker writes is strict JSON, and reading it back gives what the run kept (no NaN in
    one and None in the other: a resumed ranking equals a fresh one)."""
    cluster = preset_data("clusters", "dgx-a100-80gb")
    cluster.pop("device_price_usd")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    from comet_dse.design_space.study import load_study

    study = load_study(write_study(tmp_path / "s.yaml", cluster=str(tmp_path / "c.yaml")))
    chunks, strategies = engine.plan(study)
    c = chunks[0]
    table = engine.run_chunk(study, c, strategies[(0, c.devices, 64)].take(np.arange(c.start, c.stop)))
    summary = engine.chunk_summary(table, 5)
    assert strict_json(jsonout.dumps(summary)) == summary
    assert summary["top"][0]["cost_usd"] is None


def test_jsonout_writes_non_finite_numbers_as_null():
    value = {"a": float("nan"), "b": [np.float64("inf"), -math.inf, np.int64(3), np.bool_(True)], "c": (1.5,)}
    assert strict_json(jsonout.dumps(value)) == {"a": None, "b": [None, None, 3, True], "c": [1.5]}


JSON_WRITERS_WITHOUT_FLOATS = {     # json.dumps of values that never hold a float (names, counts, digests)
    "base/jsonout.py", "base/written.py", "design_space/output.py", "design_space/study.py", "design_space/engine.py"}


def test_every_json_writer_goes_through_jsonout():
    """Every json.dumps in the package that can see a float is jsonout.dumps; the few left write names,
    counts and digests only (the ledger, the dataset marker, the study digest, plan.json)."""
    package = ROOT / "src" / "comet_dse"
    found = {str(p.relative_to(package)) for p in package.rglob("*.py") if "json.dumps(" in p.read_text()}
    assert found <= JSON_WRITERS_WITHOUT_FLOATS, found - JSON_WRITERS_WITHOUT_FLOATS
    engine_text = (package / "design_space" / "engine.py").read_text()
    assert engine_text.count("json.dumps(") == 1 and 'json.dumps(marker)' in engine_text
