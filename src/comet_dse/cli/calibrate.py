"""``comet-dse calibrate``: read runs, fit, cross-validate, print, write a calibrated cluster file."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import yaml

from comet_dse.answers.calibrate import (
    Fit, RunSet, calibrated_data, check_runnable, check_support, cross_validate, cross_validation, default_fit,
    error_summary, fit, parameters, read_runs,
)
from comet_dse.base import jsonout, written
from comet_dse.base.errors import InputError
from comet_dse.base.text import printable
from comet_dse.cli.options import name_list
from comet_dse.hardware.spec import Cluster


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="fit a cluster's physical parameters to measured runs (docs/calibration.md)")
    p.add_argument("runs", help="CSV of measured runs (docs/calibration.md)")
    p.add_argument("--cluster", required=True, help="the preset or cluster YAML to start from")
    p.add_argument("--fit", type=name_list, default=None,
                   help="parameters to fit, comma-separated (default: gemm, memory, the outermost network "
                        "dimension's efficiency, microbatch_overhead; see docs/calibration.md)")
    p.add_argument("--holdout", type=name_list, default=None,
                   help="run ids (the `id` column) left out of the fit and reported as held out")
    p.add_argument("--output", default=None, help="write the calibrated cluster YAML here")
    p.add_argument("--no-cv", action="store_true",
                   help="skip the cross-validation (leave-one-out up to 30 runs, 10-fold past that)")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    try:
        import scipy.optimize  # noqa: F401 - only to check it is installed
    except ImportError:
        raise InputError("calibrate", "needs scipy: pip install 'comet-dse[calibrate]'") from None
    inputs = [args.runs] + ([args.cluster] if args.cluster.endswith((".yaml", ".yml")) else [])
    if args.output:          # refused before minutes of fitting, not after
        if not args.output.endswith((".yaml", ".yml")):
            raise InputError("output", f"{args.output} must end in .yaml or .yml (a calibrated cluster file)")
        written.check_file(args.output, "output", inputs)
    cluster, base_data = _base_cluster(args.cluster)
    catalogue = parameters(cluster)
    names = list(args.fit or default_fit(cluster))
    unknown = [n for n in names if n not in catalogue]
    if unknown:
        raise InputError("fit", f"unknown parameter {unknown[0]!r}; parameters of {cluster.name}: {', '.join(catalogue)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InputError("fit", f"names {repeated[0]} twice; give each parameter once")
    runs_path = Path(args.runs)
    runs = read_runs(runs_path)
    over = []
    for run in runs:
        try:
            cluster.dim_sizes(run.devices)
        except InputError as exc:
            raise InputError(f"runs {run.label}: gpus", exc.message) from None
        if not check_runnable(run, cluster):
            over.append(run.label)
    if over:           # kept (they ran), but said: the model's memory verdict is what is off for them
        shown_ids = ", ".join(over[:5]) + (f" and {len(over) - 5} more" if len(over) > 5 else "")
        print(f"comet-dse: note: {len(over)} of {len(runs)} runs do not fit in memory by the model with "
              f"{cluster.name}'s reserve ({printable(shown_ids)}); they ran, so their step times are fitted as "
              "measured", file=sys.stderr)
    train, held = _split(runs, args.holdout)
    check_support(train, names)
    result = fit(train, cluster, names)
    loo = None if args.no_cv else cross_validate(train, cluster, names, result, progress=not args.json)
    params = [catalogue[n] for n in names]
    held_set = RunSet(held, cluster)
    held_before = held_set.errors(params, _preset(cluster, params)[None, :])[:, 0]
    held_after = held_set.errors(params, result.values[None, :])[:, 0]
    holdout = error_summary(held_after) if len(held) else None
    if args.output:
        data = calibrated_data(base_data, cluster, result, runs_path, loo, holdout)
        _write_yaml(data, Path(args.output), inputs)
    if args.json:
        print(jsonout.dumps(_as_json(cluster, train, held, result, loo, held_before, held_after, args.output), indent=2))
        return 0
    print(_as_text(cluster, train, held, result, loo, held_before, held_after, args.output))
    return 0


def _base_cluster(ref: str) -> tuple:
    """(Cluster, its raw mapping) from a preset name or a cluster YAML."""
    from comet_dse.base.loading import read_yaml
    from comet_dse.hardware.load import cluster_from
    from comet_dse.presets.catalog import preset_data

    data = read_yaml(Path(ref), "cluster") if ref.endswith((".yaml", ".yml")) else preset_data("clusters", ref)
    return cluster_from(data, "cluster"), data


def _split(runs: list, holdout) -> tuple:
    if not holdout:
        return runs, []
    labels = {r.label for r in runs}
    missing = [h for h in holdout if h not in labels]
    if missing:
        raise InputError("holdout", f"no run with id {missing[0]!r}; ids: {', '.join(r.label for r in runs)}")
    return [r for r in runs if r.label not in holdout], [r for r in runs if r.label in holdout]


def _preset(cluster: Cluster, params: list) -> np.ndarray:
    return np.clip(np.array([p.get(cluster) for p in params]), [p.low for p in params], [p.high for p in params])


def _write_yaml(data: dict, path: Path, inputs: list) -> None:
    """Check that the text loads back as a cluster (a calibrated file is a normal cluster file), then write it
    complete or not at all, never over a file comet-dse did not write (written.write_file)."""
    from comet_dse.hardware.load import cluster_from

    text = ("# Calibrated by comet-dse calibrate: a separate, labelled file. The values that are not in\n"
            "# `calibration.fitted` are the base preset's; see that preset for their sources.\n"
            + yaml.safe_dump(data, sort_keys=False))
    cluster_from(yaml.safe_load(text), "cluster")
    written.write_file(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), "output", inputs)


def _value_text(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e6:.3g} us" if value < 1e-3 else f"{value * 1e3:.4g} ms"
    return f"{value:.4g}"


def _as_text(cluster, train, held, result: Fit, loo, held_before, held_after, output) -> str:
    from comet_dse.base.text import render_table

    catalogue = parameters(cluster)
    lines = [f"Calibrating {cluster.name} on {len(train)} runs"
             + (f" ({len(held)} held out)" if held else ""), ""]
    rows = []
    for name, value, sigma in zip(result.names, result.values, result.sigma):
        p = catalogue[name]
        left = name in result.unidentifiable
        rows.append([name, _value_text(p.get(cluster), p.unit),
                     "(left at preset)" if left else _value_text(value, p.unit),
                     "-" if left or np.isnan(sigma) else "+/- " + _value_text(sigma, p.unit),
                     f"{result.sensitivity[name]:.2g}", f"[{_value_text(p.low, p.unit)}, {_value_text(p.high, p.unit)}]"])
    lines.append(render_table(["parameter", "preset", "fitted", "1 sigma", "sensitivity", "bounds"], rows, left=(0,)))
    if result.unidentifiable:
        lines += ["", "The runs cannot identify: " + ", ".join(result.unidentifiable)
                  + " (sensitivity below 0.001); they keep the preset's value."]
    rows = []
    for i, run in enumerate(train):
        rows.append([run.label, f"{result.before[i] * 100:+.1f}%", f"{result.after[i] * 100:+.1f}%",
                     f"{loo[i] * 100:+.1f}%" if loo is not None else "-"])
    for i, run in enumerate(held):
        rows.append([f"{run.label} (held out)", f"{held_before[i] * 100:+.1f}%", f"{held_after[i] * 100:+.1f}%", "-"])
    method = cross_validation(len(train))[1]
    lines += ["", render_table(["run", "error, preset", "error, fitted", "cross-validated"], rows, left=(0,)), ""]
    stats = [("preset", result.before), ("fitted (in sample)", result.after)]
    if loo is not None:
        stats.append((method, loo))
    if held:
        stats.append(("held out", held_after))
    for label, errors in stats:
        s = error_summary(errors)
        lines.append(f"  {label:25s} mean |error| {s['mean_abs_error'] * 100:5.1f}%   max {s['max_abs_error'] * 100:5.1f}%")
    if output:
        lines += ["", f"Wrote {output} (cluster {cluster.name}-calibrated)"]
    return "\n".join(lines)


def _as_json(cluster, train, held, result: Fit, loo, held_before, held_after, output) -> dict:
    catalogue = parameters(cluster)
    return {
        "cluster": cluster.name,
        "parameters": [{"name": n, "preset": catalogue[n].get(cluster), "fitted": float(v),
                        "sigma": None if np.isnan(s) else float(s), "unit": catalogue[n].unit,
                        "identifiable": n not in result.unidentifiable, "sensitivity": result.sensitivity[n]}
                       for n, v, s in zip(result.names, result.values, result.sigma)],
        "cross_validation": None if loo is None else cross_validation(len(train))[1],
        "runs": [{"id": r.label, "error_preset": float(result.before[i]), "error_fitted": float(result.after[i]),
                  "error_cross_validated": None if loo is None else float(loo[i])} for i, r in enumerate(train)],
        "held_out": [{"id": r.label, "error_preset": float(held_before[i]), "error_fitted": float(held_after[i])}
                     for i, r in enumerate(held)],
        "summary": {"preset": error_summary(result.before), "fitted": error_summary(result.after),
                    "cross_validated": None if loo is None else error_summary(loo),
                    "held_out": error_summary(held_after) if len(held) else None},
        "output": output,
    }
