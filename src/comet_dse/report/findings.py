"""The COMET paper's findings next to comet-dse's: the report's findings table and findings.json.

A report folder's report.yaml may list findings (studies/README.md). Each
gives the paper's value and, for two setups (the paper's own assumptions and
today's strategies), the study of the folder, the cluster variant and the
measure that reproduces it; the values are computed from the studies'
results, never written down, so that they follow the presets. A paper value
counts as reproduced when the split is the same, or a ratio is within
``TOLERANCE`` of the paper's. Where a measure cannot be taken as the paper
took it (nothing fits), it is taken with memory ignored and the note says so.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.errors import InputError
from comet_dse.loading import Fields
from comet_dse.report import analysis

TOLERANCE = 0.30          # a ratio within 30 % of the paper's counts as reproduced
GiB = 2.0**30

# Measure -> (unit, what it is). Units: "split" (MPm_DPd), "x" (a ratio), "shape" (yes or no).
MEASURES = {
    "fastest-split": ("split", "the fastest MP x DP split with memory ignored: the bottom of the bathtub"),
    "first-fit": ("split", "the smallest MP x DP split with a strategy that fits"),
    "best-split": ("split", "the fastest split that fits (with memory ignored where none fits)"),
    "bathtub": ("shape", "whether the fastest strategy per split, memory ignored, is slowest at both ends"),
    "speedup": ("x", "tokens/s of the variant's best strategy over the `over` variant's"),
    "max-speedup": ("x", "the largest speedup of any variant's best strategy over the study's baseline"),
    "spread": ("x", "the fastest variant's tokens/s over the slowest's"),
}


@dataclass(frozen=True)
class Setup:
    """Where one setup's value comes from: a study of the folder, variants in it, rows of its results."""

    study: str
    variant: dict          # axis -> label or value ({cluster: tpu-v4, hbm_capacity: 1.6}); {} = the only one
    over: dict             # the variant a speedup is measured against (speedup only)
    where: dict            # result column -> allowed values (e.g. {zero: [0, 1]})


@dataclass(frozen=True)
class FindingSpec:
    """One row of the findings table as report.yaml states it."""

    finding: str
    paper: object          # "MP4_DP1024", "yes" or a number (a ratio)
    measure: str
    paper_setup: Setup
    modern_setup: Setup
    paper_split: str       # optional: the paper's split, whose needs a note states ("" when none)
    why: str

    @property
    def unit(self) -> str:
        return MEASURES[self.measure][0]


@dataclass(frozen=True)
class Value:
    """A measured value and what qualifies it (memory ignored, what the paper's split would need)."""

    value: object
    note: str = ""


@dataclass(frozen=True)
class Finding:
    spec: FindingSpec
    paper_setup: Value
    modern_setup: Value

    @property
    def reproduced(self) -> bool:
        """The paper's split or shape exactly, or its ratio within TOLERANCE, with the paper's assumptions."""
        return matches(self.spec.paper, self.paper_setup.value, self.spec.unit)

    def to_dict(self) -> dict:
        """findings.json: finding, paper, paper_setup, modern_setup, unit, and the notes and verdict."""
        return {"finding": self.spec.finding, "paper": self.spec.paper, "paper_setup": _plain(self.paper_setup.value),
                "modern_setup": _plain(self.modern_setup.value), "unit": self.spec.unit,
                "reproduced": self.reproduced, "paper_setup_note": self.paper_setup.note,
                "modern_setup_note": self.modern_setup.note, "why": self.spec.why}


def matches(paper, value, unit: str) -> bool:
    """Same split or shape, or |value / paper - 1| <= TOLERANCE for a ratio."""
    if value is None:
        return False
    if unit == "x":
        return abs(float(value) / float(paper) - 1.0) <= TOLERANCE
    return str(value) == str(paper)


def _plain(value):
    return round(float(value), 3) if isinstance(value, (float, np.floating)) else value


# --- reading report.yaml ------------------------------------------------------------------------

def specs_from(raw, prefix: str = "report.findings") -> list:
    """The `findings:` list of report.yaml as FindingSpecs (every field checked, errors name it)."""
    if not isinstance(raw, list):
        raise InputError(prefix, "must be a list of findings")
    return [_spec(Fields(item, f"{prefix}[{i}]")) for i, item in enumerate(raw)]


def _spec(f: Fields) -> FindingSpec:
    measure = f.text("measure")
    if measure not in MEASURES:
        raise InputError(f.name("measure"), f"must be one of {', '.join(MEASURES)}, got {measure!r}")
    paper = f.raw("paper")
    if MEASURES[measure][0] == "x":
        if isinstance(paper, bool) or not isinstance(paper, (int, float)) or not paper > 0:
            raise InputError(f.name("paper"), f"must be a positive ratio for measure {measure}, got {paper!r}")
        paper = float(paper)
    else:
        paper = str(paper)
    spec = FindingSpec(finding=f.text("finding"), paper=paper, measure=measure,
                       paper_setup=_setup(f.sub("paper_setup"), measure),
                       modern_setup=_setup(f.sub("modern_setup"), measure),
                       paper_split=f.text("paper_split", ""), why=f.text("why", ""))
    f.reject_unknown()
    return spec


def _setup(f: Fields, measure: str) -> Setup:
    def mapping(key):
        value = f.raw(key, {})
        if not isinstance(value, dict):
            raise InputError(f.name(key), "must be a mapping of axis names to values")
        return value

    where = mapping("where")
    for column, values in where.items():
        if column not in analysis.COLUMNS or not isinstance(values, list) or not values:
            raise InputError(f"{f.name('where')}.{column}", "must be a result column with a list of values")
    setup = Setup(study=f.text("study"), variant=mapping("variant"), over=mapping("over"), where=where)
    if measure == "speedup" and not setup.over:
        raise InputError(f.name("over"), "is missing: a speedup is measured against another variant")
    f.reject_unknown()
    return setup


def check(specs: list, studies: list) -> None:
    """Every setup names a study of the folder and selects exactly one of its variants (before anything runs)."""
    by_name = {s.name: s for s in studies}
    for i, spec in enumerate(specs):
        for side in ("paper_setup", "modern_setup"):
            setup = getattr(spec, side)
            where = f"report.findings[{i}].{side}"
            if setup.study not in by_name:
                raise InputError(f"{where}.study", f"no study {setup.study!r} in the folder; it has "
                                 f"{', '.join(sorted(by_name))}")
            study = by_name[setup.study]
            if spec.measure not in ("max-speedup", "spread"):
                variant_of(study, setup.variant, f"{where}.variant")
            if spec.measure == "speedup":
                variant_of(study, setup.over, f"{where}.over")


def variant_of(study, selector: dict, where: str):
    """The one variant of ``study`` whose axes match ``selector`` (labels as written, or values)."""
    found = [v for v in study.variants if all(_matches(v, axis, wanted) for axis, wanted in selector.items())]
    if len(found) != 1:
        raise InputError(where, f"matches {len(found)} variants of study {study.name} (it has "
                         f"{'; '.join(v.label for v in study.variants)}); name one")
    return found[0]


def _matches(variant, axis: str, wanted) -> bool:
    if axis == "cluster":
        return str(wanted) == str(variant.values.get("cluster", variant.cluster.name))
    if axis not in variant.values:
        return False
    label, value = variant.labels.get(axis), variant.values[axis]
    if isinstance(wanted, (int, float)) and isinstance(value, (int, float)) and not isinstance(wanted, bool):
        return abs(value - wanted) <= 1e-9 * max(1.0, abs(wanted))
    return str(wanted) in (str(label), str(value))


# --- measuring ------------------------------------------------------------------------------------

def evaluate(specs: list, sections: list) -> list:
    """Every finding measured in both setups from the report's sections (report/build.py: Section)."""
    by_name = {s.study.name: s for s in sections}
    return [Finding(spec, _tidy(measure(spec, by_name[spec.paper_setup.study], spec.paper_setup)),
                    _tidy(measure(spec, by_name[spec.modern_setup.study], spec.modern_setup))) for spec in specs]


def _tidy(value: Value) -> Value:
    """The note without a leading separator (notes are built from optional parts)."""
    return Value(value.value, value.note.lstrip("; "))


def measure(spec: FindingSpec, section, setup: Setup) -> Value:
    """The value of ``spec.measure`` in one setup, with its note."""
    data = section.data
    rows = np.ones(len(data["variant"]), dtype=bool)
    for column, allowed in setup.where.items():
        rows &= np.isin(data[column], allowed)
    if spec.measure in ("max-speedup", "spread"):
        return _across_variants(spec.measure, section, rows)
    variant = variant_of(section.study, setup.variant, spec.finding)
    if spec.measure == "speedup":
        return _speedup(spec, section, variant, variant_of(section.study, setup.over, spec.finding), rows)
    return _split_measure(spec, section, variant, rows)


def _split_measure(spec: FindingSpec, section, variant, rows) -> Value:
    data = section.data
    splits = analysis.splits(data, variant.index, where=rows)
    times = data["step_time_s"]
    fits = [s for s in splits if s.feasible]
    runnable = [s for s in splits if s.any_memory_row is not None]
    note = _paper_split_note(spec, variant, splits, times)
    if spec.measure == "first-fit":
        first = min(fits, key=lambda s: s.mp, default=None)
        if first is None:
            return Value(None, _nothing_fits(variant, runnable) + note)
        return Value(first.name, note)
    if spec.measure == "bathtub":
        order = sorted(runnable, key=lambda s: s.mp)
        t = [float(times[s.any_memory_row]) for s in order]
        if len(t) < 3:
            return Value(None, "fewer than three valid splits")
        low = int(np.argmin(t))
        return Value("yes" if 0 < low < len(t) - 1 else "no",
                     f"memory ignored: fastest {order[low].name}; {order[0].name} takes {t[0] / t[low]:.2f}x and "
                     f"{order[-1].name} {t[-1] / t[low]:.2f}x as long")
    if spec.measure == "best-split" and fits:
        return Value(min(fits, key=lambda s: times[s.row]).name, note)
    if not runnable:
        return Value(None, "no valid split")
    fastest = min(runnable, key=lambda s: times[s.any_memory_row])
    if spec.measure == "best-split":
        note = f"memory ignored: {_nothing_fits(variant, runnable)}" + note
    return Value(fastest.name, note)


def _nothing_fits(variant, runnable) -> str:
    acc = variant.cluster.accelerator
    need = min((s.least_memory for s in runnable), default=float("nan"))
    return (f"nothing fits (the leanest split needs {need / GiB:.0f} GiB per device, the device's "
            f"{acc.state_tiers} hold {acc.state_capacity / GiB:.0f} GiB)")


def _paper_split_note(spec: FindingSpec, variant, splits, times) -> str:
    """What the paper's split needs here, when the study ran it and it is not what was found."""
    mine = next((s for s in splits if s.name == spec.paper_split), None)
    if mine is None or mine.any_memory_row is None:
        return ""
    acc = variant.cluster.accelerator
    have = acc.state_capacity
    fit = "fits" if mine.feasible else (f"needs {mine.least_memory / GiB:.1f} GiB per device, "
                                         f"{mine.least_memory / have:.2f}x the {have / GiB:.1f} GiB it has")
    return f"; the paper's {mine.name} {fit}, {float(times[mine.any_memory_row]):.0f} s/step memory ignored"


def _best(data, variant_index: int, rows, feasible: bool = True):
    """Row of the variant's fastest strategy among ``rows`` (that fits, or that only memory rules out)."""
    ok = data["feasible"] if feasible else (data["infeasible_mask"] & ~analysis.MEMORY_BIT) == 0
    sel = np.flatnonzero((data["variant"] == variant_index) & rows & ok)
    return int(sel[np.argmax(data["tokens_per_second"][sel])]) if len(sel) else None


def _speedup(spec: FindingSpec, section, variant, over, rows) -> Value:
    data = section.data
    base = _best(data, over.index, rows)
    if base is None:
        return Value(None, f"nothing fits on {over.label}")
    row, note = _best(data, variant.index, rows), ""
    if row is None:
        row = _best(data, variant.index, rows, feasible=False)
        note = "memory ignored: " + _nothing_fits(variant, [s for s in analysis.splits(data, variant.index, rows)
                                                           if s.any_memory_row is not None])
    if row is None:
        return Value(None, "no valid strategy")
    speed = data["tokens_per_second"]
    split = analysis.splits(data, variant.index, rows)
    fitted = f"{_split_name(data, row)}" + (" (memory ignored)" if not data["feasible"][row] else "")
    note = note or f"{fitted} over {_split_name(data, base)}"
    paper = next((s for s in split if s.name == spec.paper_split and s.any_memory_row is not None), None)
    if paper is not None and paper.name != _split_name(data, row):
        need = "" if paper.feasible else f", needs {paper.least_memory / GiB:.1f} GiB per device"
        note += (f"; the paper's {paper.name} would be {speed[paper.any_memory_row] / speed[base]:.2f}x"
                 f"{need}")
    return Value(float(speed[row] / speed[base]), note)


def _split_name(data, row: int) -> str:
    return f"MP{int(data['tp'][row] * data['pp'][row])}_DP{int(data['dp'][row])}"


def _across_variants(kind: str, section, rows) -> Value:
    """max-speedup: the best variant over the baseline; spread: the fastest variant over the slowest
    (with memory ignored for a variant on which nothing fits)."""
    data, study = section.data, section.study
    speed, labels, ignored = {}, {}, []
    for v in study.variants:
        row = _best(data, v.index, rows)
        if row is None and kind == "spread":
            row = _best(data, v.index, rows, feasible=False)
            if row is not None:
                ignored.append(v.label)
        if row is not None:
            speed[v.index], labels[v.index] = float(data["tokens_per_second"][row]), v.label
    if kind == "max-speedup":
        base = _best(data, study.baseline, rows)
        if base is None or not speed:
            return Value(None, "nothing fits on the baseline")
        top = max(speed, key=speed.get)
        return Value(speed[top] / float(data["tokens_per_second"][base]), f"{labels[top]}")
    if len(speed) < 2:
        return Value(None, "fewer than two variants run")
    fast, slow = max(speed, key=speed.get), min(speed, key=speed.get)
    note = f"{labels[fast]} over {labels[slow]}"
    if ignored:
        note += f"; memory ignored on {', '.join(ignored)} (nothing fits)"
    return Value(speed[fast] / speed[slow], note)


# --- output ---------------------------------------------------------------------------------------

def text(value, unit: str) -> str:
    """A value as the table writes it: a split, yes/no, or a ratio '3.08x' ('-' when there is none)."""
    if value is None:
        return "-"
    return f"{float(value):.2f}x" if unit == "x" else str(value)
