"""The error band every estimate reports (answers/errorband.py): the packaged bands are the validation's, a band is
the range of the signed errors of the runs of the same family (accelerator, precision, dense or MoE), and a
family no published run backs is "not validated", with the nearest validated family shown as an assumption."""
import pytest

from comet_dse import estimate as api_estimate
from comet_dse.answers.errorband import band_for, bands_csv, bands_of, current_bands, packaged_bands
from comet_dse.answers.validation import Comparison


def test_packaged_bands_are_the_current_validation():
    """If this fails the model changed: python -m comet_dse.answers.errorband > src/comet_dse/data/error_bands.csv"""
    current = current_bands()
    packaged = packaged_bands()
    assert [(b["hardware"], b["precision"], b["kind"], b["runs"], b["frameworks"]) for b in current] == \
        [(b["hardware"], b["precision"], b["kind"], b["runs"], b["frameworks"]) for b in packaged]
    for now, shipped in zip(current, packaged):
        for key in ("low", "high", "mean_abs_error"):
            assert now[key] == pytest.approx(shipped[key], abs=2e-6), (now["hardware"], now["precision"], key)


def test_a_band_is_the_range_of_the_signed_errors_of_whole_runs():
    runs = [Comparison("d", "a", 0.9, 1.0, fits=True, hardware="X", framework="F", dtype="fp8"),     # -10 %
            Comparison("d", "b", 1.05, 1.0, fits=True, hardware="X", framework="G", dtype="fp8"),    # +5 %
            Comparison("d", "c", 0.5, 1.0, fits=None, hardware="X", framework="F", dtype="fp8"),     # a layer: left out
            Comparison("d", "e", 1.2, 1.0, fits=True, hardware="X", framework="F", dtype="bf16")]    # another class
    bands = bands_of(runs)
    fp8 = next(b for b in bands if b["precision"] == "fp8")
    assert (fp8["runs"], fp8["low"], fp8["high"], fp8["frameworks"]) == (2, pytest.approx(-0.1), pytest.approx(0.05),
                                                                         "F; G")
    assert fp8["mean_abs_error"] == pytest.approx(0.075)
    band = band_for("X", "fp8", bands)
    assert band["validated"] and band["text"].startswith("validated -10 % .. +5 %")
    assert band_for("X", "fp16", bands)["low"] == pytest.approx(0.2)        # bf16 and fp16 are one class
    assert "precision" in bands_csv(bands).splitlines()[0]


def test_hardware_no_run_backs_is_not_validated():
    band = band_for("AMD Instinct MI300X", "bf16")
    assert not band["validated"] and band["low"] is None and band["text"].startswith("not validated")
    assert not band_for("NVIDIA A100 SXM4 80GB", "fp8")["validated"]      # no fp8 run on an A100


def test_estimates_carry_their_band():
    est = api_estimate("gpt3-175b", "dgx-h100", 64, tp=8, pp=8, global_batch=64, dtype="fp8")
    assert est.error_band["validated"] and est.error_band["precision"] == "fp8"
    assert est.to_dict()["error_band"]["text"].startswith("validated")
    assert not api_estimate("llama3-8b", "mi300x", 8, global_batch=8).to_dict()["error_band"]["validated"]


def test_a_family_is_accelerator_precision_and_kind_of_model():
    runs = [Comparison("d", "a", 0.9, 1.0, fits=True, hardware="X", framework="F", dtype="fp8"),            # dense
            Comparison("d", "b", 0.5, 1.0, fits=True, hardware="X", framework="F", dtype="fp8", kind="MoE")]
    bands = bands_of(runs)
    assert [(b["kind"], b["low"]) for b in bands] == [("MoE", pytest.approx(-0.5)), ("dense", pytest.approx(-0.1))]
    assert band_for("X", "fp8", bands, kind="MoE")["low"] == pytest.approx(-0.5)
    # a family none backs: not validated, the nearest (same accelerator and precision, other kind) as an assumption
    only_dense = bands_of(runs[:1])
    moe = band_for("X", "fp8", only_dense, kind="MoE")
    assert not moe["validated"] and moe["low"] is None
    assert moe["nearest"]["kind"] == "dense" and "assumed like the nearest validated family, -10 %" in moe["text"]
    # then the same kind in the other precision, then nothing
    assert band_for("X", "bf16", only_dense)["nearest"]["precision"] == "fp8"
    assert band_for("Y", "fp8", only_dense)["nearest"] is None


def test_a_moe_estimate_is_banded_by_moe_runs_only():
    est = api_estimate("mixtral-8x7b", "dgx-a100-80gb", 64, tp=8, ep=8, global_batch=64)
    band = est.error_band
    assert band["kind"] == "MoE" and not band["validated"]         # no MoE run on an A100 is published here
    assert band["nearest"]["kind"] == "dense"
