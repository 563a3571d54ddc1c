"""Hardening, fourth round (issue 39): calibrated files tied to what they calibrate, bounded inputs."""
import shutil
from pathlib import Path

import pytest
import yaml

from comet_dse.answers.errorband import band_of_cluster
from comet_dse.presets.catalog import load_cluster
from cli_run import run as run_cli

ROOT = Path(__file__).resolve().parents[1]
CALIBRATED = ROOT / "examples" / "calibration" / "dgx-h100-mlperf.yaml"


def _copy(tmp_path: Path) -> Path:
    shutil.copy(CALIBRATED, tmp_path / CALIBRATED.name)
    shutil.copy(CALIBRATED.parent / "h100_mlperf_runs.csv", tmp_path / "h100_mlperf_runs.csv")
    return tmp_path / CALIBRATED.name


def _edit(path: Path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_the_shipped_calibrated_files_match_their_calibration():
    for path in sorted((ROOT / "examples" / "calibration").glob("*.yaml")):
        cluster = load_cluster(str(path))
        assert cluster.calibration and not cluster.calibration.get("stale"), path.name
        assert band_of_cluster(cluster, "fp8")["text"].startswith("calibrated to")


@pytest.mark.parametrize("change", [
    lambda d: d["accelerator"].update(tensor_sustained=0.95),
    lambda d: d["accelerator"]["peak_flops"].update(fp8="9894.5 TFLOP/s"),
    lambda d: d["calibration"]["fitted"]["sustained"].update(value=0.7),
    lambda d: d["calibration"].pop("fitted"),
    lambda d: d["calibration"].pop("base"),
    lambda d: d["calibration"].pop("runs_sha256"),
    lambda d: d["calibration"].pop("fingerprint"),
    lambda d: d["calibration"]["error_cross_validated"].update(mean_abs_error=0.01),
], ids=["sustained", "peak", "fitted value", "no fitted", "no base", "no runs_sha256", "no fingerprint",
        "error figure"])
def test_an_edited_calibrated_file_no_longer_claims_its_errors(tmp_path, change):
    path = _copy(tmp_path)
    _edit(path, change)
    band = band_of_cluster(load_cluster(str(path)), "fp8")
    assert not band["validated"] and "no longer matches this cluster" in band["text"], band["text"]
    assert "calibrated to" not in band["text"]


def test_changed_or_missing_runs_break_the_calibration(tmp_path, capsys):
    path = _copy(tmp_path)
    runs = tmp_path / "h100_mlperf_runs.csv"
    runs.write_text(runs.read_text() + "\n")
    assert "changed since the fit" in load_cluster(str(path)).calibration["stale"]
    runs.unlink()
    assert "is not beside it" in load_cluster(str(path)).calibration["stale"]
    code, out, _ = run_cli(capsys, "estimate", "--model", "gpt3-175b", "--cluster", path, "--devices", 512,
                           "--tp", 4, "--pp", 8, "--global-batch", 512, "--dtype", "fp8")
    assert code == 0 and "no longer matches this cluster" in out and "calibrated to" not in out


def _data_folder(tmp_path: Path) -> Path:
    """A copy of the packaged validation data, to edit."""
    folder = tmp_path / "data"
    shutil.copytree(ROOT / "src" / "comet_dse" / "data" / "validation", folder)
    return folder


def test_validate_lists_a_row_it_cannot_run_as_written(tmp_path, capsys):
    import json

    folder = _data_folder(tmp_path)
    path = folder / "h100_public.csv"
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    row = lines[1].split(",")
    row[header.index("global_batch")] = "7"            # no data-parallel split divides it
    path.write_text("\n".join([lines[0], ",".join(row)] + lines[2:]) + "\n")
    code, out, _ = run_cli(capsys, "validate", "--data", folder, "--json")
    assert code == 0
    data = json.loads(out)
    label = row[header.index("id")]
    assert [r for r in data["not_compared"] if r["label"] == label]
    assert label not in {r["label"] for r in data["rows"]}


def test_validate_refuses_a_file_beyond_its_row_bound(tmp_path, capsys):
    from comet_dse.answers.validation import MAX_ROWS
    from cli_run import one_line_error

    folder = _data_folder(tmp_path)
    path = folder / "h100_public.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0]] + [lines[1]] * (MAX_ROWS + 1)) + "\n")
    one_line_error(run_cli(capsys, "validate", "--data", folder), "h100_public.csv", "2,000 rows")


def test_calibrate_refuses_runs_that_cannot_run_and_a_parameter_named_twice(tmp_path, capsys):
    from cli_run import one_line_error

    runs = tmp_path / "runs.csv"
    runs.write_text("id,model,gpus,tp,pp,global_batch,metric,measured\n"
                    "a,llama3-8b,32,1,1,7,iter_s,1.0\n")
    one_line_error(run_cli(capsys, "calibrate", runs, "--cluster", "dgx-h100", "--fit", "sustained"),
                   "runs a", "cannot run as written")
    runs.write_text("id,model,gpus,tp,pp,global_batch,metric,measured\n" +
                    "".join(f"r{i},llama3-8b,8,1,1,{8 * (i + 1)},iter_s,{i + 1}.0\n" for i in range(6)))
    one_line_error(run_cli(capsys, "calibrate", runs, "--cluster", "dgx-h100", "--fit", "memory,memory"),
                   "fit", "twice")


def test_money_and_days_never_print_infinities_or_exponents():
    from comet_dse.base.units import format_duration, format_usd

    assert format_usd(1e12) == "$1,000B" and format_usd(7.25e6) == "$7.25M" and format_usd(950) == "$950"
    assert format_usd(float("inf")) == format_usd(float("nan")) == "unknown"
    assert format_duration(float("inf")) == "unknown"


@pytest.mark.parametrize("days", ["5_0", "\uff150"])
def test_days_take_the_number_syntax_of_every_other_amount(capsys, days):
    from cli_run import one_line_error

    one_line_error(run_cli(capsys, "plan", "--model", "llama3-8b", "--global-batch", 512, "--tokens", "1T",
                           "--days", days), "--days", "cannot read")


@pytest.mark.parametrize("call, field", [
    (lambda api: api.plan("llama3-8b", "1T", 512, days="x"), "days"),
    (lambda api: api.plan("llama3-8b", "1T", 512, days=30, devices="8"), "devices"),
    (lambda api: api.plan("llama3-8b", "1T", 512, days=30, clusters=5), "clusters"),
    (lambda api: api.sweep(None), "study"),
    (lambda api: api.estimate("llama3-8b", "dgx-h100", 8, global_batch=8, zero=True), "zero"),
    (lambda api: api.estimate("llama3-8b", "dgx-h100", 8, global_batch=8, physical="yes"), "physical"),
    (lambda api: api.whatif("llama3-8b", "dgx-h100", 8, 8, resources=5), "resources"),
])
def test_the_api_refuses_a_wrong_type_with_an_input_error(call, field):
    from comet_dse import api
    from comet_dse.base.errors import InputError

    with pytest.raises(InputError) as err:
        call(api)
    assert err.value.field == field


def test_the_api_takes_one_cluster_name_and_one_device_count():
    from comet_dse import api

    result = api.plan("llama3-8b", "1T", 512, days=30, clusters="dgx-h100", devices=64)
    assert result.clusters == ("dgx-h100",)


def test_a_name_with_a_newline_is_refused(tmp_path, capsys):
    from cli_run import one_line_error

    data = yaml.safe_load((ROOT / "src/comet_dse/presets/clusters/dgx-h100.yaml").read_text())
    data["name"] = "evil\nbandwidth: 1"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    one_line_error(run_cli(capsys, "estimate", "--model", "llama3-8b", "--cluster", tmp_path / "c.yaml",
                           "--devices", 8, "--global-batch", 8), "cluster.name", "one line")


def test_the_explorer_answers_malformed_requests_with_a_4xx_and_a_sentence():
    pytest.importorskip("dash")
    from comet_dse.web.app import MAX_REQUEST_BYTES, build_app

    client = build_app().server.test_client()
    unknown = {"output": "nothing.children", "outputs": {"id": "nothing", "property": "children"}, "inputs": [],
               "changedPropIds": []}
    answers = [client.post("/_dash-update-component", json=unknown),
               client.post("/_dash-update-component", data="[" * 100_000 + "]" * 100_000,
                           content_type="application/json"),
               client.post("/_dash-update-component", data=b"x" * (MAX_REQUEST_BYTES + 1),
                           content_type="application/json")]
    assert [r.status_code for r in answers] == [400, 400, 413]
    assert b"Traceback" not in answers[0].data and b"could not be answered" in answers[0].data
    assert client.get("/").status_code == 200


@pytest.mark.parametrize("factor", ["x1.0", "x1.02", "x1.05", "x1.1", "x1.2", "x1.5", "x2"])
def test_more_hbm_never_makes_a_point_with_a_tier_infeasible(factor):
    """Probe: megatron-310b on 144 GB200 with a 512 GiB tier flipped feasible, no, no, yes, no, yes, yes as the
    HBM grew: the placement tested HBM again after spilling, and rounding decided (cost/memory.py: place)."""
    from comet_dse import api

    result = api.estimate("megatron-310b", "gb200-nvl72", 144, tp=1, pp=8, dp=18, zero=1, global_batch=144,
                          overrides={"hbm_capacity": factor}, expansion="512GiB@64GB/s")
    assert result.feasible, result.reasons


CP_RING = dict(tp=4, cp=16, pp=1, dp=1, global_batch=8, micro_batch=1, recompute="none", sequence_parallel=True,
               zero=2, dtype="bf16", flash_attention=False, tp_overlap=True, cp_algorithm="ring")


@pytest.mark.parametrize("cluster, resource, factor", [
    ("dgx-a100-40gb", "sram_capacity", "x6.68"), ("dgx-a100-40gb", "hbm_bandwidth", "x4.12"),
    ("gaudi3", "hbm_bandwidth", "x10"), ("mi300x", "hbm_bandwidth", "x6.25"), ("dgx-h200", "sram_capacity", "x4"),
])
def test_a_better_resource_never_slows_a_cp_ring(cluster, resource, factor):
    """Probe (benchmarks/probe_monotonic.py with factors to 10 and cp to 16): with a CP ring and unfused
    attention a faster HBM or a larger SRAM made a step up to 4 % slower: the backward ring was charged against
    2.5x the forward attention kernels, which a memory-bound core does not take (cost/layer_work.py)."""
    from comet_dse import api

    base = api.estimate("llama3-8b", cluster, 64, seq_len=8192, **CP_RING)
    better = api.estimate("llama3-8b", cluster, 64, seq_len=8192, overrides={resource: factor}, **CP_RING)
    assert better.step_time_s <= base.step_time_s * (1 + 1e-12)


def test_an_export_of_more_ranks_than_its_bound_is_refused_before_any_work(tmp_path, capsys):
    from comet_dse.export.folder import MAX_RANKS
    from cli_run import one_line_error

    data = yaml.safe_load((ROOT / "src/comet_dse/presets/clusters/dgx-h100.yaml").read_text())
    data.pop("max_devices")
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(data))
    devices = 8 * (MAX_RANKS // 8 + 1)
    one_line_error(run_cli(capsys, "export", "--model", "llama3-8b", "--cluster", tmp_path / "big.yaml",
                           "--devices", devices, "--tp", 8, "--global-batch", devices // 8, "--no-traces",
                           "-o", tmp_path / "out"), "devices", f"{MAX_RANKS:,}")
    assert not (tmp_path / "out").exists()


def test_a_full_disk_during_export_or_sweep_names_the_output(tmp_path, capsys, monkeypatch):
    """Probe: export and sweep said "No space left on device" and nothing else."""
    import errno
    import os
    import pathlib

    import pyarrow.parquet as pq

    from cli_run import one_line_error
    from comet_dse.cli.options import EXIT_STORAGE

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real = pathlib.Path.write_text
    monkeypatch.setattr(pathlib.Path, "write_text",
                        lambda self, *a, **k: full() if self.name == "network.yml" else real(self, *a, **k))
    out = tmp_path / "export"
    one_line_error(run_cli(capsys, "export", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", 8,
                           "--tp", 8, "--global-batch", 8, "--no-traces", "-o", out),
                   str(out), "ENOSPC", status=EXIT_STORAGE)
    assert not out.exists()
    monkeypatch.setattr(pathlib.Path, "write_text", real)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    result = tmp_path / "points.parquet"
    code, _, err = run_cli(capsys, "sweep", ROOT / "studies" / "example-capacity.yaml", "--output", result,
                           "--no-progress")
    assert code == EXIT_STORAGE and f"cannot write {result}" in err and "ENOSPC" in err, err


def test_calibrate_says_which_runs_do_not_fit_and_keeps_them(tmp_path, capsys):
    runs = tmp_path / "runs.csv"
    runs.write_text("id,model,gpus,tp,pp,global_batch,metric,measured\n" +
                    "".join(f"r{i},llama3-8b,8,8,1,{8 * (i + 1)},iter_s,{i + 1}.0\n" for i in range(5)) +
                    "big,llama3-405b,8,8,1,8,iter_s,100.0\n")
    code, out, err = run_cli(capsys, "calibrate", runs, "--cluster", "dgx-h100", "--fit", "sustained", "--no-cv")
    assert code == 0 and "1 of 6 runs do not fit in memory" in err and "(big)" in err, err
