"""The COMET figures: stacked MP x DP runtimes, feasibility, resource, capacity, network, expansion, clusters.

Every figure is written as PNG and SVG; axis labels carry units.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402

from comet_dse.report.analysis import PART_LABELS, PARTS, best_rows, breakdown, splits# noqa: E402
from comet_dse.base.vocabulary import TIME_PART# noqa: E402

COLORS = {p: TIME_PART[p].color for p in PARTS}
plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8})


@dataclass(frozen=True)
class Figure:
    name: str       # file stem
    title: str
    caption: str


def _save(fig, out: Path, name: str) -> None:
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=150)
    fig.savefig(out / f"{name}.svg")
    plt.close(fig)


def _shown_row(split):
    """(row, fits) drawn for a split: its fastest strategy that fits, else its fastest with memory ignored."""
    if split.feasible:
        return split.row, True
    return split.any_memory_row, False


def rq1_stacked(data: dict, variants: list, out: Path, name: str = "rq1-stacked", labels: dict | None = None) -> Figure:
    """Normalised step time of the best strategy per MP x DP split, stacked by where time goes; ``labels``:
    part -> legend label (default the vocabulary's, analysis.part_labels).

    Splits that do not fit are drawn hatched and pale at the step time of
    their fastest strategy with memory ignored (as the COMET paper draws every
    split); clusters on which no split is valid get no panel.
    """
    shown = [v for v in variants if any(_shown_row(s)[0] is not None for s in splits(data, v.index))] or variants[:1]
    fig, axes = plt.subplots(1, len(shown), figsize=(3.7 * len(shown), 3.6), squeeze=False)
    used = set()
    for ax, variant in zip(axes[0], shown):
        rows = splits(data, variant.index)
        drawn = [_shown_row(s) for s in rows]
        base = min((data["step_time_s"][r] for r, fits in drawn if fits), default=None)
        if base is None:
            base = min((data["step_time_s"][r] for r, _ in drawn if r is not None), default=1.0)
        x = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for part in PARTS:
            height = np.array([breakdown(data, r)[part] / base if r is not None else 0.0 for r, _ in drawn])
            if np.any(height > 1e-3):
                fits = np.array([f for _, f in drawn])
                ax.bar(x[fits], height[fits], bottom=bottom[fits], color=COLORS[part], width=0.8)
                ax.bar(x[~fits], height[~fits], bottom=bottom[~fits], color=COLORS[part], width=0.8, alpha=0.35,
                       hatch="///", edgecolor="white", linewidth=0)
                bottom += height
                used.add(part)
        for i, (s, (r, fits)) in enumerate(zip(rows, drawn)):
            if not fits:
                ax.text(i, bottom[i] + 0.04, "does not fit" if s.reason == "memory" else "invalid", rotation=90,
                        ha="center", va="bottom", fontsize=7, color="#B22222")
        ax.set_xticks(x, [str(s.mp) for s in rows], fontsize=7, rotation=60)
        ax.set_xlabel("MP = TP x PP  (DP = devices / MP)")
        ax.set_title(variant.values.get("cluster", variant.label))
        ax.set_ylabel("step time / fastest split that fits")
        fits = np.array([f for _, f in drawn])
        pale = float(bottom[~fits].max()) if np.any(~fits) else 0.0      # room above them for their label
        ax.set_ylim(0, max(2.0, float(bottom.max()) * 1.05, pale * 1.6))
    labels = labels or PART_LABELS
    handles = [matplotlib.patches.Patch(color=COLORS[p], label=labels[p]) for p in PARTS if p in used]
    width, height = fig.get_size_inches()
    longest = max((len(h.get_label()) for h in handles), default=1)    # the vocabulary's labels are long:
    columns = max(1, min(len(handles), int(width // (0.065 * longest + 0.5))))    # as many columns as fit
    rows = -(-len(handles) // columns)
    fig.set_size_inches(width, height + 0.22 * rows)            # room for the legend's rows below the panels
    fig.legend(handles=handles, loc="lower center", ncol=columns, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, (0.25 + 0.22 * rows) / (height + 0.22 * rows), 1, 1))
    fig.savefig(out / f"{name}.png", dpi=150)
    fig.savefig(out / f"{name}.svg")
    plt.close(fig)
    return Figure(name, "Runtime of every MP x DP split, by where the time goes",
                  "For each model-parallel degree MP = TP x PP (and DP = devices / MP) the fastest feasible "
                  "strategy, its step time normalised to the cluster's fastest split that fits and stacked by "
                  "part: a bathtub when both ends are slow. Splits marked 'does not fit' have no strategy that "
                  "fits in device memory; they are drawn pale and hatched at the step time of their fastest "
                  "strategy with memory ignored, as the COMET paper draws every split (where no split fits, "
                  "normalised to the fastest of those). 'Invalid' ones have no valid TP x PP x micro-batch "
                  "combination.")


def rq1_feasibility(data: dict, variants: list, out: Path, name: str = "rq1-feasibility") -> Figure:
    """Which MP values fit on which cluster: one row of markers per cluster on a log2 MP axis."""
    fig, ax = plt.subplots(figsize=(7.0, 0.9 + 0.45 * len(variants)))
    style = {"fits": ("#6AA84F", "o"), "memory": ("#E06666", "X"), "invalid": ("#BBBBBB", "s")}
    for r, v in enumerate(variants):
        for s in splits(data, v.index):
            color, marker = style[s.reason]
            ax.scatter([s.mp], [r], c=color, marker=marker, s=40)
    ax.set_xscale("log", base=2)
    ax.set_yticks(range(len(variants)), [v.values.get("cluster", v.label) for v in variants])
    ax.set_ylim(-0.6, len(variants) - 0.4)
    ax.set_xlabel("model-parallel degree MP = TP x PP (log scale)")
    handles = [matplotlib.lines.Line2D([], [], color=c, marker=m, linestyle="", label=t) for (c, m), t in
               ((style["fits"], "fits"), (style["memory"], "does not fit in memory"),
                (style["invalid"], "no valid TP x PP / batch split"))]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3)
    ax.grid(axis="x", alpha=0.3)
    _save(fig, out, name)
    return Figure(name, "Which MP x DP splits fit",
                  "Green: at least one strategy of this split fits in device memory; red: every valid strategy "
                  "needs more memory than the device has; grey: no valid TP x PP factorisation or batch split.")


def speedup_bars(groups: dict, title: str, ylabel: str, name: str, caption: str, out: Path,
                 missing_text: str | None = None) -> Figure:
    """groups: series label -> {category: value}. Grouped bars; ``missing_text`` is written where a
    value is missing (NaN), e.g. 'nothing fits'."""
    categories = list(next(iter(groups.values())).keys())
    fig, ax = plt.subplots(figsize=(7.0, 3.0))
    width = 0.8 / len(groups)
    top = 0.0
    for i, (label, values) in enumerate(groups.items()):
        x = np.arange(len(categories)) + (i - (len(groups) - 1) / 2) * width
        heights = np.array([values.get(c, np.nan) for c in categories], dtype=float)
        ax.bar(x, heights, width=width, label=label)
        top = max(top, float(np.nanmax(heights)) if np.any(np.isfinite(heights)) else 0.0)
        for xi, h in zip(x, heights):
            if missing_text and not np.isfinite(h):
                ax.text(xi, 0.05, missing_text, rotation=90, ha="center", va="bottom", fontsize=7, color="#B22222")
    if len(groups) > 1:
        ax.set_ylim(0, max(top, 1.0) * (1.15 + 0.12 * len(groups)))    # room for the legend above the bars
    ax.axhline(1.0, color="black", linewidth=0.7)
    ax.set_xticks(range(len(categories)), [textwrap.fill(str(c), 18) for c in categories], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    _save(fig, out, name)
    return Figure(name, title, caption)


def lines(series: dict, xlabel: str, ylabel: str, title: str, name: str, caption: str, out: Path,
          log2_x: bool = False, integer_y: bool = False, log2_y: bool = False, hollow: dict | None = None,
          band: tuple | None = None) -> Figure:
    """series: label -> (x values, y values). ``hollow``: label -> (x, y) points drawn as open markers
    in the colour of that series (e.g. splits that do not fit in memory). ``band``: (low, high, label), a
    shaded band of y values (e.g. within the bathtub tolerance of the fastest)."""
    many = len(series) > 4                    # then the legend goes beside the plot, not over the lines
    fig, ax = plt.subplots(figsize=(9.0 if many else 7.0, 3.0))
    if band is not None:
        ax.axhspan(band[0], band[1], color="#DDDDDD", alpha=0.7, label=band[2], zorder=0)
    for label, (x, y) in series.items():
        line, = ax.plot(x, y, marker="o", label=label)
        if hollow and hollow.get(label) and len(hollow[label][0]):
            ax.plot(*hollow[label], marker="o", linestyle=":", markerfacecolor="white", color=line.get_color())
    if hollow:
        for label, (x, y) in hollow.items():
            if label not in series and len(x):
                ax.plot(x, y, marker="o", linestyle=":", markerfacecolor="white", label=f"{label} (none fits)")
        ax.plot([], [], marker="o", linestyle=":", markerfacecolor="white", color="grey",
                label="does not fit (memory ignored)")
    if log2_x:
        ax.set_xscale("log", base=2)
    if log2_y:     # powers of two labelled as numbers; with integer_y only those (MP degrees), else also 1.5x them
        ax.set_yscale("log", base=2)
        low, high = ax.get_ylim()
        fine = not integer_y and high / low < 16                  # a narrow range also gets 1.5x ticks
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=2, subs=(1.0, 1.5) if fine else (1.0,),
                                                                numticks=16))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    elif integer_y:
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if many:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend()
    _save(fig, out, name)
    return Figure(name, title, caption)


def panels_by_cluster(panels: dict, xlabel: str, ylabel: str, title: str, name: str, caption: str, out: Path,
                      marked: dict | None = None, log_x: bool = True, log_y: bool = False) -> Figure:
    """One panel per cluster: ``panels`` cluster -> {series label: (x values, y values)}; ``marked`` cluster ->
    {label: (x, y)}: points drawn as open triangles in that series' colour (e.g. what only fits with the tier)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(3.9 * len(panels) + 1.8, 3.3), squeeze=False, sharey=True)
    for ax, (cluster, series) in zip(axes[0], panels.items()):
        for label, (x, y) in series.items():
            line, = ax.plot(x, y, marker="o", label=label)
            extra = (marked or {}).get(cluster, {}).get(label)
            if extra and len(extra[0]):
                ax.plot(*extra, marker="^", linestyle="none", markerfacecolor="white", color=line.get_color())
        if log_x:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        if log_y:
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set_title(cluster, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    if marked:
        axes[0][-1].plot([], [], marker="^", linestyle="none", markerfacecolor="white", color="grey",
                         label="fits only with the tier")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    fig.suptitle(title, fontsize=10)
    _save(fig, out, name)
    return Figure(name, title, caption)


def pareto(panels: list, ylabel: str, title: str, name: str, caption: str, out: Path) -> Figure:
    """One panel per (xlabel, points [(x, y, label)], front [(x, y)]): every point, the front as a line
    through its points, each labelled with its variant when there are few."""
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 0.6, 3.4), squeeze=False)
    for ax, (xlabel, points, front) in zip(axes[0], panels):
        ax.scatter([p[0] for p in points], [p[1] for p in points], color="#8C8C8C", s=18, label="variants")
        ax.plot([f[0] for f in front], [f[1] for f in front], marker="o", color="#C44E52", label="Pareto front")
        if len(points) <= 12:
            for x, y, label in points:
                ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(title, fontsize=10)
    _save(fig, out, name)
    return Figure(name, title, caption)


def variant_best_time(data: dict) -> dict:
    """variant -> best feasible step time (s)."""
    return {v: float(data["step_time_s"][r]) for v, r in best_rows(data).items()}
