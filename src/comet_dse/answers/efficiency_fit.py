"""Fit the training efficiency of each family of today's GPUs on the published runs, and write the
efficiency file the presets ship (data/training_efficiency.yaml; hardware/efficiency.py says what it is).

    python -m comet_dse.answers.efficiency_fit            # fit, print the table, compare with the shipped file
    python -m comet_dse.answers.efficiency_fit --write    # ... and write it (src/comet_dse/data/...)
    python -m comet_dse.answers.efficiency_fit --data DIR --out FILE   # your own runs, your own file

The runs: every whole run of h100_public.csv and gpu_public.csv (the validation's runs on H100, H200,
B200 and GB200; docs/validation.md), each with the settings its source states, grouped into families by
the accelerator of its cluster preset, its precision class (16-bit or fp8) and its kind of model (dense or
MoE). Each family with at least MIN_RUNS runs gets one value of ``tensor_sustained`` (calibrate's
``sustained`` parameter, bounds 0.3-1.0), fitted by least squares on the relative step-time errors at the
*physical* reading of its preset, and cross-validated the way ``comet-dse calibrate`` does (leave-one-out up
to 30 runs, 10-fold past that). A family's value applies only where the runs it did not see read closer
with it than at the physical reading (``applies``); otherwise it takes the nearest family's, as a family
without runs does. The A100 runs (Megatron-LM 2021-22) are not used: the physical reading
predicts them within 2-8 %, and they stay the check that it does.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import yaml

from comet_dse.answers.calibrate import Run, cross_validate, cross_validation, fit
from comet_dse.base.stats import error_stats
from comet_dse.base.written import sha256_hex
from comet_dse.hardware.efficiency import PHYSICAL, SHIPPED_FILE, checksum, kind_of, precision_class

MIN_RUNS = 3                # a family needs this many runs for a fitted efficiency (else: nearest, assumed)
PARAMETER = "sustained"     # calibrate's parameter: tensor_sustained for every dtype
DECIMALS = 4                # the efficiency as written (the fit's 1-sigma is about 0.01)
RUNS_FILES = ("h100_public.csv", "gpu_public.csv", "accelerators_public.csv")
HEADER = "# Written by python -m comet_dse.answers.efficiency_fit; do not edit: its checksum would not match.\n"


def today_runs(directory: Path) -> list:
    """Every whole run of RUNS_FILES in ``directory`` that the model can run as written
    (validation.PublishedRun: the runs ``comet-dse validate`` compares), with its stated settings."""
    from comet_dse.answers.validation import OTHERS, comparisons_of, gpu_runs, h100_runs
    from comet_dse.presets.catalog import load_cluster

    clusters = {}

    def physical(name: str):
        if name not in clusters:
            clusters[name] = load_cluster(name, efficiency=PHYSICAL)
        return clusters[name]

    runs = h100_runs(directory, physical("dgx-h100")) + gpu_runs(directory) + gpu_runs(directory, OTHERS)
    kept = {(c.dataset, c.label) for c in comparisons_of(runs, physical)}
    return [r for r in runs if (r.dataset, r.label) in kept]


def family_key(run, accelerator: str) -> tuple:
    """(accelerator, precision class, kind of model) of a PublishedRun on ``accelerator``."""
    return accelerator, precision_class(run.strategy.dtype.value), kind_of(run.model.moe)


def families_of(runs: list) -> dict:
    """(accelerator, precision, kind) -> (cluster preset, [PublishedRun]); one preset per family."""
    from comet_dse.presets.catalog import load_cluster

    names = {r.cluster: load_cluster(r.cluster, efficiency=PHYSICAL).accelerator.name for r in runs}
    out = {}
    for r in runs:
        key = family_key(r, names[r.cluster])
        preset, members = out.setdefault(key, (r.cluster, []))
        if preset != r.cluster:
            raise ValueError(f"family {key} spans presets {preset} and {r.cluster}")
        members.append(r)
    return out


def fit_family(preset: str, members: list, progress: bool = False, cross_validated: bool = True) -> dict:
    """One family's entry of the efficiency file: the fitted value, its 1-sigma, and the step-time errors at
    the physical reading, at the fit and (``cross_validated``) cross-validated, with whether it applies."""
    from comet_dse.presets.catalog import load_cluster

    cluster = load_cluster(preset, efficiency=PHYSICAL)
    runs = [Run(m.label, m.model, m.devices, m.strategy, "iter_s", m.measured) for m in members]
    result = fit(runs, cluster, [PARAMETER])
    accelerator, precision, kind = family_key(members[0], cluster.accelerator.name)
    entry = {"accelerator": accelerator, "preset": preset, "precision": precision, "kind": kind,
             "efficiency": round(float(result.values[0]), DECIMALS), "runs": len(runs)}
    if not cross_validated:
        return entry
    held = cross_validate(runs, cluster, [PARAMETER], result, progress=progress)
    physical = round(cluster.accelerator.physical_sustained("bf16"), DECIMALS)
    return entry | {
        "sigma": round(float(result.sigma[0]), DECIMALS) if np.isfinite(result.sigma[0]) else None,
        "physical": physical,
        "frameworks": "; ".join(sorted({m.framework for m in members})),
        "error_physical": _stats(result.before), "error_fitted": _stats(result.after),
        "cross_validation": cross_validation(len(runs))[1], "error_cross_validated": _stats(held),
        "run_ids": [m.label for m in members],
    } | _applies(result.before, held, entry["efficiency"] >= physical)


def _applies(physical, held, at_physical: bool = False) -> dict:
    """{applies, why}: a fitted value is shipped only where runs it did not see read closer with it than at
    the physical reading (cross-validated mean |error| below the physical one); else the family takes the
    nearest family's, as one without runs does. A fit at or above the physical reading (``at_physical``: the
    runs are faster than the model at the burn-test rate, so the tensor rate is not what the model has too
    slow) is not shipped either, and the family keeps the physical reading (hardware/efficiency.py: resolve)."""
    if at_physical:
        return {"applies": False, "at_physical": True,
                "why": "fitted at or above the physical reading: the runs are faster than the model even at the "
                       "burn-test rate, so no efficiency below it explains them; the family keeps the physical "
                       "reading"}
    physical, held = float(np.mean(np.abs(physical))), float(np.mean(np.abs(held)))
    if held < physical:
        return {"applies": True}
    return {"applies": False, "why": f"cross-validated mean |error| {held * 100:.1f} % is not below the physical "
                                     f"reading's {physical * 100:.1f} %: the runs do not agree on one value"}


def refit_values(directory: Path) -> list:
    """Each family's fitted efficiency on the runs in ``directory``, without the cross-validation (what a
    test compares with the shipped file): [{accelerator, preset, precision, kind, efficiency, runs}]."""
    return [fit_family(preset, members, cross_validated=False)
            for preset, members in (v for _, v in sorted(families_of(today_runs(directory)).items()))
            if len(members) >= MIN_RUNS]


def _stats(errors) -> dict:
    s = error_stats(float(e) for e in errors)
    return {k: round(s[k], 6) for k in ("mean_abs_error", "max_abs_error", "mean_error", "low", "high")}


def fitted_table(directory: Path, folder: Path, progress: bool = False) -> dict:
    """The content of an efficiency file fitted on the runs in ``directory``, to be written in ``folder`` (its
    runs files are named relative to it; its checksum included)."""
    families = families_of(today_runs(directory))
    entries, skipped = [], []
    for key, (preset, members) in sorted(families.items()):
        if len(members) < MIN_RUNS:
            skipped.append({"accelerator": key[0], "precision": key[1], "kind": key[2], "runs": len(members)})
            continue
        if progress:
            print(f"fitting {key[0]} {key[1]} {key[2]} ({len(members)} runs)", file=sys.stderr)
        entries.append(fit_family(preset, members, progress))
    data = {
        "what": "tensor_sustained fitted per family on published training runs (hardware/efficiency.py)",
        "fitted_by": "python -m comet_dse.answers.efficiency_fit",
        "min_runs": MIN_RUNS,
        "runs_files": [{"file": Path(os.path.relpath(directory.resolve() / name, folder.resolve())).as_posix(),
                        "sha256": sha256_hex(directory / name)} for name in RUNS_FILES],
        "families": entries,
        "too_few_runs": skipped,
    }
    data["checksum"] = checksum(data)
    return data


def differences(shipped: tuple, refit: list, tolerance: float = 5e-4) -> list:
    """Lines naming every family whose shipped efficiency differs from the refit by more than
    ``tolerance``, or is in one and not the other."""
    key = lambda f: (f["accelerator"], f["precision"], f["kind"])    # noqa: E731
    old, new = {key(f): f for f in shipped}, {key(f): f for f in refit}
    out = []
    for k in sorted(set(old) | set(new)):
        if k not in new or k not in old:
            out.append(f"{' '.join(k)}: {'shipped but not refitted' if k not in new else 'refitted but not shipped'}")
        elif abs(old[k]["efficiency"] - new[k]["efficiency"]) > tolerance or old[k]["runs"] != new[k]["runs"]:
            out.append(f"{' '.join(k)}: shipped {old[k]['efficiency']} on {old[k]['runs']} runs, "
                       f"refit {new[k]['efficiency']} on {new[k]['runs']} runs")
    return out


def _shipped_or_none() -> tuple:
    """The shipped families, or () when the shipped file is missing or refused (its message printed)."""
    from comet_dse.base.errors import InputError
    from comet_dse.hardware.efficiency import shipped_table

    try:
        return shipped_table()
    except InputError as exc:
        print(f"the shipped efficiency file is refused: {exc}", file=sys.stderr)
        return ()


def table_markdown(families: list) -> str:
    """The families as a markdown table (docs/validation.md)."""
    lines = ["| accelerator | precision | kind | runs | physical | efficiency | physical reading | fitted "
             "| cross-validated |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in families:
        p, a, c = f["error_physical"], f["error_fitted"], f["error_cross_validated"]
        lines.append(f"| {f['accelerator']} | {f['precision']} | {f['kind']} | {f['runs']} | {f['physical']:.3f} "
                     f"| {f['efficiency']:.3f} +/- {f['sigma'] or 0:.3f} | {_cell(p)} | {_cell(a)} | {_cell(c)} |")
    return "\n".join(lines)


def _cell(s: dict) -> str:
    return f"{s['mean_abs_error'] * 100:.1f} % ({s['mean_error'] * 100:+.1f})"


def main(argv=None) -> int:
    from comet_dse.base import written
    from comet_dse.base.errors import InputError
    from comet_dse.hardware.efficiency import shipped_path

    parser = argparse.ArgumentParser(prog="python -m comet_dse.answers.efficiency_fit",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None, help="folder with h100_public.csv and gpu_public.csv "
                        "(default: the packaged validation data, which the shipped file is fitted on)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"write the shipped file (data/{SHIPPED_FILE})")
    group.add_argument("--out", type=Path, default=None, help="write an efficiency file here (never over a file "
                       "comet-dse did not write)")
    args = parser.parse_args(argv)
    shipped_runs = shipped_path().parent / "validation"
    if args.write and args.data is not None:
        parser.error("--write fits the packaged runs; give --out with --data")
    directory = args.data or shipped_runs
    target = shipped_path() if args.write else args.out
    try:
        missing = [name for name in RUNS_FILES if not (directory / name).is_file()]
        if missing:
            raise InputError("--data", f"{directory} has no {', '.join(missing)}")
        data = fitted_table(directory, (target or shipped_path()).parent, progress=True)
        print(table_markdown(data["families"]))
        diff = differences(_shipped_or_none(), data["families"])
        print("\n".join(diff) if diff else "the shipped efficiency matches this refit")
        text = HEADER + yaml.safe_dump(data, sort_keys=False)
        if args.write:
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(target)
        elif target is not None:
            written.write_file(target, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), "--out")
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if target is not None:
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
