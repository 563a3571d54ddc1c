"""``comet-dse validate``: re-predict published measurements and report the error."""
from __future__ import annotations

from pathlib import Path

from comet_dse.base import jsonout, written
from comet_dse.base.errors import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="re-predict published measurements and report the error")
    p.add_argument("--data", default=None,
                   help="folder with the validation CSVs (default: ../shared/validation or packaged copy)")
    p.add_argument("--cluster", default="dgx-a100-80gb",
                   help="cluster preset for the A100 datasets (default dgx-a100-80gb); h100_public uses dgx-h100")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--figure", default=None, metavar="F.png|F.svg",
                   help="also draw predicted against measured step time and peak memory to this file")


def run(args) -> int:
    import csv

    from comet_dse.answers.errorband import bands_of
    from comet_dse.answers.validation import (
        all_comparisons, group_summary, memory_comparisons, memory_summary, recall, summary, validation_dir,
        whole_run_comparisons, whole_run_summary,
    )
    from comet_dse.base.text import render_table
    from comet_dse.presets.catalog import load_cluster

    directory = Path(args.data) if args.data else validation_dir()
    if not directory.is_dir():
        raise InputError("data", f"{directory} is not a folder")
    cluster_file = [Path(args.cluster)] if Path(args.cluster).suffix.lower() in (".yaml", ".yml") else []
    inputs = sorted(directory.glob("*.csv")) + cluster_file      # what --figure must never replace
    if args.figure:          # refused before the work, not after
        if Path(args.figure).suffix.lower() not in (".png", ".svg"):
            raise InputError("--figure", f"{args.figure} must end in .png or .svg")
        written.check_file(args.figure, "--figure", inputs)
    cluster = load_cluster(args.cluster)
    skipped = []
    try:
        comparisons = all_comparisons(cluster, directory, skipped=skipped)
    except InputError:
        raise
    except KeyError as exc:
        raise InputError("data", f"a CSV in {directory} lacks the column {exc.args[0]!r}") from None
    except (ValueError, TypeError, ArithmeticError, csv.Error) as exc:     # a malformed measurement file
        raise InputError("data", f"a CSV in {directory} holds a value that is not valid: {exc}") from None
    stats = summary(comparisons)
    memory = _read_data(memory_comparisons, directory, "memory.csv")
    fits = recall(comparisons)
    runs = _read_data(whole_run_comparisons, directory, "whole_runs.csv")
    if args.figure:
        fmt = Path(args.figure).suffix[1:].lower()
        written.write_file(args.figure, lambda tmp: figure(comparisons, memory, tmp, fmt), "--figure", inputs)
    groups = {key: group_summary(comparisons, key) for key in ("hardware", "framework", "kind")}
    bands = bands_of(comparisons)
    if args.json:
        print(jsonout.dumps({
            "data": str(directory),
            "rows": [{"dataset": c.dataset, "label": c.label, "predicted_s": c.predicted, "measured_s": c.measured,
                      "error": c.error, "fits": c.fits, "memory_per_device_bytes": c.memory_bytes,
                      "capacity_bytes": c.capacity_bytes, "hardware": c.hardware, "framework": c.framework,
                      "dtype": c.dtype, "kind": c.kind} for c in comparisons],
            "summary": stats,
            "groups": groups,
            "error_bands": bands,
            "feasibility_recall": fits,
            "not_compared": [{"dataset": d, "label": label, "why": why} for d, label, why in skipped],
            "memory": {"rows": [{"label": c.label, "predicted_bytes": c.predicted, "measured_bytes": c.measured,
                                 "measures": c.measures, "error": c.error, "source": c.source} for c in memory],
                       "summary": memory_summary(memory)},
            "whole_runs": {"rows": [whole_run_dict(r) for r in runs], "summary": whole_run_summary(runs)},
        }, indent=2))
        return 0
    print(f"Validation against published runs in {directory} (cluster preset {args.cluster})\n")
    rows = [[c.dataset.removesuffix(".csv"), c.label, f"{c.predicted:.4g}", f"{c.measured:.4g}", f"{c.error * 100:+.1f}%"]
            for c in comparisons]
    print(render_table(["dataset", "run", "predicted s", "measured s", "error"], rows, left=(0, 1)))
    print()
    rows = [[k.removesuffix(".csv"), v["rows"], f"{v['mean_abs_error'] * 100:.1f}%", f"{v['max_abs_error'] * 100:.1f}%"]
            for k, v in stats.items()]
    print(render_table(["dataset", "rows", "mean |error|", "max |error|"], rows))
    for key, title in (("hardware", "hardware"), ("framework", "framework"), ("kind", "kind of model")):
        rows = [[g, v["runs"], f"{v['mean_abs_error'] * 100:.1f}%", f"{v['max_abs_error'] * 100:.1f}%",
                 f"{v['mean_error'] * 100:+.1f}%", f"{v['low'] * 100:+.1f}% .. {v['high'] * 100:+.1f}%"]
                for g, v in groups[key].items()]
        print(f"\nWhole runs by {title}\n")
        print(render_table([title, "runs", "mean |error|", "max |error|", "mean error", "range"], rows, left=(0,)))
    print("\nError bands (what estimate, search, whatif, the API and the explorer report; packaged copy: "
          "answers/errorband.py)\n")
    rows = [[b["hardware"], b["precision"], b["kind"], b["runs"], f"{b['mean_abs_error'] * 100:.1f}%",
             f"{b['low'] * 100:+.1f}% .. {b['high'] * 100:+.1f}%", b["frameworks"]] for b in bands]
    print(render_table(["hardware", "precision", "kind", "runs", "mean |error|", "error range", "frameworks"], rows,
                       left=(0, 1, 2, 6)))
    print("\nFeasibility recall (with each preset's reserved memory):")
    for dataset in dict.fromkeys(c.dataset for c in comparisons if c.fits is not None):
        part = recall([c for c in comparisons if c.dataset == dataset])
        missed = part["missed"]
        shown = ", ".join(missed[:6]) + (f" and {len(missed) - 6} more" if len(missed) > 6 else "")
        print(f"  {dataset.removesuffix('.csv')}: {part['judged_to_fit']} of {part['runs']} published runs judged "
              f"to fit" + (f"; not: {shown}" if missed else ""))
    if skipped:
        print(f"\nNot compared: {len(skipped)} published runs the model cannot run as written")
        for dataset, label, why in skipped:
            print(f"  {dataset.removesuffix('.csv')}: {label}: {why}")
    print("\nPeak memory per device, predicted vs measured (memory.csv)\n")
    rows = [[c.label, c.measures, _gib(c.predicted), _gib(c.measured), f"{c.error * 100:+.1f}%"] for c in memory]
    print(render_table(["run", "measured as", "predicted GiB", "measured GiB", "error"], rows, left=(0, 1)))
    mem = memory_summary(memory)
    if mem["rows"]:
        print(f"\nmemory: {mem['rows']} rows, mean |error| {mem['mean_abs_error'] * 100:.1f}%, "
              f"max |error| {mem['max_abs_error'] * 100:.1f}%")
    print("\n" + "\n".join(whole_run_lines(runs)))
    if args.figure:
        print(f"\nWrote {args.figure}")
    return 0


def _run_band(run) -> dict:
    """The error band of a whole run's accelerator and precision (errorband.band_for)."""
    from comet_dse.answers.errorband import band_for

    return band_for(run.hardware, run.dtype)


def whole_run_dict(run) -> dict:
    """One whole run as JSON: published and predicted device-hours (with goodput, and of the steps alone), the
    range the step time's error band leaves, the errors, and each phase's strategy and where it came from."""
    from comet_dse.whole_run.economics import band_range

    band = _run_band(run)
    low_high = band_range(run.predicted_device_hours, band)
    return {"run": run.run, "hardware": run.hardware, "dtype": run.dtype, "published": run.published,
            "published_device_hours": run.published_device_hours,
            "predicted_device_hours": run.predicted_device_hours, "steps_device_hours": run.steps_device_hours,
            "predicted_device_hours_range": low_high, "goodput": run.goodput, "error": run.error,
            "steps_error": run.steps_error,
            "within_band": (low_high[0] <= run.published_device_hours <= low_high[1]) if low_high else None,
            "error_band": band["text"], "band_assumed": bool(band.get("assumed")), "source": run.source,
            "comparable": run.comparable,
            "phases": [{"phase": p.name, "strategy": p.strategy_text, "strategy_source": p.strategy_source,
                        "device_time_s": p.device_time_s, "time_to_train_s": p.time_to_train_s,
                        "energy_j": p.energy_j} for p in run.phases]}


def whole_run_lines(runs: list) -> list:
    """The whole-run table of ``validate``: published against predicted device-hours, with goodput and the error
    band's range, and the summary."""
    from comet_dse.answers.validation import whole_run_summary
    from comet_dse.base.text import render_table

    rows = []
    for run in runs:
        d = whole_run_dict(run)
        band = d["predicted_device_hours_range"]
        rows.append([run.run, run.hardware.replace("NVIDIA ", ""), "+".join(sorted({p.strategy_source for p in run.phases})),
                     f"{run.published_device_hours / 1e6:.3f}M", f"{run.steps_device_hours / 1e6:.3f}M",
                     f"{run.goodput * 100:.1f}%", f"{run.predicted_device_hours / 1e6:.3f}M",
                     f"{run.error * 100:+.1f}%",
                     (f"{band[0] / 1e6:.2f}M .. {band[1] / 1e6:.2f}M" + (" (assumed)" if d["band_assumed"] else ""))
                     if band else "not validated",
                     ("yes" if d["within_band"] else "no") if band else "-", run.comparable.split(":", 1)[0]])
    s = whole_run_summary(runs)
    return ["Whole training runs: device-hours, published vs predicted (whole_runs.csv; whole_run/goodput.py's sourced "
            "defaults; strategy as stated, or the searched best where the source states none)", "",
            render_table(["run", "hardware", "strategy", "published", "steps", "goodput", "predicted", "error",
                          "error band range", "published in range", "comparable"], rows, left=(0, 1, 2)),
            "",
            f"device-hours: {s['with_goodput']['rows']} runs, mean |error| {s['with_goodput']['mean_abs_error'] * 100:.1f}%, "
            f"max {s['with_goodput']['max_abs_error'] * 100:.1f}%, mean {s['with_goodput']['mean_error'] * 100:+.1f}% "
            f"(steps alone: mean |error| {s['steps_only']['mean_abs_error'] * 100:.1f}%); the "
            f"{s['comparable']['rows']} comparable (the published figure counts what is costed, whole_runs.csv's "
            f"comparable column): mean |error| {s['comparable']['mean_abs_error'] * 100:.1f}%, mean "
            f"{s['comparable']['mean_error'] * 100:+.1f}%",
            "A whole-run figure counts the phases costed (their tokens at the predicted throughput) over the goodput; "
            "it leaves out evaluations, ablations, annealing or post-training the source does not list as phases."]


def _read_data(read, directory: Path, name: str) -> list:
    """``read(directory)``, a malformed measurement file ``name`` turned into one line naming it."""
    import csv

    try:
        return read(directory)
    except KeyError as exc:
        raise InputError("data", f"{name} lacks the column {exc.args[0]!r}") from None
    except (ValueError, TypeError, ArithmeticError, csv.Error) as exc:
        raise InputError("data", f"{name} holds a value that is not valid: {exc}") from None


def _gib(nbytes: float) -> str:
    """Bytes as GiB, with two decimals under 10 GiB (the small runs' errors are tenths of a GiB)."""
    gib = nbytes / 2**30
    return f"{gib:.2f}" if gib < 10 else f"{gib:.1f}"


def figure(comparisons: list, memory: list, path, fmt: str = "png") -> None:
    """Predicted against measured, on log axes with the line of equality and a +-10 % band: the step time of
    every whole run (left, by accelerator, dense runs as dots and mixture-of-experts runs as triangles: the
    families of the error bands) and the peak memory per device (right, by what was measured). Written to
    ``path`` as ``fmt`` (png or svg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from comet_dse.answers.validation import whole_runs

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": (1.0, 1.0)})
    runs = whole_runs(comparisons)
    accelerators = list(dict.fromkeys(c.hardware for c in runs))
    palette = plt.get_cmap("tab20" if len(accelerators) > 10 else "tab10")
    for index, hardware in enumerate(accelerators):     # one colour per accelerator, a marker per kind of model
        for kind, marker in (("dense", "o"), ("MoE", "^"), ("recommendation", "s")):
            group = [c for c in runs if c.hardware == hardware and c.kind == kind]
            if group:
                left.scatter([c.measured for c in group], [c.predicted for c in group], s=20, marker=marker,
                             alpha=0.75, color=palette(index % palette.N), label=f"{hardware} {kind} ({len(group)})")
    _panel(left, [c.measured for c in runs] + [c.predicted for c in runs], "measured step time [s]",
           "predicted step time [s]", f"Step time, {len(runs)} whole runs", legend_outside=True)
    for measures, marker in (("max_allocated", "o"), ("max_reserved", "s"), ("device", "^")):
        group = [c for c in memory if c.measures == measures]
        if group:
            right.scatter([c.measured / 2**30 for c in group], [c.predicted / 2**30 for c in group], s=22,
                          marker=marker, label=f"{measures.replace('_', ' ')} ({len(group)})")
    _panel(right, [c.measured / 2**30 for c in memory] + [c.predicted / 2**30 for c in memory],
           "measured peak memory per device [GiB]", "predicted [GiB]", f"Peak memory, {len(memory)} runs")
    fig.tight_layout()
    fig.savefig(path, format=fmt)
    plt.close(fig)


def _panel(ax, values: list, xlabel: str, ylabel: str, title: str, legend_outside: bool = False) -> None:
    """Log axes over ``values``, the line predicted = measured and the band within 10 % of it; the legend in the
    upper left corner, or right of the panel where it is long (``legend_outside``: one entry per family)."""
    values = [v for v in values if v > 0]
    if not values:
        ax.set_title(f"{title} (none)", fontsize=10)
        return
    low, high = min(values) / 1.3, max(values) * 1.3
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.plot([low, high], [low, high], color="black", linewidth=0.8, label="predicted = measured")
    ax.fill_between([low, high], [0.9 * low, 0.9 * high], [1.1 * low, 1.1 * high], color="grey", alpha=0.2,
                    label="within 10 %")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    where = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if legend_outside else {"loc": "upper left"}
    ax.legend(fontsize=6.5, labelspacing=0.25, handletextpad=0.3, borderaxespad=0.3, **where)
