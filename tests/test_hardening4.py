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
