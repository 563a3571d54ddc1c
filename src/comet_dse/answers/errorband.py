"""The error to expect from an estimate, from the validation residuals (docs/validation.md, "Error band").

An estimate is as good as the published runs that back it. The band of an estimate is the range of
the signed step-time errors, (predicted - measured) / measured, of the whole published runs of the same
family: the same accelerator, the same precision class (16-bit: fp16 and bf16, which the model costs
alike; or fp8) and the same kind of model (dense or mixture-of-experts): "validated -15 % .. +2 % on 7
NVIDIA H100 SXM5 80GB fp8 dense runs (NeMo + Megatron-Core + Transformer Engine (MLPerf))". Where no
published run backs the family (an MI300X, a TPU, fp8 on an A100, a MoE model on a GPU only dense runs
back), the estimate is "not validated", and the nearest validated family's band is shown beside it as an
assumption, never as the estimate's own: the same accelerator and precision with the other kind of model,
then the same accelerator and kind in the other precision, then the same accelerator.

The residuals are the ones ``comet-dse validate`` prints, kept in the packaged error_bands.csv so that
an estimate does not re-run the validation; tests/validation/test_error_band.py recomputes them and
fails when the file is stale (``python -m comet_dse.answers.errorband`` prints the current file).
"""
from __future__ import annotations

import csv
import io
from functools import lru_cache
from importlib import resources

from comet_dse.base.stats import error_stats
from comet_dse.hardware.efficiency import kind_of, precision_class

BANDS_FILE = "error_bands.csv"
COLUMNS = ("hardware", "precision", "kind", "runs", "low", "high", "mean_abs_error", "frameworks")


def bands_of(comparisons: list) -> list:
    """One band per family (accelerator, precision class, dense or MoE) of the whole runs among
    ``comparisons`` (validation.Comparison): {hardware, precision, kind, runs, low, high, mean_abs_error,
    frameworks}."""
    groups = {}
    for comp in comparisons:
        if comp.fits is None or not comp.hardware:
            continue
        groups.setdefault((comp.hardware, precision_class(comp.dtype), comp.kind), []).append(comp)
    out = []
    for (hardware, precision, kind), comps in sorted(groups.items()):
        s = error_stats(c.error for c in comps)
        out.append({"hardware": hardware, "precision": precision, "kind": kind, "runs": len(comps),
                    "low": s["low"], "high": s["high"], "mean_abs_error": s["mean_abs_error"],
                    "frameworks": "; ".join(sorted({c.framework for c in comps}))})
    return out


def bands_csv(bands: list) -> str:
    """The bands as the text of error_bands.csv (errors as fractions, 6 decimals)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COLUMNS)
    for b in bands:
        writer.writerow([b["hardware"], b["precision"], b["kind"], b["runs"], f"{b['low']:.6f}", f"{b['high']:.6f}",
                         f"{b['mean_abs_error']:.6f}", b["frameworks"]])
    return text.getvalue()


@lru_cache(maxsize=1)
def packaged_bands() -> tuple:
    """The bands shipped with the package (data/error_bands.csv)."""
    path = resources.files("comet_dse").joinpath("data", BANDS_FILE)
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    return tuple({"hardware": r["hardware"], "precision": r["precision"], "kind": r["kind"], "runs": int(r["runs"]),
                  "low": float(r["low"]), "high": float(r["high"]),
                  "mean_abs_error": float(r["mean_abs_error"]), "frameworks": r["frameworks"]} for r in rows)


def _nearest(bands, accelerator: str, precision: str, kind: str):
    """The validated band nearest to a family none backs: same accelerator and precision with the other kind,
    then same accelerator and kind in the other precision, then any band of the accelerator; None."""
    same = [b for b in bands if b["hardware"] == accelerator]
    for test in (lambda b: b["precision"] == precision, lambda b: b["kind"] == kind, lambda b: True):
        found = [b for b in same if test(b)]
        if found:
            return max(found, key=lambda b: b["runs"])
    return None


def band_for(accelerator: str, dtype: str, bands=None, kind: str = "dense") -> dict:
    """The error band of an estimate on ``accelerator`` (its name, Accelerator.name) in ``dtype`` for a ``kind``
    ("dense" or "MoE") model: {validated, hardware, precision, kind, runs, low, high, mean_abs_error, frameworks,
    text, nearest}; ``validated`` False (and the numbers None) where no published run of that family backs
    it, ``nearest`` then the nearest validated family's band (an assumption) or None. ``bands``: default the
    packaged ones."""
    precision = precision_class(dtype)
    bands = bands if bands is not None else packaged_bands()
    for band in bands:
        if band["hardware"] == accelerator and band["precision"] == precision and band.get("kind", "dense") == kind:
            return {"validated": True, **band, "text": band_text(band), "nearest": None}
    nearest = _nearest(bands, accelerator, precision, kind)
    text = f"not validated: no published {precision} {kind} run on {accelerator} backs this estimate"
    if nearest:
        text += (f"; assumed like the nearest validated family, {nearest['low'] * 100:+.0f} % .. "
                 f"{nearest['high'] * 100:+.0f} % on {nearest['runs']} {nearest['precision']} {nearest['kind']} runs")
    return {"validated": False, "hardware": accelerator, "precision": precision, "kind": kind, "runs": 0,
            "low": None, "high": None, "mean_abs_error": None, "frameworks": "", "text": text, "nearest": nearest}


def band_of_cluster(cluster, dtype: str, moe: bool = False, kind: str | None = None) -> dict:
    """The error band of an estimate on ``cluster`` in ``dtype`` of a dense (``moe`` False) or mixture-of-experts
    model, or of the ``kind`` of model given (a model spec's ``kind``: "recommendation"): for a calibrated cluster (``comet-dse calibrate``: its ``calibration`` block) the fit's own
    cross-validated error on the runs it was fitted to (not validated, saying why, when the file no longer
    matches its calibration: hardware/load.py calibration_mismatch), for a preset the validation's
    (``band_for``)."""
    kind = kind or kind_of(moe)
    cal = cluster.calibration
    if not cal:
        return band_for(cluster.accelerator.name, dtype, kind=kind)
    if cal.get("stale"):
        return {"validated": False, "hardware": cluster.accelerator.name, "precision": precision_class(dtype),
                "kind": kind, "nearest": None, "runs": 0, "low": None, "high": None, "mean_abs_error": None,
                "frameworks": "", "text": f"not validated: the calibration no longer matches this cluster "
                                          f"({cal['stale']}); refit it with comet-dse calibrate"}
    held = cal.get("error_cross_validated") or cal.get("error_in_sample") or {}
    held_as = "cross-validated" if cal.get("error_cross_validated") else "in-sample"
    mean, worst = held.get("mean_abs_error"), held.get("max_abs_error")
    text = (f"calibrated to {cal.get('runs')} runs ({cal.get('runs_file')}): {held_as} mean |error| "
            f"{mean * 100:.1f} %, max {worst * 100:.1f} %" if mean is not None and worst is not None
            else f"calibrated to {cal.get('runs')} runs ({cal.get('runs_file')}); no error recorded")
    return {"validated": mean is not None, "hardware": cluster.accelerator.name,
            "precision": precision_class(dtype), "kind": kind, "nearest": None, "runs": cal.get("runs", 0),
            "low": -worst if worst is not None else None, "high": worst, "mean_abs_error": mean,
            "frameworks": f"calibrated to {cal.get('runs_file')}", "text": text}


def band_text(band: dict) -> str:
    """'validated -15 % .. +2 % on 7 NVIDIA H100 SXM5 80GB fp8 runs (NeMo ...)': the signed error range."""
    return (f"validated {band['low'] * 100:+.0f} % .. {band['high'] * 100:+.0f} % (predicted vs measured step "
            f"time) on {band['runs']} {band['hardware']} {band['precision']} {band.get('kind', 'dense')} runs "
            f"({band['frameworks']})")


def current_bands() -> list:
    """The bands of the validation as the model predicts it now (runs ``validation.all_comparisons``)."""
    from comet_dse.answers.validation import all_comparisons
    from comet_dse.presets.catalog import load_cluster

    return bands_of(all_comparisons(load_cluster("dgx-a100-80gb")))


if __name__ == "__main__":      # python -m comet_dse.answers.errorband > src/comet_dse/data/error_bands.csv
    print(bands_csv(current_bands()), end="")
