"""The training efficiency the presets ship: refitted equal to the file, applied by family, one flag from the
physical reading, kept under what-if, refused when its file cannot be trusted (hardware/efficiency.py)."""
import dataclasses as dc
import json
import shutil
from pathlib import Path

import pytest
import yaml

from comet_dse import api
from comet_dse.answers.calibrate import parameters
from comet_dse.answers.efficiency_fit import MIN_RUNS, refit_values
from comet_dse.answers.overrides import apply_overrides
from comet_dse.base.errors import InputError
from comet_dse.hardware.efficiency import (
    ASSUMED, MEASURED, PHYSICAL, checksum, read_table, shipped_path, shipped_table,
)
from comet_dse.presets.catalog import load_cluster, load_model
from cli_run import one_line_error, run as run_cli

H100 = "NVIDIA H100 SXM5 80GB"
LLAMA = dict(tp=4, pp=4, global_batch=256, micro_batch=1, recompute="full", zero=1)


def test_the_shipped_efficiency_is_what_the_committed_script_fits_on_the_packaged_runs():
    refit = refit_values(shipped_path().parent / "validation")
    shipped = {(f["accelerator"], f["precision"], f["kind"]): f for f in shipped_table()}
    assert {(f["accelerator"], f["precision"], f["kind"]) for f in refit} == set(shipped)
    for f in refit:
        ship = shipped[f["accelerator"], f["precision"], f["kind"]]
        assert ship["runs"] == f["runs"] >= MIN_RUNS
        assert abs(ship["efficiency"] - f["efficiency"]) <= 5e-4, (f, ship["efficiency"])


def test_each_family_is_fitted_below_its_burn_test_and_the_presets_read_its_runs_as_the_fit_did():
    """Every fitted value lies below the burn test, and the presets as shipped read each applied family's runs
    with the in-sample error the fit recorded (the bands of the fitted datasets' comparisons as `validate` makes
    them; fsdp_public's runs are compared but not fitted): the shipped efficiency is the one the presets use."""
    from comet_dse.answers.errorband import bands_of
    from comet_dse.answers.validation import OTHERS, gpu_comparisons, h100_comparisons, validation_dir

    fitted_runs = (h100_comparisons(load_cluster("dgx-h100"), validation_dir()) + gpu_comparisons()
                   + gpu_comparisons(name=OTHERS))
    bands = {(b["hardware"], b["precision"], b["kind"]): b for b in bands_of(fitted_runs)}
    for fam in shipped_table():
        assert 0.3 <= fam["efficiency"] and fam["physical"] <= 1.0, fam
        # a fit at or above the burn test is not shipped: the family keeps the physical reading (at_physical)
        assert (fam["efficiency"] < fam["physical"]) != bool(fam.get("at_physical")), fam
        assert not (fam.get("at_physical") and fam["applies"]), fam
        if fam["applies"]:
            band = bands[fam["accelerator"], fam["precision"], fam["kind"]]
            assert band["runs"] == fam["runs"]
            assert band["mean_abs_error"] == pytest.approx(fam["error_fitted"]["mean_abs_error"], abs=2e-3)


def test_presets_carry_the_measured_family_and_assume_the_nearest_where_none_was_measured():
    h100 = load_cluster("dgx-h100").accelerator.training_efficiency
    assert h100["16-bit", "dense"].status == MEASURED and h100["fp8", "dense"].status == MEASURED
    assert h100["16-bit", "MoE"].status == ASSUMED                     # no comparable H100 MoE run
    assert h100["16-bit", "MoE"].value == h100["16-bit", "dense"].value
    b200 = load_cluster("dgx-b200").accelerator.training_efficiency
    assert b200["16-bit", "dense"].status == ASSUMED and b200["16-bit", "dense"].family["precision"] == "fp8"
    gb200 = load_cluster("gb200-nvl72").accelerator.training_efficiency   # 2 comparable runs: too few
    assert gb200["16-bit", "MoE"].status == ASSUMED and gb200["fp8", "MoE"].status == MEASURED
    h800 = load_cluster("dgx-h800").accelerator.training_efficiency       # same silicon as the H100
    assert all(a.status == ASSUMED and a.family["accelerator"] == H100 for a in h800.values())
    mi300x = load_cluster("mi300x").accelerator.training_efficiency     # the MI325X's compute dies
    assert mi300x and all(a.status == ASSUMED and a.family["accelerator"] == "AMD Instinct MI325X"
                          for a in mi300x.values())
    for name in ("dgx-a100-80gb", "tpu-v4", "gaudi3"):                    # no public runs of today's kind
        assert load_cluster(name).accelerator.training_efficiency == {}


def test_the_efficiency_replaces_the_sustained_rate_and_physical_is_one_flag_away():
    model = load_model("llama3-70b")
    shipped = api.estimate(model, "dgx-h100", 64, **LLAMA)
    physical = api.estimate(model, "dgx-h100", 64, physical=True, **LLAMA)
    assert shipped.step_time_s > physical.step_time_s * 1.05
    physical_h100 = load_cluster("dgx-h100", efficiency=PHYSICAL)       # the same fraction as tensor_sustained
    value = load_cluster("dgx-h100").accelerator.sustained("bf16", "dense")
    acc = physical_h100.accelerator
    fitted = dc.replace(physical_h100, accelerator=dc.replace(acc, tensor_sustained={d: value for d in acc.peak_flops}))
    assert api.estimate(model, fitted, 64, **LLAMA).step_time_s == pytest.approx(shipped.step_time_s, rel=1e-9)


def test_a_moe_model_runs_at_its_own_family():
    gb200 = load_cluster("gb200-nvl72").accelerator
    assert gb200.sustained("fp8", "MoE") != gb200.sustained("fp8", "dense")
    assert gb200.sustained("fp8") == gb200.physical_sustained("fp8")      # no kind: the physical reading


def test_what_if_scaling_keeps_the_efficiency_of_the_measured_family():
    cluster = load_cluster("dgx-h100")
    scaled = apply_overrides(cluster, {"peak_flops": "x2", "hbm_bandwidth": "x2"}, None)
    assert scaled.accelerator.training_efficiency == cluster.accelerator.training_efficiency
    assert scaled.efficiency_setting == cluster.efficiency_setting


def test_fitting_the_sustained_rate_replaces_the_shipped_efficiency():
    cluster = load_cluster("dgx-h100")
    refit = parameters(cluster)["sustained"].put(cluster, 0.9)
    assert refit.accelerator.training_efficiency == {} and refit.accelerator.sustained("bf16", "dense") == 0.9


def test_estimate_and_search_state_the_efficiency_and_its_source(capsys):
    args = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", 64, "--tp", 4, "--pp", 4,
            "--global-batch", 256, "--recompute", "full", "--zero", 1]
    code, out, _ = run_cli(capsys, "estimate", *args)
    assert code == 0 and "Efficiency" in out and "measured on 25 public 16-bit dense runs" in out
    code, out, _ = run_cli(capsys, "estimate", *args, "--physical", "--json")
    eff = json.loads(out)["efficiency"]
    assert code == 0 and eff["status"] == PHYSICAL and eff["value"] == 0.962
    code, out, _ = run_cli(capsys, "search", "--model", "llama3-8b", "--cluster", "dgx-b200", "--devices", 8,
                           "--global-batch", 32, "--tp", 1, "--pp", 1, "--dtype", "bf16", "--micro-batch", 1)
    assert code == 0 and "assumed: the nearest measured family's (NVIDIA B200 180GB fp8 dense" in out


def _copy(tmp_path: Path) -> Path:
    """A copy of the shipped efficiency file with its runs, in tmp_path."""
    shutil.copytree(shipped_path().parent / "validation", tmp_path / "validation")
    path = tmp_path / "eff.yaml"
    shutil.copy(shipped_path(), path)
    return path


def _rewrite(path: Path, change, keep_checksum: bool = False) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    if not keep_checksum:
        data["checksum"] = checksum(data)
    path.write_text(yaml.safe_dump(data))


def test_a_copy_of_the_shipped_file_with_its_runs_is_accepted(tmp_path):
    assert read_table(_copy(tmp_path)) == shipped_table()


@pytest.mark.parametrize("change, needles", [
    (lambda d: d["families"][0].update(efficiency=1.5), ["families[0].efficiency", "(0, 1]"]),
    (lambda d: d["families"][0].update(efficiency=0), ["families[0].efficiency", "(0, 1]"]),
    (lambda d: d["runs_files"][1].update(file="validation/none.csv"), ["runs_files[1]", "missing"]),
    (lambda d: d["runs_files"][0].update(sha256="0" * 64), ["runs_files[0]", "differs"]),
    (lambda d: d.pop("runs_files"), ["runs_files", "must list"]),
])
def test_a_bad_efficiency_file_is_refused_with_one_line(tmp_path, capsys, change, needles):
    path = _copy(tmp_path)
    _rewrite(path, change)
    with pytest.raises(InputError) as err:
        read_table(path)
    for needle in needles:
        assert needle in str(err.value)
    cluster = yaml.safe_load((Path(__file__).parents[1] / "src/comet_dse/presets/clusters/dgx-h100.yaml")
                             .read_text())
    cluster["training_efficiency"] = str(path)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    one_line_error(run_cli(capsys, "estimate", "--model", "llama3-8b", "--cluster", tmp_path / "c.yaml",
                           "--devices", 8, "--global-batch", 8), *needles)


def test_an_efficiency_edited_by_hand_is_refused(tmp_path):
    path = _copy(tmp_path)
    _rewrite(path, lambda d: d["families"][0].update(efficiency=0.99), keep_checksum=True)
    with pytest.raises(InputError, match="edited after its fit"):
        read_table(path)


def test_a_bad_setting_names_the_field(tmp_path, capsys):
    cluster = yaml.safe_load((Path(__file__).parents[1] / "src/comet_dse/presets/clusters/dgx-h100.yaml")
                             .read_text())
    for setting in (0.8, "nonexistent.yaml"):
        cluster["training_efficiency"] = setting
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
        one_line_error(run_cli(capsys, "estimate", "--model", "llama3-8b", "--cluster", tmp_path / "c.yaml",
                               "--devices", 8, "--global-batch", 8), "training_efficiency")


def test_a_family_fitted_at_the_physical_reading_keeps_it_and_lends_nothing():
    """TPU7x's MoE runs read slower than measured even at the physical reading (the fit reaches its bound): the
    MoE families keep the physical reading instead of taking the dense family's lower value, which would read
    them slower still; the dense families, fitted below it, are measured."""
    tpu7 = load_cluster("tpu-v7").accelerator.training_efficiency
    assert ("16-bit", "MoE") not in tpu7 and ("fp8", "MoE") not in tpu7
    assert tpu7["16-bit", "dense"].status == MEASURED and tpu7["16-bit", "dense"].value < 1.0
    fams = {(f["accelerator"], f["precision"], f["kind"]): f for f in shipped_table()}
    moe = fams["Google TPU7x", "fp8", "MoE"]
    assert moe["at_physical"] and not moe["applies"] and moe["error_physical"]["mean_error"] > 0


def test_a_dense_family_takes_a_same_generation_siblings_dense_value_before_its_own_moe_one():
    """The B300's only fitted family is MoE (0.568); its dense families take the B200's fp8 dense (the same
    Blackwell tensor rates), assumed, instead of lending the MoE value to dense layers; its MoE families keep
    their own. The GB300, whose fits reached the physical reading or do not apply, takes nothing."""
    b300 = load_cluster("dgx-b300").accelerator.training_efficiency
    b200 = load_cluster("dgx-b200").accelerator.training_efficiency
    for precision in ("16-bit", "fp8"):
        assert b300[precision, "dense"].status == ASSUMED
        assert b300[precision, "dense"].family["accelerator"] == "NVIDIA B200 180GB"
        assert b300[precision, "dense"].value == b200["fp8", "dense"].value
    assert b300["fp8", "MoE"].status == MEASURED and b300["fp8", "MoE"].family["accelerator"] == "NVIDIA B300 270GB"
    assert load_cluster("gb300-nvl72").accelerator.training_efficiency == {}
