"""The error band every estimate reports (answers/errorband.py): the packaged bands are the validation's, a band is
the range of the signed errors of the runs of the same family (accelerator, precision, dense or MoE) with at
least MIN_RUNS runs, and a family fewer back is "not validated", with an assumed band: the nearest validated
family's widened by the margins the held-out families show."""
import pytest

from comet_dse import estimate as api_estimate
from comet_dse.answers.errorband import (
    MIN_RUNS, assumption_margins, band_for, bands_csv, bands_of, current_bands, packaged_bands,
)
from comet_dse.answers.validation import Comparison


def test_packaged_bands_are_the_current_validation():
    """If this fails the model changed: python -m comet_dse.answers.errorband > src/comet_dse/data/error_bands.csv"""
    current = current_bands()
    packaged = packaged_bands()
    assert [(b["hardware"], b["precision"], b["kind"], b["runs"], b["frameworks"]) for b in current] == \
        [(b["hardware"], b["precision"], b["kind"], b["runs"], b["frameworks"]) for b in packaged]
    for now, shipped in zip(current, packaged):
        for key in ("low", "high", "mean_abs_error", "mean_error"):
            assert now[key] == pytest.approx(shipped[key], abs=2e-6), (now["hardware"], now["precision"], key)


def _runs(errors: list, hardware="X", dtype="fp8", kind="dense") -> list:
    return [Comparison("d", f"r{i}", 1.0 + e, 1.0, fits=True, hardware=hardware, framework="F", dtype=dtype, kind=kind)
            for i, e in enumerate(errors)]


def test_a_band_is_the_range_of_the_signed_errors_of_whole_runs():
    runs = (_runs([-0.1, 0.05, -0.01])
            + [Comparison("d", "c", 0.5, 1.0, fits=None, hardware="X", framework="G", dtype="fp8")]    # a layer: out
            + _runs([0.2, 0.1, 0.15], dtype="bf16"))                                                      # another class
    bands = bands_of(runs)
    fp8 = next(b for b in bands if b["precision"] == "fp8")
    assert (fp8["runs"], fp8["low"], fp8["high"], fp8["frameworks"]) == (3, pytest.approx(-0.1), pytest.approx(0.05),
                                                                         "F")
    assert fp8["mean_abs_error"] == pytest.approx(0.16 / 3) and fp8["mean_error"] == pytest.approx(-0.02)
    band = band_for("X", "fp8", bands)
    assert band["validated"] and not band["assumed"] and band["text"].startswith("validated -10 % .. +5 %")
    assert band_for("X", "fp16", bands)["low"] == pytest.approx(0.1)        # bf16 and fp16 are one class
    assert "precision" in bands_csv(bands).splitlines()[0]


def test_a_family_of_fewer_runs_than_a_band_needs_is_assumed_from_the_nearest():
    """Two runs of a family are a point, not a band (MIN_RUNS 3): the estimate takes the nearest family of enough
    runs, widened, and says how many of its own there were."""
    bands = bands_of(_runs([-0.3, -0.3]) + _runs([-0.1, 0.0, 0.05], dtype="bf16"))
    band = band_for("X", "fp8", bands)
    assert not band["validated"] and band["assumed"] and band["runs"] == 2
    assert band["nearest"]["precision"] == "16-bit" and "2 published fp8 dense runs" in band["text"]
    assert band["low"] <= band["nearest"]["low"] and band["high"] >= band["nearest"]["high"]
    assert MIN_RUNS == 3


def test_the_assumption_margins_are_what_held_out_families_fell_outside_their_nearest():
    """Held out, family A (-30 % .. 0 %) takes B's band (-10 % .. +5 %) from the rule: 20 points below; B takes A's:
    5 points above. The margins are the largest of each side."""
    bands = bands_of(_runs([-0.3, -0.2, 0.0], hardware="A") + _runs([-0.1, 0.0, 0.05], hardware="B"))
    low, high = assumption_margins(bands)
    assert low == pytest.approx(0.2) and high == pytest.approx(0.05)
    pooled = band_for("C", "fp8", bands)                      # no band of C: the span of every dense band, widened
    assert pooled["assumed"] and pooled["low"] == pytest.approx(-0.5) and pooled["high"] == pytest.approx(0.1)


def test_hardware_no_run_backs_is_not_validated_and_its_band_is_assumed():
    band = band_for("AMD Instinct MI300X", "bf16")
    assert not band["validated"] and band["assumed"] and band["text"].startswith("not validated")
    assert band["low"] < 0 < band["high"] and "assumed" in band["text"]
    assert not band_for("NVIDIA A100 SXM4 80GB", "fp8")["validated"]      # no fp8 run on an A100


def test_estimates_carry_their_band():
    est = api_estimate("gpt3-175b", "dgx-h100", 64, tp=8, pp=8, global_batch=64, dtype="fp8")
    assert est.error_band["validated"] and est.error_band["precision"] == "fp8"
    assert est.to_dict()["error_band"]["text"].startswith("validated")
    assert not api_estimate("llama3-8b", "mi300x", 8, global_batch=8).to_dict()["error_band"]["validated"]


def test_a_changed_resource_marks_the_band_extrapolated():
    """A preset as shipped (or at another efficiency reading) is what its runs ran on; a resource changed beyond it
    (--set, a what-if, the explorer's controls) is not."""
    plain = api_estimate("llama3-8b", "dgx-h100", 8, global_batch=64)
    assert plain.error_band["validated"] and not plain.error_band["extrapolated"]
    changed = api_estimate("llama3-8b", "dgx-h100", 8, global_batch=64, overrides={"hbm_bandwidth": "x2"})
    assert changed.error_band["extrapolated"] and "extrapolated: hbm" in changed.error_band["text"]
    priced = api_estimate("llama3-8b", "dgx-h100", 8, global_batch=64, overrides={"rent": "3 USD/h"})
    assert not priced.error_band["extrapolated"]                       # a price is not performance


def test_a_family_is_accelerator_precision_and_kind_of_model():
    runs = _runs([-0.1, -0.05, 0.0]) + _runs([-0.5, -0.4, -0.45], kind="MoE")
    bands = bands_of(runs)
    assert [(b["kind"], b["low"]) for b in bands] == [("MoE", pytest.approx(-0.5)), ("dense", pytest.approx(-0.1))]
    assert band_for("X", "fp8", bands, kind="MoE")["low"] == pytest.approx(-0.5)
    # a family none backs: not validated, the nearest (same accelerator and precision, other kind) assumed
    only_dense = bands_of(runs[:3])
    moe = band_for("X", "fp8", only_dense, kind="MoE")
    assert not moe["validated"] and moe["assumed"] and moe["nearest"]["kind"] == "dense"
    # then the same kind in the other precision
    assert band_for("X", "bf16", only_dense)["nearest"]["precision"] == "fp8"


def test_a_moe_estimate_is_banded_by_moe_runs_only():
    est = api_estimate("mixtral-8x7b", "dgx-a100-80gb", 64, tp=8, ep=8, global_batch=64)
    band = est.error_band
    assert band["kind"] == "MoE" and not band["validated"]         # no MoE run on an A100 is published here
    assert band["nearest"]["kind"] == "dense"
