"""`comet-dse report STUDY_DIR`: run every study of a folder, draw the figures, write one HTML report.

Everything is written into a temporary folder beside the output and renamed
into place at the end, so a failed or interrupted run never leaves a partial
report under the final name.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from comet_dse.errors import InputError
from comet_dse.explore.engine import run_study
from comet_dse.explore.study import Study, load_study
from comet_dse.report import analysis, figures
from comet_dse.report.html import write_html


@dataclass
class Section:
    """One study's part of the report."""

    study: Study
    data: dict
    ranking: dict
    figures: list = field(default_factory=list)
    findings: list = field(default_factory=list)


def build_report(study_dir: Path, output: Path, workers: int = 1, progress: bool = True) -> Path:
    """Run the studies of ``study_dir`` and write ``output``/report.html with figures and data."""
    study_dir, output = Path(study_dir), Path(output)
    if not study_dir.is_dir():
        raise InputError("studies", f"{study_dir} is not a folder")
    paths = sorted(study_dir.glob("*.yaml"))
    if not paths:
        raise InputError("studies", f"{study_dir} holds no study files (*.yaml)")
    studies = [load_study(p) for p in paths]          # every input error surfaces before anything is written
    started = time.perf_counter()
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        (tmp / "data").mkdir(parents=True)
        (tmp / "figures").mkdir()
        sections = []
        for study in studies:
            result = tmp / "data" / f"{study.name}.parquet"
            ranking = run_study(study, result, workers=workers, progress=progress)
            section = Section(study, analysis.load(result), ranking)
            _draw(section, tmp / "figures")
            sections.append(section)
        write_html(tmp / "report.html", sections, seconds=time.perf_counter() - started)
        _replace(tmp, output)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return output / "report.html"


def _replace(tmp: Path, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    old = output.with_name(f".{output.name}.old-{os.getpid()}")
    if output.exists():
        os.replace(output, old)
    os.replace(tmp, output)
    if old.exists():
        shutil.rmtree(old)


def _speedups(section: Section) -> dict:
    """variant index -> speedup of its best over the baseline's best (None when infeasible)."""
    return {g["variant"]: g["speedup"] for g in section.ranking["variants"]}


def _draw(section: Section, out: Path) -> None:
    """The figures and findings of one study: COMET's questions by name, a generic chart otherwise."""
    name = section.study.name
    if name.startswith("rq1"):
        _rq1(section, out)
    elif name.startswith("rq2"):
        _rq2(section, out)
    elif name.startswith("rq3"):
        _rq3(section, out)
    elif name.startswith("rq4"):
        _rq4(section, out)
    elif name.startswith("rq5"):
        _rq5(section, out)
    else:
        labels = {v.index: v.label for v in section.study.variants}
        section.figures.append(figures.speedup_bars(
            {"best strategy": {labels[k]: v for k, v in _speedups(section).items() if v}},
            f"{name}: speedup over the baseline", "speedup (x)", f"{name}-speedup",
            "Best feasible step time of the baseline variant divided by each variant's.", out))


def _rq1(section: Section, out: Path) -> None:
    variants = section.study.variants
    section.figures.append(figures.rq1_stacked(section.data, variants, out))
    section.figures.append(figures.rq1_feasibility(section.data, variants, out))
    curves = {}
    for v in variants:
        ok = [sp for sp in analysis.splits(section.data, v.index) if sp.feasible]
        if ok:
            times = [float(section.data["step_time_s"][sp.row]) for sp in ok]
            curves[v.values.get("cluster", v.label)] = ([sp.mp for sp in ok], [t / min(times) for t in times])
    if curves:
        fig = figures.lines(curves, "model-parallel degree MP = TP x PP", "step time / fastest feasible split",
                            "Bathtub curves over MP x DP", "rq1-bathtub",
                            "Step time of the fastest strategy of each feasible split, normalised per cluster; "
                            "splits left of each curve do not fit in memory.", out, log2_x=True)
        section.figures.append(fig)
    best = analysis.best_rows(section.data)
    per_device = {}
    for v in variants:
        rows = analysis.splits(section.data, v.index)
        ok = [s for s in rows if s.feasible]
        name = v.values.get("cluster", v.label)
        if not ok:
            need = _least_memory(section.data, v.index)
            cap = v.cluster.accelerator.hbm.capacity / 2**30
            section.findings.append(f"{name}: no MP x DP split fits ({len(rows)} splits tried); the leanest valid "
                                    f"strategy needs {need:.1f} GiB per device, the device has {cap:.1f} GiB.")
            continue
        times = [section.data["step_time_s"][s.row] for s in ok]
        fastest, slowest = min(times), max(times)
        b = ok[int(np.argmin(times))]
        wall = [s.mp for s in rows if s.reason == "memory"]
        section.findings.append(
            f"{name}: fastest split MP{b.mp}_DP{b.dp} ({fastest:.1f} s/step); the slowest feasible split takes "
            f"{slowest / fastest:.1f}x as long; {len(ok)} of {len(rows)} splits fit"
            + (f"; MP {', '.join(map(str, wall))} do not fit in memory" if wall else "") + ".")
        row = best[v.index]
        per_device[name] = float(section.data["tokens_per_second"][row]) / float(section.data["devices"][row])
    if per_device:
        base = per_device.get("dgx-a100-80gb") or next(iter(per_device.values()))
        section.figures.append(figures.speedup_bars(
            {"tokens/s per device vs DGX A100": {k: v / base for k, v in per_device.items()}},
            "Cluster comparison: best strategy, throughput per device", "relative throughput per device (x)",
            "clusters", "Tokens per second per device of each cluster's fastest strategy, relative to DGX A100 "
            "(per device, because Dojo runs at 3000 chips and the others at 4096).", out))


def _least_memory(data: dict, variant: int) -> float:
    """GiB per device of the strategy of ``variant`` that needs the least memory among those only memory rules out."""
    sel = (data["variant"] == variant) & (data["infeasible_mask"] == analysis.MEMORY_BIT)
    return float(data["memory_per_device_bytes"][sel].min()) / 2**30 if np.any(sel) else float("nan")


def _one_at_a_time(section: Section) -> dict:
    """cluster -> {resource doubled: speedup of the best over that cluster's x1 variant}."""
    best = figures.variant_best_time(section.data)
    out = {}
    resources = ("peak_flops", "hbm_capacity", "hbm_bandwidth", "network_bandwidth")
    for v in section.study.variants:
        scales = {k: v.values.get(k) for k in resources}
        cluster = v.values.get("cluster", "cluster")
        base = next((b for b in section.study.variants if b.values.get("cluster") == v.values.get("cluster")
                     and all(b.values.get(k) == 1.0 for k in resources)), None)
        if base is None or base.index not in best or v.index not in best:
            continue
        doubled = [k for k, s in scales.items() if s == 2.0]
        label = "all four" if len(doubled) == 4 else (doubled[0].replace("_", " ") if len(doubled) == 1 else None)
        if label:
            out.setdefault(cluster, {})[label] = best[base.index] / best[v.index]
    return out


def _rq2(section: Section, out: Path) -> None:
    groups = _one_at_a_time(section)
    section.figures.append(figures.speedup_bars(
        groups, "What doubling each node resource buys", "speedup of the best strategy (x)", "rq2-balance",
        "Best step time with one resource doubled (or all four), relative to the same cluster as built. The "
        "largest bar is the bottleneck of the best configuration.", out))
    for cluster, values in groups.items():
        single = {k: v for k, v in values.items() if k != "all four"}
        if single:
            top = max(single, key=single.get)
            section.findings.append(f"{cluster}: doubling {top} buys the most ({single[top]:.2f}x); "
                                    f"doubling all four {values.get('all four', float('nan')):.2f}x.")


def _by_cluster(section: Section, axis: str) -> dict:
    """cluster -> (axis values, best time per value) over the variants."""
    best = figures.variant_best_time(section.data)
    out = {}
    for v in section.study.variants:
        if v.index in best:
            xs, ys = out.setdefault(v.values.get("cluster", "cluster"), ([], []))
            xs.append(v.values[axis])
            ys.append(best[v.index])
    return out


def _rq3(section: Section, out: Path) -> None:
    series, counts = {}, {}
    for cluster, (xs, ys) in _by_cluster(section, "hbm_capacity").items():
        series[cluster] = (xs, [ys[0] / y for y in ys])
    for v in section.study.variants:
        cluster = v.values.get("cluster", "cluster")
        n = sum(1 for s in analysis.splits(section.data, v.index) if s.feasible)
        counts.setdefault(cluster, ([], []))
        counts[cluster][0].append(v.values["hbm_capacity"])
        counts[cluster][1].append(n)
    section.figures.append(figures.lines(series, "HBM capacity (x the preset)", "speedup of the best strategy (x)",
                                         "Memory capacity: speedup", "rq3-capacity",
                                         "Best step time at each capacity relative to the preset's capacity.", out))
    section.figures.append(figures.lines(counts, "HBM capacity (x the preset)", "MP x DP splits that fit",
                                         "Memory capacity: splits unlocked", "rq3-unlocked",
                                         "Number of MP x DP splits with at least one strategy that fits.", out,
                                         integer_y=True))
    for cluster, (xs, ys) in series.items():
        section.findings.append(f"{cluster}: capacity x{xs[-1]:g} makes the best strategy {ys[-1]:.2f}x faster; "
                                f"fitting splits go from {counts[cluster][1][0]} to {counts[cluster][1][-1]}.")


def _rq4(section: Section, out: Path) -> None:
    best = figures.variant_best_time(section.data)
    base = best.get(section.study.baseline)
    series = {}
    for v in section.study.variants:
        if v.index in best and base:
            xs, ys = series.setdefault(f"network: {v.values['network']}", ([], []))
            xs.append(v.values["network_bandwidth"])
            ys.append(base / best[v.index])
    section.figures.append(figures.lines(series, "link bandwidth (x the preset)", "speedup over the torus as built (x)",
                                         "Network topology and bandwidth", "rq4-network",
                                         "Best step time relative to the 3D torus at its preset link bandwidth.", out))
    for label, (xs, ys) in series.items():
        section.findings.append(f"{label}: {', '.join(f'x{x:g}: {y:.2f}x' for x, y in zip(xs, ys))}.")


def _rq5(section: Section, out: Path) -> None:
    best = figures.variant_best_time(section.data)
    base = best.get(section.study.baseline)
    series, counts = {}, {}
    for v in section.study.variants:
        label = f"{v.values['expansion_bandwidth'] / 1e9:g} GB/s"
        xs, ys = series.setdefault(label, ([], []))
        xs.append(v.values["expansion_capacity"] / 2**30)
        ys.append(base / best[v.index] if v.index in best and base else np.nan)
        cx, cy = counts.setdefault(label, ([], []))
        cx.append(v.values["expansion_capacity"] / 2**30)
        cy.append(int(np.count_nonzero((section.data["variant"] == v.index) & section.data["feasible"])))
    section.figures.append(figures.lines(series, "expansion tier capacity (GiB per device)",
                                         "speedup of the best strategy (x)", "Expansion memory tier: speedup",
                                         "rq5-expansion", "Best step time with a CXL-like tier of each capacity "
                                         "and bandwidth, relative to no tier.", out))
    section.figures.append(figures.lines(counts, "expansion tier capacity (GiB per device)", "feasible strategies",
                                         "Expansion memory tier: strategies unlocked", "rq5-unlocked",
                                         "Strategies that fit in HBM plus the tier.", out, integer_y=True))
    top = max((max(ys) for ys in (s[1] for s in series.values())), default=1.0)
    section.findings.append(f"The best strategy with an expansion tier is {top:.2f}x the speed of the best without; "
                            f"the tier unlocks up to {max(max(c[1]) for c in counts.values()):,} strategies "
                            f"(from {min(min(c[1]) for c in counts.values()):,}).")
