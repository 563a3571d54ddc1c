"""`comet-dse report STUDY_DIR`: run every study of a folder, draw the figures, write one HTML report.

Everything is written into a temporary folder beside the output and renamed
into place at the end, so a failed or interrupted run never leaves a partial
report under the final name. Only an empty folder or a report this tool wrote
and nobody changed since (MARKER is its manifest, base/written.py) is ever replaced,
never one that holds the studies or a file they name; temporaries of dead runs
are removed.
"""
from __future__ import annotations

import dataclasses as dc
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from comet_dse.base import jsonout, written
from comet_dse.base.errors import InputError
from comet_dse.base.loading import Fields, read_yaml
from comet_dse.base.units import is_finite
from comet_dse.base.vocabulary import FRONT, resource
from comet_dse.design_space.engine import run_study
from comet_dse.design_space.study import DOUBLED_RESOURCES, Study, load_study
from comet_dse.report import analysis, figures, findings, readings as rd
from comet_dse.report.html import write_html
from comet_dse.strategy.declared import KNOBS
from comet_dse.strategy.knob import GIVEN

REPORT_FILE = "report.yaml"       # the folder's report title, introduction and findings, not a study
FINDINGS_FILE = "findings.json"   # the findings table as JSON, beside report.html
MARKER = ".comet-dse-report"      # the manifest of every report folder (written.seal): what makes it safe to replace


@dataclass
class Section:
    """One study's part of the report."""

    study: Study
    data: dict
    ranking: dict
    figures: list = field(default_factory=list)
    findings: list = field(default_factory=list)


def load_folder(study_dir: Path, max_points: int | None = None) -> tuple:
    """(ReportText, [Study]): every input of a report, checked before anything is written."""
    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        raise InputError("studies", f"{study_dir} is not a folder")
    text = load_report_text(study_dir)
    paths = sorted(p for p in study_dir.glob("*.yaml") if p.name not in (REPORT_FILE, text.declared_file))
    if not paths:
        raise InputError("studies", f"{study_dir} holds no study files (*.yaml)")
    studies = [load_study(p, max_points) for p in paths]
    _check_clashes(studies)
    rd.check(text.readings, studies)
    findings.check(text.findings, studies, text.readings)
    return text, studies


def reading_runs(text: "ReportText", studies: list, max_points: int | None = None) -> dict:
    """run label -> [Study]: the studies a report's readings run again with their overrides (seq_len,
    global_batch, the expansion tier's fields; report/readings.py), named ``<study>@<answers>``, before anything
    runs. A study without an expansion tier is not run again for an answer that changes only the tier."""
    by_name = {s.name: s for s in studies}
    out = {}
    for name in text.readings.studies:
        study = by_name[name]
        for label, overrides in text.readings.runs(rd.has_tier(study)).items():
            if label:
                out.setdefault(label, []).append(load_study(_path_of(study), max_points,
                                                            overrides={**overrides, "name": f"{name}@{label}"}))
    return out


def _path_of(study: Study) -> Path:
    return Path(study.files[0])


def build_report(study_dir: Path, output: Path, workers: int = 1, progress: bool = True,
                 max_points: int | None = None, announce=None, on_step=None) -> Path:
    """Run the studies of ``study_dir`` and write ``output``/report.html with figures and data.

    A study of more than ``max_points`` design points is refused; ``announce(study)``
    is called for each study before the first one runs, ``on_step(text)`` before each step after the
    studies have run (the findings, each study's figures, the page), which take as long as the runs.
    """
    def step(text: str) -> None:
        if on_step is not None:
            on_step(text)

    study_dir, output = Path(study_dir), Path(os.path.abspath(output))
    text, studies = load_folder(study_dir, max_points)   # every input error surfaces before anything is written
    reruns = reading_runs(text, studies, max_points)
    inputs = [study_dir, *(f for s in studies for f in s.files)]
    written.check_folder(output, MARKER, "report", inputs=inputs)   # every refusal before anything is written
    started = time.perf_counter()
    _remove_stale(output)
    tmp = written.result_temp_folder(output)     # private, at a name nobody can predict (never through a link)
    try:
        (tmp / "data").mkdir()
        (tmp / MARKER).write_text("{}")      # a report being written: stale-temporary cleaning may remove it
        (tmp / "figures").mkdir()
        for study in [*studies, *(s for again in reruns.values() for s in again)]:
            if announce is not None:
                announce(study)
        extra = KNOB_COLUMNS if text.readings.questions else ()
        sections = []
        for study in studies:
            result = tmp / "data" / f"{study.file_stem}.parquet"
            ranking = run_study(study, result, workers=workers, progress=progress)
            sections.append(Section(study, analysis.load(result, extra if text.readings.applies(study.name) else ()),
                                    ranking))
        runs = {}
        for label, again in reruns.items():
            for study in again:
                result = tmp / "data" / f"{study.file_stem}.parquet"
                ranking = run_study(study, result, workers=workers, progress=progress)
                runs.setdefault(label, {})[study.name.split("@", 1)[0]] = Section(study, analysis.load(result, extra),
                                                                                  ranking)
        if text.findings:
            step(f"the findings table: {len(text.findings)} findings under every reading")
        table = findings.evaluate(text.findings, sections, text.readings, runs)
        card = findings.score(table, text.readings)
        drawn = _figure_reading(text.readings, card)
        for i, section in enumerate(sections):
            if drawn is not None and text.readings.applies(section.study.name):
                label = drawn.run_label_for(rd.has_tier(section.study))
                source = runs.get(label, {}).get(section.study.name, section) if label else section
                sections[i] = section = under(source, drawn, text.readings)
            count = len(section.study.figures)
            step(f"drawing {section.study.name}: {count} figure{'s' * (count != 1)} ({i + 1} of {len(sections)} studies)")
            _draw(section, tmp / "figures")
        if table:
            (tmp / FINDINGS_FILE).write_text(jsonout.dumps([f.to_dict() for f in table], indent=2) + "\n")
        step("writing report.html")
        write_html(tmp / "report.html", sections, seconds=time.perf_counter() - started, title=text.title,
                   introduction=text.introduction, findings=table, scorecard=card, readings=text.readings)
        written.seal(tmp, MARKER, "report")
        _replace(tmp, output, inputs)
    except OSError as exc:
        raise written.failure("output", "write", output, exc) from None
    finally:
        if tmp.exists() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
    return output / "report.html"


@dataclass(frozen=True)
class ReportText:
    """The report's own words: its title, an introduction after the generated summary, and the paper
    findings its table sets beside the studies' (report/findings.py)."""

    title: str
    introduction: str = ""
    findings: tuple = ()
    readings: rd.Readings = rd.NO_READINGS
    declared_file: str = ""          # report.yaml's declared_reading: a file of the folder that is not a study


def load_report_text(study_dir: Path) -> ReportText:
    """The optional report.yaml of ``study_dir`` (title, introduction, findings); default title 'Studies in FOLDER'."""
    default = f"Studies in {Path(study_dir).resolve().name}"
    path = Path(study_dir) / REPORT_FILE
    if not path.exists():
        return ReportText(default)
    f = Fields(read_yaml(path, "report"), "report")
    readings = rd.from_yaml(f.raw("readings")) if f.has("readings") else rd.NO_READINGS
    declared_file = f.text("declared_reading") if f.has("declared_reading") else ""
    if declared_file:
        readings = _declared(Path(study_dir), declared_file, readings)
    text = ReportText(title=f.text("title", default) or default, introduction=f.text("introduction", ""),
                      findings=tuple(findings.specs_from(f.raw("findings"))) if f.has("findings") else (),
                      readings=readings, declared_file=declared_file)
    f.reject_unknown()
    return text


def _declared(study_dir: Path, name: str, readings: rd.Readings) -> rd.Readings:
    """``readings`` with the declared reading of the file ``name`` in ``study_dir`` (report.yaml's
    ``declared_reading``; readings.declare)."""
    path = study_dir / name
    if not name or Path(name).is_absolute() or ".." in Path(name).parts or not path.is_file():
        raise InputError("report.declared_reading", f"must name a YAML file in {study_dir}, got {name!r}")
    return rd.declare(readings, read_yaml(path, "report.declared_reading"), "report.declared_reading")


KNOB_COLUMNS = tuple(k.name for k in KNOBS if k.search != GIVEN)   # a read study's strategy columns, all loaded


def _figure_reading(readings: rd.Readings, card) -> rd.Reading | None:
    """The reading the read studies' figures are drawn under: the declared one, else the best one (findings.score),
    costed with comet-dse's model (the simulator gives totals only, not where the time goes). None without
    readings."""
    if not readings.questions or card is None:
        return None
    best = readings.declared_reading() or next(r for r in readings.all() if rd.reading_name(r) == card.best)
    first = {q: answers[0] for q, answers in readings.questions}
    return rd.Reading(tuple(a if a.cost == "comet-dse" else first[a.question] for a in best.answers))


def under(section: Section, reading: rd.Reading, readings: rd.Readings) -> Section:
    """``section`` as ``reading`` reads it: the clusters findings name (as it reads them), the rows it selects, the
    best strategy of each variant among them; the study's name says which reading."""
    study, data = section.study, section.data
    keep = {reading.cluster(c) for c in rd.roles(study, readings)}
    variants = [v for v in study.variants if v.cluster.name in keep]
    rows = rd.mask(data, study, reading) & np.isin(data["variant"], [v.index for v in variants])
    data = {k: v[rows] for k, v in data.items()}
    old = study.variants[study.baseline]
    wanted = {**old.labels, **({"cluster": reading.cluster(old.labels["cluster"])} if "cluster" in old.labels else {})}
    baseline = next((i for i, v in enumerate(variants) if v.labels == wanted), 0)
    name = study.name.split("@", 1)[0]
    shown = dc.replace(study, name=name, variants=variants, baseline=baseline,
                       description=f"{study.description} (reading: {reading.name})")
    return Section(shown, data, _ranking(data, shown), section.figures, section.findings)


def _ranking(data: dict, study: Study) -> dict:
    """The ranking of a section's rows (as run_study's summary has it, for the best-strategy table): per variant
    and device count its fastest strategy that fits and its speedup over the baseline's."""
    groups = []
    for v in study.variants:
        for n in sorted({int(x) for x in data["devices"][data["variant"] == v.index]}):
            sel = (data["variant"] == v.index) & (data["devices"] == n)
            ok = np.flatnonzero(sel & data["feasible"])
            best = None
            if len(ok):
                row = int(ok[np.argmin(data["step_time_s"][ok])])
                best = {k: _plain(data[k][row]) for k in (*KNOB_COLUMNS, "step_time_s", "tokens_per_second", "mfu")
                        if k in data}
            groups.append({"variant": v.index, "label": v.label, "devices": n, "feasible": int(len(ok)),
                           "points": int(np.count_nonzero(sel)), "best": best})
    base = next((g for g in groups if g["variant"] == study.variants[study.baseline].index and g["best"]), None)
    for g in groups:
        g["speedup"] = (base["best"]["step_time_s"] / g["best"]["step_time_s"]) if base and g["best"] else None
    return {"variants": groups, "baseline": study.variants[study.baseline].label, "points": len(data["variant"])}


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def _check_clashes(studies: list) -> None:
    """Studies of one folder must not write the same files: their names (as file names) are unique, and
    every figure file starts with its study's name."""
    names, files = set(), {}
    for study in studies:
        if study.file_stem in names:
            raise InputError("name", f"two studies are named {study.file_stem!r} (as file names); their result "
                             "files would clash")
        names.add(study.file_stem)
        for kind in study.figures:
            for suffix in FIGURE_FILES[kind]:
                file = f"{study.file_stem}-{suffix}"
                if files.setdefault(file, study.name) != study.name:
                    raise InputError("name", f"studies {files[file]} and {study.name} would both write the figure "
                                     f"{file}; rename one")


def _remove_stale(output: Path) -> None:
    """Remove the temporary report folders of ``output`` whose process no longer runs (they hold MARKER)."""
    for tmp in written.stale_temps(output):
        if tmp.is_dir() and (tmp / MARKER).exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _replace(tmp: Path, output: Path, inputs: list) -> None:
    """Move the finished report ``tmp`` to ``output``; an earlier report there, unchanged, is replaced
    (checked before the run, and again just before the move: written.replace_folder)."""
    written.replace_folder(tmp, output, lambda: written.check_folder(output, MARKER, "report", inputs=inputs))


def _speedups(section: Section) -> dict:
    """variant index -> speedup of its best over the baseline's best (None when infeasible)."""
    return {g["variant"]: g["speedup"] for g in section.ranking["variants"]}


def _draw(section: Section, out: Path) -> None:
    """The figures and findings of one study, in the order of its `figures:` list."""
    for kind in section.study.figures:
        DRAW[kind](section, out)


def _series_label(variant, exclude: tuple, default: str) -> str:
    """One line per combination of the axes a figure does not plot: the variant's labels on them
    (the cluster by its name), or ``default`` when there are none."""
    parts = [label if axis == "cluster" else f"{axis}={label}"
             for axis, label in variant.labels.items() if axis not in exclude]
    return ", ".join(parts) or default


def _with_others(label: str, variant, plotted: tuple) -> str:
    """``label``, followed by the variant's labels on the axes the figure does not plot, if any."""
    others = _series_label(variant, plotted, "")
    return f"{label}, {others}" if others else label


def _speedup(section: Section, out: Path) -> None:
    """Kind `speedup`: every variant's best step time against the baseline's, as bars."""
    name = section.study.name
    labels = {v.index: v.label for v in section.study.variants}
    section.figures.append(figures.speedup_bars(
        {"best strategy": {labels[k]: v for k, v in _speedups(section).items() if v}},
        f"{name}: speedup over the baseline", "speedup (x)", f"{section.study.file_stem}-speedup",
        "Best feasible step time of the baseline variant divided by each variant's.", out))


def _parallelism_splits(section: Section, out: Path) -> None:
    """Kind `parallelism-splits`: stacked MP x DP runtimes, the feasibility map, bathtub curves (with the
    splits that do not fit at their memory-ignored runtime) and a comparison of the variants."""
    variants, stem = section.study.variants, section.study.file_stem
    section.figures.append(figures.rq1_stacked(section.data, variants, out, f"{stem}-stacked",
                                               analysis.part_labels(section.study.models)))
    section.figures.append(figures.rq1_feasibility(section.data, variants, out, f"{stem}-feasibility"))
    curves, hollow = _bathtubs(section)
    if curves or hollow:
        tol = findings.BATHTUB_TOLERANCE
        section.figures.append(figures.lines(
            curves, "model-parallel degree MP = TP x PP", "step time / fastest split",
            "Bathtub curves over MP x DP", f"{stem}-bathtub",
            "Step time of the fastest strategy of each split, normalised per cluster to its fastest split with "
            "memory ignored, as the COMET paper plots every split and marks the memory wall: filled markers fit, "
            "open ones do not (drawn at the step time of their fastest strategy with memory ignored). Grey band: "
            f"within {tol:.0%} of the fastest, the bathtub measure's tolerance (comet-dse's validated error; a dip "
            "smaller than that is flat, docs/case-studies.md). Both axes logarithmic.", out,
            log2_x=True, log2_y=True, hollow=hollow, band=(1.0, 1.0 + tol, f"within {tol:.0%}: flat")))
    for v in variants:
        section.findings.append(_split_finding(section, v))
    _cluster_comparison(section, out)


def _bathtubs(section: Section) -> tuple:
    """(fitting curves, memory-ignored points): label -> (MP values, step time / the variant's fastest split with
    memory ignored, the bathtub measure's reference: findings.bathtub)."""
    curves, hollow = {}, {}
    for v in section.study.variants:
        rows = analysis.splits(section.data, v.index)
        ok = [sp for sp in rows if sp.feasible]
        over = [sp for sp in rows if not sp.feasible and sp.any_memory_row is not None]
        label = v.values.get("cluster", v.label)
        times = section.data["step_time_s"]
        ref = min((float(times[sp.any_memory_row]) for sp in rows if sp.any_memory_row is not None), default=1.0)
        if ok:
            curves[label] = ([sp.mp for sp in ok], [float(times[sp.row]) / ref for sp in ok])
        hollow[label] = ([sp.mp for sp in over], [float(times[sp.any_memory_row]) / ref for sp in over])
    return curves, hollow


def _split_finding(section: Section, v) -> str:
    """One cluster variant's splits in a sentence: the fastest that fits, the memory wall, the fastest
    with memory ignored."""
    rows = analysis.splits(section.data, v.index)
    ok = [s for s in rows if s.feasible]
    name = v.values.get("cluster", v.label)
    times = section.data["step_time_s"]
    runnable = [s for s in rows if s.any_memory_row is not None]
    free = min(runnable, key=lambda s: times[s.any_memory_row]) if runnable else None
    ignored = (f" With memory ignored the fastest split is {free.name} ({times[free.any_memory_row]:.1f} s/step)."
               if free is not None else "")
    acc = v.cluster.accelerator
    if not ok:
        need = _least_memory(section.data, v.index)
        return (f"{name}: no MP x DP split fits ({len(rows)} splits tried); the leanest valid strategy needs "
                f"{need:.1f} GiB per device, the device's {acc.state_tiers} hold {acc.state_capacity / 2**30:.1f} "
                f"GiB.{ignored}")
    fastest = min(ok, key=lambda s: times[s.row])
    slowest = max(float(times[s.row]) for s in ok)
    wall = [s.mp for s in rows if s.reason == "memory"]
    return (f"{name}: fastest split {fastest.name} ({times[fastest.row]:.1f} s/step); the slowest feasible split "
            f"takes {slowest / times[fastest.row]:.1f}x as long; {len(ok)} of {len(rows)} splits fit"
            + (f"; MP {', '.join(map(str, wall))} do not fit in memory" if wall else "") + f".{ignored}")


def _cluster_comparison(section: Section, out: Path) -> None:
    """The variants' best strategies against the baseline's: tokens/s of the whole cluster and per device
    (strategies that fit), and of the whole cluster with memory ignored (every split's fastest runnable
    strategy), so that a cluster on which nothing fits still shows."""
    variants, data = section.study.variants, section.data
    best = analysis.best_rows(data)
    runnable = (data["infeasible_mask"] & ~analysis.MEMORY_BIT) == 0
    groups = {"whole cluster": {}, "per device": {}, "whole cluster, memory ignored": {}}
    for v in variants:
        name = v.values.get("cluster", v.label)
        rows = np.flatnonzero((data["variant"] == v.index) & runnable)
        if len(rows):
            free = rows[np.argmin(data["step_time_s"][rows])]
            groups["whole cluster, memory ignored"][name] = float(data["tokens_per_second"][free])
        if v.index in best:
            row = best[v.index]
            groups["whole cluster"][name] = float(data["tokens_per_second"][row])
            groups["per device"][name] = float(data["tokens_per_second"][row]) / float(data["devices"][row])
    baseline = variants[section.study.baseline]
    ref = baseline.values.get("cluster", baseline.label)
    if ref not in groups["whole cluster"]:
        return
    names = [v.values.get("cluster", v.label) for v in variants]
    relative = {}
    for group, values in groups.items():
        base = groups["per device" if group == "per device" else "whole cluster"][ref]
        relative[f"{group} vs {ref}"] = {n: values.get(n, float("nan")) / base for n in names}
    section.figures.append(figures.speedup_bars(
        relative, "Cluster comparison: best strategy", "relative tokens/s (x)", f"{section.study.file_stem}-clusters",
        f"Tokens per second of each cluster's fastest strategy that fits, relative to {ref}'s: of the whole "
        "cluster (the speed the COMET paper compares) and per device (so that clusters of different sizes "
        "compare); and of the whole cluster with memory ignored (the fastest strategy of any split, fitting or "
        f"not), also relative to {ref}'s fastest that fits.", out, missing_text="nothing fits"))


def _least_memory(data: dict, variant: int) -> float:
    """GiB per device of the strategy of ``variant`` that needs the least memory among those only memory rules out."""
    sel = (data["variant"] == variant) & (data["infeasible_mask"] == analysis.MEMORY_BIT)
    return float(data["memory_per_device_bytes"][sel].min()) / 2**30 if np.any(sel) else float("nan")


def _one_at_a_time(section: Section) -> dict:
    """cluster (and any other axes) -> {resource doubled: speedup of the best over the x1 variant}."""
    best = figures.variant_best_time(section.data)
    out = {}
    for v in section.study.variants:
        scales = {k: v.values.get(k) for k in DOUBLED_RESOURCES}
        cluster = _series_label(v, DOUBLED_RESOURCES, v.cluster.name)
        base = next((b for b in section.study.variants
                     if _series_label(b, DOUBLED_RESOURCES, b.cluster.name) == cluster
                     and all(b.values.get(k) == 1.0 for k in DOUBLED_RESOURCES)), None)
        if base is None or base.index not in best or v.index not in best:
            continue
        doubled = [k for k, s in scales.items() if s == 2.0]
        label = "all four" if len(doubled) == 4 else (resource(doubled[0]).label if len(doubled) == 1 else None)
        if label:
            out.setdefault(cluster, {})[label] = best[base.index] / best[v.index]
    return out


def _resource_doubling(section: Section, out: Path) -> None:
    """Kind `resource-doubling`: the speedup of doubling each node resource, alone and all four."""
    groups = _one_at_a_time(section)
    if not groups:
        section.findings.append("No variant with a resource doubled and its x1 counterpart both have a "
                                "feasible strategy; nothing to compare.")
        return
    section.figures.append(figures.speedup_bars(
        groups, "What doubling each node resource buys", "speedup of the best strategy (x)", f"{section.study.file_stem}-balance",
        "Best step time with one resource doubled (or all four), relative to the same cluster as built. The "
        "largest bar is the bottleneck of the best configuration.", out))
    for cluster, values in groups.items():
        single = {k: v for k, v in values.items() if k != "all four"}
        if single:
            top = max(single, key=single.get)
            section.findings.append(f"{cluster}: doubling {top} buys the most ({single[top]:.2f}x); "
                                    f"doubling all four {values.get('all four', float('nan')):.2f}x.")


def _best_along(section: Section, axis: str) -> dict:
    """cluster (and any other axes) -> (axis values, best time per value) over the variants."""
    best = figures.variant_best_time(section.data)
    out = {}
    for v in section.study.variants:
        if v.index in best:
            xs, ys = out.setdefault(_series_label(v, (axis,), v.cluster.name), ([], []))
            xs.append(v.values[axis])
            ys.append(best[v.index])
    return out


def _capacity(section: Section, out: Path) -> None:
    """Kind `capacity`: speedup and MP x DP splits that fit against the HBM capacity multiplier."""
    series, counts = {}, {}
    for cluster, (xs, ys) in _best_along(section, "hbm_capacity").items():
        series[cluster] = (xs, [ys[0] / y for y in ys])
    for v in section.study.variants:
        cluster = _series_label(v, ("hbm_capacity",), v.cluster.name)
        n = sum(1 for s in analysis.splits(section.data, v.index) if s.feasible)
        counts.setdefault(cluster, ([], []))
        counts[cluster][0].append(v.values["hbm_capacity"])
        counts[cluster][1].append(n)
    section.figures.append(figures.lines(series, "HBM capacity (x the preset)", "speedup of the best strategy (x)",
                                         "Memory capacity: speedup", f"{section.study.file_stem}-capacity",
                                         "Best step time at each capacity relative to the preset's capacity.", out))
    section.figures.append(figures.lines(counts, "HBM capacity (x the preset)", "MP x DP splits that fit",
                                         "Memory capacity: splits unlocked", f"{section.study.file_stem}-unlocked",
                                         "Number of MP x DP splits with at least one strategy that fits.", out,
                                         integer_y=True))
    for cluster, (xs, ys) in series.items():
        section.findings.append(f"{cluster}: capacity x{xs[-1]:g} makes the best strategy {ys[-1]:.2f}x faster; "
                                f"fitting splits go from {counts[cluster][1][0]} to {counts[cluster][1][-1]}.")


def _network(section: Section, out: Path) -> None:
    """Kind `network`: speedup over the baseline against the network bandwidth multiplier, one line per network."""
    best = figures.variant_best_time(section.data)
    base = best.get(section.study.baseline)
    series = {}
    for v in section.study.variants:
        if v.index in best and base:
            label = _with_others(f"network: {v.values['network']}", v, ("network", "network_bandwidth"))
            xs, ys = series.setdefault(label, ([], []))
            xs.append(v.values["network_bandwidth"])
            ys.append(base / best[v.index])
    baseline = section.study.variants[section.study.baseline].label
    section.figures.append(figures.lines(series, f"{resource('network_bandwidth').label} (x the preset)",
                                         "speedup over the baseline (x)",
                                         "Network topology and bandwidth", f"{section.study.file_stem}-network",
                                         f"Best step time relative to the baseline ({baseline}).", out))
    for label, (xs, ys) in series.items():
        section.findings.append(f"{label}: {', '.join(f'x{x:g}: {y:.2f}x' for x, y in zip(xs, ys))}.")


# How a row costs the tier (``_tier_costing``): the expansion figure's name for it and what it means.
TIER_COSTINGS = {
    0: ("exposed", "the tier's traffic adds to the step"),
    1: ("overlapped", "prefetched and hidden behind each pass's compute where it can be"),
    2: ("roofline", "the COMET authors' remote-memory roofline, each pass's traffic (and its work at the tier's "
                    "compute roof, where it has one) hidden behind that pass alone"),
}


def _tier_costing(data: dict) -> np.ndarray:
    """Per row: 0 the tier's traffic exposed, 1 prefetched and overlapped (expansion_overlap), 2 the remote-memory
    roofline (expansion_roofline, which replaces the overlap knob, so its rows are one costing whatever that is)."""
    return np.where(data["expansion_roofline"], 2, np.asarray(data["expansion_overlap"], dtype=int))


def _expansion(section: Section, out: Path) -> None:
    """Kind `expansion`: speedup and feasible strategies against the expansion tier's capacity and bandwidth;
    where the rows cost the tier more than one way, one speedup line per bandwidth and costing (``_tier_costing``:
    traffic exposed, overlapped, or the remote-memory roofline)."""
    data, stem = section.data, section.study.file_stem
    costing = _tier_costing(data)
    modes = [int(x) for x in np.unique(costing)]
    base = figures.variant_best_time(data).get(section.study.baseline)
    series, counts = {}, {}
    for v in section.study.variants:
        label = _with_others(f"{v.values['expansion_bandwidth'] / 1e9:g} GB/s", v,
                             ("expansion_capacity", "expansion_bandwidth"))
        gib = v.values["expansion_capacity"] / 2**30
        for mode in modes:
            rows = (data["variant"] == v.index) & data["feasible"] & (costing == mode)
            name = f"{label}, {TIER_COSTINGS[mode][0]}" if len(modes) > 1 else label
            xs, ys = series.setdefault(name, ([], []))
            xs.append(gib)
            ys.append(base / float(data["step_time_s"][rows].min()) if np.any(rows) and base else np.nan)
        cx, cy = counts.setdefault(label, ([], []))
        cx.append(gib)
        cy.append(int(np.count_nonzero((data["variant"] == v.index) & data["feasible"])))
    labels = section.study.variants[section.study.baseline].labels
    baseline = ("no tier" if str(labels.get("expansion_capacity", "")).strip().startswith("0 ") else
                "the baseline, " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in labels.items()))
    caption = f"Best step time with a CXL-like tier of each capacity and bandwidth, relative to {baseline}"
    if len(modes) > 1:
        meanings = ", ".join(f"'{TIER_COSTINGS[m][0]}': {TIER_COSTINGS[m][1]}" for m in modes)
        caption += f"; {meanings} (docs/model.md)"
    elif modes:
        caption += ", costed as {}: {} (docs/model.md)".format(*TIER_COSTINGS[modes[0]])
    section.figures.append(figures.lines(series, "expansion tier capacity (GiB per device)",
                                         "speedup of the best strategy (x)", "Expansion memory tier: speedup",
                                         f"{stem}-expansion", caption + ".", out))
    section.figures.append(figures.lines(counts, "expansion tier capacity (GiB per device)", "feasible strategies",
                                         "Expansion memory tier: strategies unlocked", f"{stem}-expansion-unlocked",
                                         "Strategies that fit in HBM plus the tier.", out, integer_y=True))
    for name, (xs, ys) in series.items():
        if len(modes) > 1 and np.any(np.isfinite(ys)):
            top = int(np.nanargmax(ys))
            section.findings.append(f"{name}: up to {ys[top]:.2f}x the speed of the best without a tier "
                                    f"(at {xs[top]:g} GiB).")
    top = max((np.nanmax(ys) for ys in (s[1] for s in series.values())), default=1.0)
    section.findings.append(f"The best strategy with an expansion tier is {top:.2f}x the speed of the best without; "
                            f"the tier unlocks up to {max(max(c[1]) for c in counts.values()):,} strategies "
                            f"(from {min(min(c[1]) for c in counts.values()):,}).")


def _cluster_of(v) -> str:
    """A variant's cluster name (the `cluster` axis where a study lists several, else its one cluster)."""
    return str(v.values.get("cluster", v.cluster.name))


def _best_step(data: dict, rows: np.ndarray) -> tuple:
    """(the least step time of the feasible ``rows``, its row index), or (nan, None) where none is feasible."""
    ok = np.flatnonzero(rows & data["feasible"])
    if not len(ok):
        return float("nan"), None
    i = int(ok[np.argmin(data["step_time_s"][ok])])
    return float(data["step_time_s"][i]), i


class TierPoint(NamedTuple):
    """One model on one device count of one cluster, at one tier bandwidth (``recommendation-tiers``): the
    tables and state per device [GiB] and the speedup of the best tier of that bandwidth over no tier (None:
    nothing fits without the tier)."""

    cluster: str
    model: str
    devices: int
    gib: float
    bandwidth: float
    speedup: float | None


def _tier_points(section: Section) -> list:
    """Every TierPoint of a recommendation study where some tier of the bandwidth makes something fit: the best
    step over the tier's capacities against the best step on the same cluster without a tier (capacity 0)."""
    data, study = section.data, section.study
    per_device = {m.name: (m.embedding_bytes() + m.embedding_state_bytes()) / 2**30 for m in study.models}
    models, devices = np.asarray(data["model"]).astype(str), np.asarray(data["devices"])

    def best(rows, variants) -> float:
        return min((_best_step(data, rows & (data["variant"] == v.index))[0] for v in variants), default=np.nan,
                   key=lambda t: np.inf if np.isnan(t) else t)

    out = []
    for cluster in dict.fromkeys(_cluster_of(v) for v in study.variants):
        variants = [v for v in study.variants if _cluster_of(v) == cluster]
        without = [v for v in variants if v.values["expansion_capacity"] == 0]
        for bw in sorted({v.values["expansion_bandwidth"] for v in variants if v.values["expansion_capacity"] > 0}):
            tier = [v for v in variants if v.values["expansion_capacity"] > 0 and v.values["expansion_bandwidth"] == bw]
            for model, gib in per_device.items():
                for n in sorted({int(d) for d in devices[models == model]}):
                    here = (models == model) & (devices == n)
                    base, with_tier = best(here, without), best(here, tier)
                    if np.isfinite(with_tier):
                        speedup = base / with_tier if np.isfinite(base) else None
                        out.append(TierPoint(cluster, model, n, gib / n, bw, speedup))
    return out


def _recommendation_tiers(section: Section, out: Path) -> None:
    """Kind `recommendation-tiers` (a recommendation model's study over clusters, device counts and an expansion
    tier): per cluster, the speedup the tier buys over the same cluster without it (capacity 0), by how much of
    the embedding tables and their optimizer state each device holds (the model's whole tables and state / the
    devices) and by tier bandwidth, the best over the tier's capacities (``_tier_points``); triangles where only
    the tier makes it fit. Then per cluster the share of the best design's step the exposed embedding exchange
    takes, by device count: where the all-to-all dominates (``_exchange_shares``)."""
    points = sorted(_tier_points(section), key=lambda p: p.gib)
    panels, marked = {}, {}
    for p in points:
        label = f"{p.bandwidth / 1e9:g} GB/s"
        series = (marked if p.speedup is None else panels).setdefault(p.cluster, {}).setdefault(label, ([], []))
        series[0].append(p.gib)
        series[1].append(1.0 if p.speedup is None else p.speedup)
    section.figures.append(figures.panels_by_cluster(
        panels, "tables + optimizer state per device (GiB)", "speedup over no tier (x)",
        "Expansion tier: what it buys a recommendation model", f"{section.study.file_stem}-tiers",
        "The best strategy with an expansion tier of each bandwidth (the best of its capacities) over the best "
        "on the same cluster and devices without one; the x axis is the model's tables and their optimizer state "
        "over the devices. Rows beyond HBM go to the fastest tier first (host memory where the preset has one, "
        "the expansion tier), the coldest first, every row alike (docs/model.md, \"Recommendation models\"). "
        "Triangles: nothing fits without the tier.", out, marked=marked))
    _tier_findings(section, points)
    _exchange_shares(section, out)


def _exchange_shares(section: Section, out: Path) -> None:
    """Per cluster and model, the share of the best design's step (over every tier variant of the cluster) the
    exposed embedding exchange takes, by device count: a figure and a finding each."""
    data, study = section.data, section.study
    models, devices = np.asarray(data["model"]).astype(str), np.asarray(data["devices"])
    exchange = {}
    for cluster in dict.fromkeys(_cluster_of(v) for v in study.variants):
        rows_c = np.isin(data["variant"], [v.index for v in study.variants if _cluster_of(v) == cluster])
        series = {}
        for model in (m.name for m in study.models):
            xs, ys = [], []
            for n in sorted({int(d) for d in devices[models == model]}):
                step, i = _best_step(data, rows_c & (models == model) & (devices == n))
                if i is not None:
                    xs.append(n)
                    ys.append(100.0 * float(data["time_embedding_communication_s"][i]) / step)
            series[model] = (xs, ys)
            if ys and max(ys) < 0.5:
                section.findings.append(f"{cluster}, {model}: the embedding exchange is hidden (under 0.5 % of the "
                                        f"best design's step) at every device count.")
            elif ys:
                top = int(np.argmax(ys))
                section.findings.append(f"{cluster}, {model}: the exposed embedding exchange takes {ys[top]:.0f} % "
                                        f"of the best design's step at {xs[top]:,} devices "
                                        f"({', '.join(f'{y:.0f} % at {x:,}' for x, y in zip(xs, ys))}).")
        exchange[cluster] = series
    section.figures.append(figures.panels_by_cluster(
        exchange, "devices", "exposed embedding exchange (% of step)", "Where the all-to-all dominates",
        f"{study.file_stem}-exchange", "The share of the best design's step (over every tier variant of the "
        "cluster) that the exchange of row indices and pooled embeddings leaves exposed, by device count.", out))


def _tier_findings(section: Section, points: list) -> None:
    """One line per cluster: the largest speedup the tier buys and where, where it buys nothing, and where only
    the tier makes the model fit."""
    for cluster in dict.fromkeys(p.cluster for p in points):
        sped = [p for p in points if p.cluster == cluster and p.speedup is not None]
        only = sorted({(p.model, p.devices) for p in points if p.cluster == cluster and p.speedup is None})
        parts = []
        if sped:
            top = max(sped, key=lambda p: p.speedup)
            designs = sorted({(p.model, p.devices) for p in sped})
            flat = [d for d in designs if all(p.speedup < 1.005 for p in sped if (p.model, p.devices) == d)]
            if top.speedup < 1.005:
                parts.append(f"the tier buys nothing (under 0.5 %) on any of the {len(designs)} model and device "
                             "counts that fit without it")
            else:
                parts.append(f"the tier buys up to {top.speedup:.2f}x ({top.model} on {top.devices:,} devices, "
                             f"{top.gib:.0f} GiB of tables and state per device, {top.bandwidth / 1e9:g} GB/s)")
                parts.append(f"under 0.5 % on {len(flat)} of the {len(designs)} model and device counts that fit "
                             "without it")
        if only:
            parts.append("only the tier makes " + ", ".join(f"{m} on {n:,}" for m, n in only) + " fit")
        section.findings.append(f"{cluster}: " + "; ".join(parts) + ".")


def _first_fit(section: Section, out: Path) -> None:
    """Kind `first-fit`: the smallest MP x DP split that fits against the HBM capacity multiplier, one line
    per cluster (and other axes) and ZeRO stage: how the memory wall moves with capacity and with how much of
    the model state is sharded over DP (which the COMET paper's memory accounting does is not public)."""
    data = section.data
    stages = [int(z) for z in np.unique(data["zero"])]
    series = {}
    for v in section.study.variants:
        label = _series_label(v, ("hbm_capacity",), v.cluster.name)
        for z in stages:
            rows = analysis.splits(data, v.index, where=data["zero"] == z)
            fit = min((s.mp for s in rows if s.feasible), default=float("nan"))
            xs, ys = series.setdefault(f"{label}, ZeRO {z}" if len(stages) > 1 else label, ([], []))
            xs.append(v.values["hbm_capacity"])
            ys.append(fit)
    section.figures.append(figures.lines(
        series, "HBM capacity (x the preset)", "smallest MP that fits", "Memory capacity: where the wall is",
        f"{section.study.file_stem}-first-fit", "The smallest model-parallel degree (MP = TP x PP, DP = devices / "
        "MP) with a strategy that fits, at each capacity, per ZeRO stage (how much of the model state is sharded "
        "over DP). A missing point: nothing fits.", out, log2_y=True, integer_y=True))
    for label, (xs, ys) in series.items():
        steps = [f"MP{y:.0f} from x{x:g}" for i, (x, y) in enumerate(zip(xs, ys))
                 if np.isfinite(y) and (i == 0 or y != ys[i - 1])]
        section.findings.append(f"{label}: smallest split that fits: " + (", ".join(steps) or "none at any capacity")
                                + ".")


# Figure kind -> the suffixes of its figure files (each file is <study file name>-<suffix>.png and .svg).
FIGURE_FILES = {
    "pareto": ("pareto",),
    "speedup": ("speedup",),
    "parallelism-splits": ("stacked", "feasibility", "bathtub", "clusters"),
    "resource-doubling": ("balance",),
    "capacity": ("capacity", "unlocked"),
    "network": ("network",),
    "expansion": ("expansion", "expansion-unlocked"),
    "recommendation-tiers": ("tiers", "exchange"),
    "first-fit": ("first-fit",),
}

# The panels of the `pareto` figure, in order: the Pareto fronts (vocabulary.FRONTS) by key.
PARETO_PANELS = ("pareto_cost", "pareto_training_cost", "pareto_energy", "pareto_power")


# Figure kind (a study's `figures:`, explore.study.FIGURE_KINDS) -> the function that draws it.
def _pareto(section: Section, out: Path) -> None:
    """Kind `pareto`: every variant's best strategy as a point of time (time to train with the study's
    `token_budget`, else step time) against the cluster's price, its rated power and, with a budget, the cost
    and energy of training; the Pareto front of each (design_space/rank.py) drawn as a line. A panel
    whose figures are all unknown (no price or power, docs/economics.md) is left out."""
    ranking, budget = section.ranking, section.study.token_budget
    axes = list(section.study.variants[0].labels)
    short = {v.index: "/".join(v.labels.values()) or "base" for v in section.study.variants}
    panels = []
    for key in PARETO_PANELS:
        # its column (the one with a budget: a best row holds every column), axis title and scale
        column, label, scale = FRONT[key].budget_column, FRONT[key].axis_label, FRONT[key].scale
        if key not in ranking:
            continue
        points = [(g["best"][column] / scale, _time_of(g["best"], budget), short[g["variant"]])
                  for g in ranking["variants"] if g["best"] and is_finite(g["best"].get(column))]
        if points:
            front = sorted((p[column] / scale, p["time_s"] / (86400.0 if budget else 1.0)) for p in ranking[key])
            panels.append((label, points, front))
    if not panels:
        return
    what = "time to train (days)" if budget else "step time (s)"
    section.figures.append(figures.pareto(
        panels, what, f"{section.study.name}: time against price, cost, energy and power",
        f"{section.study.file_stem}-pareto",
        f"Each point is a cluster variant's fastest strategy, labelled {'/'.join(axes) or 'base'}; the line joins "
        "the Pareto front (no other variant is "
        "both faster and cheaper, or both faster and leaner). Prices and power follow the scaled resources through "
        "the cluster's per-unit prices and powers (docs/economics.md); a resource without a per-unit figure adds "
        "nothing.", out))


def _time_of(best: dict, budget) -> float:
    """A best row's time to train in days with a token budget, else its step time in seconds."""
    return budget / best["tokens_per_second"] / 86400.0 if budget else best["step_time_s"]


DRAW = {
    "pareto": _pareto,
    "speedup": _speedup,
    "parallelism-splits": _parallelism_splits,
    "resource-doubling": _resource_doubling,
    "capacity": _capacity,
    "network": _network,
    "expansion": _expansion,
    "recommendation-tiers": _recommendation_tiers,
    "first-fit": _first_fit,
}
