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

A family needs MIN_RUNS runs for a band of its own. Where none backs the estimate, the band is an
assumption, marked so: the nearest family's (of at least MIN_RUNS runs: the same accelerator and precision
with the other kind of model, then the same accelerator and kind in the other precision, then the same
accelerator; for an accelerator without any, the span of every family of the same kind) widened on each
side by ``assumption_margins``: the most a family's own errors fell outside that rule's band when the
family itself was held out. ``extrapolated`` marks a band of a cluster whose resources were changed beyond
its preset (``--set``, ``whatif``, the explorer's controls, a study's axes).

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
LOWEST = -0.9    # the lowest an assumed band reaches (band_for)
POOLED = "every validated accelerator"   # the nearest "family" of an accelerator without any: all of one kind
MIN_RUNS = 3     # runs a family needs for a band of its own: one run's error is a point, not a range; the fitted
                 # efficiencies take the same count (answers/efficiency_fit.py)
COLUMNS = ("hardware", "precision", "kind", "runs", "low", "high", "mean_abs_error", "mean_error", "frameworks")


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
                    "mean_error": s["mean_error"],
                    "frameworks": "; ".join(sorted({c.framework for c in comps}))})
    return out


def bands_csv(bands: list) -> str:
    """The bands as the text of error_bands.csv (errors as fractions, 6 decimals)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COLUMNS)
    for b in bands:
        writer.writerow([b["hardware"], b["precision"], b["kind"], b["runs"], f"{b['low']:.6f}", f"{b['high']:.6f}",
                         f"{b['mean_abs_error']:.6f}", f"{b['mean_error']:.6f}", b["frameworks"]])
    return text.getvalue()


@lru_cache(maxsize=1)
def packaged_bands() -> tuple:
    """The bands shipped with the package (data/error_bands.csv)."""
    path = resources.files("comet_dse").joinpath("data", BANDS_FILE)
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    return tuple({"hardware": r["hardware"], "precision": r["precision"], "kind": r["kind"], "runs": int(r["runs"]),
                  "low": float(r["low"]), "high": float(r["high"]),
                  "mean_abs_error": float(r["mean_abs_error"]), "mean_error": float(r["mean_error"]),
                  "frameworks": r["frameworks"]} for r in rows)


def _nearest(bands, accelerator: str, precision: str, kind: str):
    """The validated band nearest to a family none backs, among ``bands``: same accelerator and precision with
    the other kind, then same accelerator and kind in the other precision, then any band of the accelerator;
    for an accelerator with none, the span (lowest low, highest high) of every band of the same kind (else of
    every band); None when ``bands`` is empty."""
    same = [b for b in bands if b["hardware"] == accelerator]
    for test in (lambda b: b["precision"] == precision, lambda b: b["kind"] == kind, lambda b: True):
        found = [b for b in same if test(b)]
        if found:
            return max(found, key=lambda b: b["runs"])
    pool = [b for b in bands if b.get("kind", "dense") == kind] or list(bands)
    if not pool:
        return None
    return {"hardware": POOLED, "precision": precision, "kind": pool[0].get("kind", "dense"),
            "runs": sum(b["runs"] for b in pool), "low": min(b["low"] for b in pool),
            "high": max(b["high"] for b in pool), "mean_abs_error": None,
            "mean_error": sum(b["mean_error"] * b["runs"] for b in pool) / sum(b["runs"] for b in pool),
            "frameworks": "the span of their bands"}


def _eligible(bands) -> list:
    return [b for b in bands if b["runs"] >= MIN_RUNS]


def assumption_margins(bands) -> tuple:
    """(low, high): how far beyond the nearest family's band an assumed band reaches on each side: over every
    family of at least MIN_RUNS runs, held out, the most its lowest error fell below, and its highest rose
    above, the band ``_nearest`` gives it from the others (0 where it stayed inside). The largest, so that an
    assumption never flatters more than the validation has shown the rule to."""
    eligible = _eligible(bands)
    low = high = 0.0
    for f in eligible:
        near = _nearest([b for b in eligible if b is not f], f["hardware"], f["precision"], f.get("kind", "dense"))
        if near is not None:
            low, high = max(low, near["low"] - f["low"]), max(high, f["high"] - near["high"])
    return low, high


def band_for(accelerator: str, dtype: str, bands=None, kind: str = "dense") -> dict:
    """The error band of an estimate on ``accelerator`` (its name, Accelerator.name) in ``dtype`` for a ``kind``
    ("dense", "MoE" or "recommendation") model: {validated, assumed, hardware, precision, kind, runs, low, high,
    mean_abs_error, frameworks, text, nearest}. ``validated`` where at least MIN_RUNS published runs of that
    family back it; otherwise ``assumed``: low and high are the nearest family's (``nearest``) widened by
    ``assumption_margins``, and ``runs`` the family's own (too few, or none). ``bands``: default the
    packaged ones."""
    precision = precision_class(dtype)
    bands = tuple(bands) if bands is not None else packaged_bands()
    own = next((b for b in bands if b["hardware"] == accelerator and b["precision"] == precision
                and b.get("kind", "dense") == kind), None)
    if own is not None and own["runs"] >= MIN_RUNS:
        return {"validated": True, "assumed": False, **own, "text": band_text(own), "nearest": None}
    nearest = _nearest(_eligible(bands), accelerator, precision, kind)
    few = own["runs"] if own else 0
    text = (f"not validated: {few} published {precision} {kind} run{'s' if few != 1 else ''} on {accelerator} "
            f"(a band needs {MIN_RUNS})" if few else
            f"not validated: no published {precision} {kind} run on {accelerator} backs this estimate")
    if nearest is None:
        return {"validated": False, "assumed": False, "hardware": accelerator, "precision": precision, "kind": kind,
                "runs": few, "low": None, "high": None, "mean_abs_error": None, "frameworks": "", "text": text,
                "nearest": None}
    wide_low, wide_high = assumption_margins(bands)
    # a figure's slow end is x / (1 + low): a low of -100 % would be a run that never ends, so the widened low
    # stops at -90 % (a run ten times slower than predicted), beyond any error the validation has seen
    low, high = max(nearest["low"] - wide_low, LOWEST), nearest["high"] + wide_high
    which = (f"the span of every validated {nearest['kind']} family's band ({nearest['runs']} runs)"
             if nearest["hardware"] == POOLED else
             f"the nearest validated family's band ({nearest['runs']} {nearest['hardware']} {nearest['precision']} "
             f"{nearest['kind']} runs)")
    text += (f"; assumed {low * 100:+.0f} % .. {high * 100:+.0f} %: {which}, {nearest['low'] * 100:+.0f} % .. "
             f"{nearest['high'] * 100:+.0f} %, widened by the most a held-out family fell outside its nearest one "
             f"({wide_low * 100:.0f} points below, {wide_high * 100:.0f} above)")
    return {"validated": False, "assumed": True, "hardware": accelerator, "precision": precision, "kind": kind,
            "runs": few, "low": low, "high": high, "mean_abs_error": None, "mean_error": nearest["mean_error"],
            "frameworks": nearest["frameworks"],
            "text": text, "nearest": nearest}


# What a cluster's performance rests on: the accelerator's fields but its name and the training efficiency (a
# reading of the same hardware, --physical), and the cluster's network and memory reserve. A cluster whose
# values differ from every preset of its accelerator is one the validation's runs do not cover.
_ACCELERATOR_FIELDS = ("peak_flops", "matmul_efficiency", "compute_units", "matmul_tile", "matmul_pipeline_overhead",
                       "sram", "hbm", "expansion", "host", "vector_flops", "kernel_overhead", "attention_efficiency",
                       "matmul_efficiency_by_dtype", "comm_units", "tensor_sustained")
_CLUSTER_FIELDS = ("network", "reserved_memory", "fragmentation", "workspace_memory", "step_overhead",
                   "microbatch_overhead")


@lru_cache(maxsize=1)
def _presets_by_accelerator() -> dict:
    """Accelerator name -> the cluster presets built on it (as shipped)."""
    from comet_dse.presets.catalog import load_cluster, preset_names

    out = {}
    for name in preset_names("clusters"):
        cluster = load_cluster(name)
        out.setdefault(cluster.accelerator.name, []).append(cluster)
    return out


def departures(cluster) -> list:
    """The performance fields (``_ACCELERATOR_FIELDS``, ``_CLUSTER_FIELDS``) in which ``cluster`` differs from
    the closest preset of its accelerator (the fewest differences): [] for a preset as shipped, and where no
    preset has this accelerator (no validated family's runs ran on it to depart from)."""
    diffs = [[f for f in _ACCELERATOR_FIELDS if getattr(cluster.accelerator, f) != getattr(preset.accelerator, f)]
             + [f for f in _CLUSTER_FIELDS if getattr(cluster, f) != getattr(preset, f)]
             for preset in _presets_by_accelerator().get(cluster.accelerator.name, [])]
    return min(diffs, key=len, default=[])


def extrapolated(band: dict, cluster) -> dict:
    """``band`` marked ``extrapolated`` (with the fields named in its text) where ``cluster`` departs from
    every preset of its accelerator (``departures``): a band holds for the hardware its runs ran on."""
    if band.get("low") is None:
        return {**band, "extrapolated": False}
    changed = departures(cluster)
    if not changed:
        return {**band, "extrapolated": False}
    return {**band, "extrapolated": True,
            "text": band["text"] + f"; extrapolated: {', '.join(changed)} changed from the preset its runs ran on"}


def band_of_cluster(cluster, dtype: str, moe: bool = False, kind: str | None = None) -> dict:
    """The error band of an estimate on ``cluster`` in ``dtype`` of a dense (``moe`` False) or mixture-of-experts
    model, or of the ``kind`` of model given (a model spec's ``kind``: "recommendation"): for a calibrated cluster (``comet-dse calibrate``: its ``calibration`` block) the fit's own
    cross-validated error on the runs it was fitted to (not validated, saying why, when the file no longer
    matches its calibration: hardware/load.py calibration_mismatch), for a preset the validation's
    (``band_for``)."""
    kind = kind or kind_of(moe)
    cal = cluster.calibration
    if not cal:
        return extrapolated(band_for(cluster.accelerator.name, dtype, kind=kind), cluster)
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
            "mean_error": 0.0 if worst is not None else None,   # a fit is taken as unbiased: its mean is not kept
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
