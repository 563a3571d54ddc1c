"""comet-dse calibrate: recovers parameters it generated, refuses what the runs cannot support, rejects bad files."""
import csv
import dataclasses as dc

import numpy as np
import pytest
import yaml

from comet_dse.answers.calibrate import Run, fit, leave_one_out, parameters, step_errors
from comet_dse.answers.estimate import estimate
from comet_dse.cli import main
from comet_dse.presets.catalog import load_cluster, load_model, preset_names
from comet_dse.strategy.choices import Recompute
from comet_dse.strategy.declared import Strategy
from cli_run import one_line_error, run as run_cli

A100 = load_cluster("dgx-a100-80gb")
NAMES = ["gemm", "memory", "network.infiniband.efficiency"]
TRUTH = np.array([0.70, 0.75, 0.55])
SETUPS = [("megatron-1.7b", 32, dict(tp=1, dp=32, global_batch=512, micro_batch=4)),
          ("megatron-3.6b", 64, dict(tp=2, dp=32, global_batch=512, micro_batch=4)),
          ("megatron-7.5b", 128, dict(tp=4, dp=32, global_batch=512, micro_batch=2)),
          ("megatron-18b", 256, dict(tp=8, dp=32, global_batch=1024, micro_batch=2)),
          ("megatron-39b", 512, dict(tp=8, pp=2, dp=32, global_batch=1536, micro_batch=1)),
          ("megatron-22b", 64, dict(tp=8, dp=8, global_batch=64, micro_batch=1)),
          ("megatron-22b", 8, dict(tp=8, global_batch=32, micro_batch=4)),
          ("megatron-1.7b", 256, dict(tp=1, dp=256, global_batch=512, micro_batch=2)),
          ("megatron-3.6b", 16, dict(tp=2, dp=8, global_batch=64, micro_batch=8))]


def _synthetic_runs(noise=0.01, seed=0):
    """Runs whose 'measured' times the model itself produced at TRUTH, with relative noise."""
    rng = np.random.default_rng(seed)
    params = [parameters(A100)[n] for n in NAMES]
    runs = []
    for i, (name, gpus, kw) in enumerate(SETUPS):
        run = Run(f"r{i}", load_model(name), gpus, Strategy(recompute=Recompute.FULL, **kw), "iter_s", 1.0)
        time = (step_errors(run, A100, params, TRUTH[None, :])[0] + 1.0) * (1.0 + noise * rng.standard_normal())
        runs.append(dc.replace(run, measured=float(time)))
    return runs


def test_batched_parameter_points_equal_estimates_on_the_changed_cluster():
    params = [parameters(A100)[n] for n in NAMES]
    run = Run("x", load_model("megatron-22b"), 64, Strategy(tp=8, dp=8, global_batch=64), "iter_s", 1.0)
    points = np.array([[0.8, 0.9, 0.9], [0.6, 0.5, 0.3], [0.9, 0.7, 0.6]])
    errors = step_errors(run, A100, params, points)
    for row, error in zip(points, errors):
        cluster = A100
        for p, value in zip(params, row):
            cluster = p.put(cluster, float(value))
        assert error + 1.0 == pytest.approx(estimate(run.model, cluster, 64, run.strategy).step_time_s, rel=1e-12)


def test_recovers_the_parameters_that_generated_the_runs():
    runs = _synthetic_runs()
    result = fit(runs, A100, NAMES)
    assert result.unidentifiable == []
    for name, value, sigma, truth in zip(NAMES, result.values, result.sigma, TRUTH):
        assert abs(value - truth) <= max(3 * sigma, 0.02), (name, value, sigma)
    assert np.mean(np.abs(result.before)) > 0.10          # the preset is far from these runs
    assert np.max(np.abs(result.after)) < 0.04             # the fit explains them to the noise
    loo = leave_one_out(runs, A100, NAMES, result)
    assert np.mean(np.abs(loo)) < 0.03


def test_a_parameter_the_runs_cannot_move_is_left_at_the_preset_and_named():
    """None of these runs uses fp8 or flash attention: their GEMM and kernel efficiencies cannot be fitted."""
    runs = _synthetic_runs()[:6]
    result = fit(runs, A100, ["gemm", "gemm_fp8", "attention"])
    assert result.unidentifiable == ["gemm_fp8", "attention"]
    assert result.values[1] == pytest.approx(parameters(A100)["gemm_fp8"].get(A100))
    assert result.values[2] == pytest.approx(1.0)


def _write_runs(path, rows):
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _row(**extra):
    row = {"id": "a", "model": "megatron-22b", "gpus": "64", "tp": "8", "dp": "8", "global_batch": "64",
           "recompute": "full", "metric": "iter_s", "measured": "2.5"}
    row.update(extra)
    return row


def _bad(capsys, path, *needles, extra=()):
    one_line_error(run_cli(capsys, "calibrate", path, "--cluster", "dgx-a100-80gb", *extra), *needles)


def test_refuses_more_parameters_than_the_runs_support(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    _write_runs(path, [_row(id=f"r{i}", measured=str(2.0 + i / 10)) for i in range(5)])
    _bad(capsys, path, "fit: 4 parameters need at least 12 runs", "the file has 5")


@pytest.mark.parametrize("rows, needles", [
    ([{k: v for k, v in _row().items() if k != "measured"}], ("runs.measured: is missing",)),
    ([_row(model="gpt-5")], ("runs line 2: model", "unknown preset 'gpt-5'")),
    ([_row(model="dlrm-dcnv2")], ("model", "is a recommendation model; calibrate takes transformers only")),
    ([_row(measured="-3")], ("runs line 2: measured", "positive number")),
    ([_row(metric="speed")], ("runs line 2: metric", "iter_s, tokens_per_s, mfu")),
    ([_row(recompute="sometimes")], ("runs line 2: recompute", "none, selective, full")),
    ([_row(gpus="63")], ("runs line 2: gpus", "tp*cp*pp*dp = 64")),
    ([_row(colour="red")], ("runs.colour: unknown column",)),
])
def test_a_bad_runs_file_is_one_line_and_status_2(tmp_path, capsys, rows, needles):
    path = tmp_path / "runs.csv"
    _write_runs(path, rows)
    _bad(capsys, path, *needles)


def test_writes_a_labelled_calibrated_cluster_that_estimate_takes(tmp_path, capsys):
    runs = _synthetic_runs()
    path = tmp_path / "runs.csv"
    rows = []
    for run, (name, gpus, kw) in zip(runs, SETUPS):
        rows.append({"id": run.label, "model": name, "gpus": str(gpus), "recompute": "full", "metric": "iter_s",
                     "measured": repr(run.measured), **{k: str(v) for k, v in {"tp": 1, "pp": 1, **kw}.items()}})
    _write_runs(path, rows)
    out = tmp_path / "mine.yaml"
    assert main(["calibrate", str(path), "--cluster", "dgx-a100-80gb", "--fit", ",".join(NAMES),
                 "--output", str(out), "--no-cv"]) == 0
    capsys.readouterr()
    data = yaml.safe_load(out.read_text())
    assert data["name"] == "dgx-a100-80gb-calibrated"
    assert data["calibration"]["base"] == "dgx-a100-80gb"
    assert len(data["calibration"]["runs_sha256"]) == 64
    assert abs(data["calibration"]["fitted"]["gemm"]["value"] - 0.70) < 0.03
    calibrated = load_cluster(str(out))
    assert calibrated.calibration["fingerprint"] and not calibrated.calibration.get("stale")   # sealed, and intact
    st = Strategy(tp=8, dp=8, global_batch=64, recompute=Recompute.FULL)
    base = estimate(load_model("megatron-22b"), A100, 64, st).step_time_s
    assert estimate(load_model("megatron-22b"), calibrated, 64, st).step_time_s > base


def test_shipped_presets_are_not_calibrated():
    for name in preset_names("clusters"):
        cluster = load_cluster(name)
        assert cluster.calibration is None and cluster.step_overhead == 0 and cluster.microbatch_overhead == 0
