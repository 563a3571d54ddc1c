"""A paper's findings next to comet-dse's: the report's findings table, its scorecard and findings.json.

A report folder's report.yaml may list findings (studies/README.md). Each gives the paper's value and where the
studies measure it: with the paper's setup (``paper_setup``) and with today's strategies (``modern_setup``). The
paper's setup is measured under every reading of it (report/readings.py; one reading, "as written", without a
``readings:`` block), never one reading per finding. The values are computed from the studies' results, never
written down, so that they follow the presets. A paper value is reproduced when the split or the shape is the
same, or a ratio is within ``TOLERANCE`` of the paper's. Splits that fit and speedups are taken where something
fits, as the paper took them; otherwise the value is None ("nothing fits") and the note gives the memory-ignored
one. A finding's **status** is relative to one reading, the declared one (report.yaml's ``declared_reading``;
without one, the literal reading): "not determinable" where its report.yaml entry names information that is not
public (``not_public``), "reproduced" where the declared reading gives the paper's value, else "not reproduced";
its evidence says in words how many of the other readings reproduce it and what they share ("reproduced only
under other readings"). Each finding is also scored without the tolerances (``strict``): a ratio to the paper's
printed precision, a bathtub with no flatness allowance.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.base.errors import InputError
from comet_dse.base.loading import Fields
from comet_dse.report import analysis, readings as rd

# A ratio within 30 % of the paper's counts as reproduced. A judgement, not a measurement: the paper gives its
# ratios to one or two digits ("about 3x", 3.1x, "up to 1.4x") from a simulator whose cluster files are not public,
# and the public inputs alone move the simulator's own MP64/MP256 ratio by 18 % (3.78x with the file's Layernorm
# rows, 3.21x element-wise: ../shared/comet-astrasim/results.csv). Because it is a judgement, every finding is also
# scored without it (``matches_strict``; docs/case-studies.md, "Tolerances").
TOLERANCE = 0.30
# A dip of less than this (a fraction of the fastest split's step time) is flat: the largest error of comet-dse's
# end-to-end validation (Korthikanti et al. 2022, Table 5: 5.3 %, docs/validation.md), rounded to 5 %.
BATHTUB_TOLERANCE = 0.05
GiB = 2.0**30
LETTER_ONLY = "reproduced by its letter only"
STATUSES = ("reproduced", LETTER_ONLY, "not reproduced", "not determinable")

# Measure -> (unit, what it is). Units: "split" (MPm_DPd), "x" (a ratio), "shape" (yes or no).
MEASURES = {
    "fastest-split": ("split", "the fastest MP x DP split with memory ignored: the bottom of the bathtub"),
    "first-fit": ("split", "the smallest MP x DP split with a strategy that fits"),
    "best-split": ("split", "the fastest split that fits"),
    "bathtub": ("shape", "whether the fastest strategy per split, memory ignored, has its minimum at an inner "
                         f"split with both ends more than {BATHTUB_TOLERANCE:.0%} slower"),
    "speedup": ("x", "tokens/s of the variant's best strategy that fits over the `over` variant's"),
    "max-speedup": ("x", "the largest speedup of any variant's best strategy over the study's baseline"),
    "spread": ("x", "the fastest variant's tokens/s over the slowest's (variants on which something fits)"),
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
    why: str               # the evidence: what is public about the paper's value, why the values differ
    not_public: str = ""   # what the paper's value rests on that is not public ("": determinable)
    flat: bool = False     # bathtub only: the paper's "no" means the curve stays flat (``Finding.letter_only``)

    @property
    def unit(self) -> str:
        return MEASURES[self.measure][0]


@dataclass(frozen=True)
class Value:
    """A measured value and what qualifies it (memory ignored, what the paper's split would need)."""

    value: object
    note: str = ""
    strict: object = ...     # the value without the flatness tolerance (bathtub only; ... = the value itself)
    rise: float | None = None   # bathtub only: the slowest split's time over the fastest's

    @property
    def untolerated(self):
        """The value as the measure gives it with no tolerance."""
        return self.value if self.strict is ... else self.strict


@dataclass
class Finding:
    """One finding measured under every reading of the paper's setup (``values``, by reading name, in the
    order of ``Readings.all``) and with today's strategies (``modern_setup``)."""

    spec: FindingSpec
    values: dict
    modern_setup: Value
    literal: str = rd.AS_WRITTEN       # the literal reading's name
    best: str = rd.AS_WRITTEN          # the best-scoring reading's name (``score``)
    conditions: str = ""               # what every reading that reproduces it shares (``score``)
    declared: str = ""                 # the declared reading's name ("": the literal one)
    incompatible: tuple = ()           # findings (numbers from 1) no reading reproduces together with this one

    @property
    def paper_setup(self) -> Value:
        """The value under the literal reading."""
        return self.values[self.literal]

    @property
    def declared_value(self) -> Value:
        """The value under the declared reading (the literal one where none is declared)."""
        return self.values[self.declared or self.literal]

    @property
    def reproduced_declared(self) -> bool:
        """The paper's value under the declared reading, with the tolerances."""
        return matches(self.spec.paper, self.declared_value.value, self.spec.unit)

    @property
    def reproduced_declared_strict(self) -> bool:
        """The paper's value under the declared reading, without the tolerances."""
        return matches_strict(self.spec.paper, self.declared_value.untolerated, self.spec.unit)

    def reproduced_under_strict(self) -> list:
        """The readings under which the paper's value comes out without the tolerances."""
        return [name for name, v in self.values.items() if matches_strict(self.spec.paper, v.untolerated,
                                                                            self.spec.unit)]

    def reproduced_under(self) -> list:
        """The readings under which the paper's value comes out."""
        return [name for name, v in self.values.items() if matches(self.spec.paper, v.value, self.spec.unit)]

    @property
    def reproduced(self) -> bool:
        """Reproduced under the literal reading."""
        return matches(self.spec.paper, self.paper_setup.value, self.spec.unit)

    @property
    def letter_only(self) -> bool:
        """A "no bathtub" the paper means as a flat curve (FindingSpec.flat) that the declared reading gives
        without one, but with its slowest split more than BATHTUB_TOLERANCE slower than its fastest: the answer
        matches the paper's word, not what it says of the curve."""
        rise = self.declared_value.rise
        return (self.spec.flat and self.reproduced_declared and rise is not None
                and rise > 1.0 + BATHTUB_TOLERANCE)

    @property
    def status(self) -> str:
        """Relative to the declared reading: not determinable, reproduced (or by its letter only: ``letter_only``)
        or not reproduced."""
        if self.spec.not_public:
            return "not determinable"
        if self.letter_only:
            return LETTER_ONLY
        return "reproduced" if self.reproduced_declared else "not reproduced"

    def span(self) -> str:
        """The values the readings give: a ratio's range, or the distinct splits or shapes."""
        values = [v.value for v in self.values.values()]
        known = [v for v in values if v is not None]
        missing = len(values) - len(known)
        if self.spec.unit == "x" and known:
            low, high = text_of(min(map(float, known)), "x"), text_of(max(map(float, known)), "x")
            text = low if low == high else f"{low} to {high}"
        else:
            counts = {}
            for v in known:
                counts[str(v)] = counts.get(str(v), 0) + 1
            text = ", ".join(f"{k} ({n})" if len(values) > 1 else k for k, n in
                             sorted(counts.items(), key=lambda kv: -kv[1]))
        if missing:
            text = (text + "; " if text else "") + (f"none in {missing}" if len(values) > 1 else "none")
        return text or "-"

    def elsewhere(self) -> str:
        """How many readings reproduce it, with and without the tolerances, and what they share: 'k of N'."""
        n, under, strict = len(self.values), self.reproduced_under(), self.reproduced_under_strict()
        if n == 1:
            return ""
        text = f"{len(under)} of {n} readings" + (f" ({self.conditions})" if self.conditions and under else "")
        return text + f"; without the tolerances {len(strict)} of {n}"

    def evidence(self) -> str:
        """The status and its grounds: what is not public, or whether the declared reading reproduces it and, in
        words, how many other readings do and what they share; the range the readings span; then the report.yaml
        evidence."""
        n, under = len(self.values), self.reproduced_under()
        spread = f"values over the {n} readings: {self.span()}" if n > 1 else f"value: {self.span()}"
        which = "the declared reading" if self.declared else ("the literal reading" if n > 1 else "the study")
        strict = "" if self.reproduced_declared_strict == self.reproduced_declared else (
            " (only through the tolerance)" if self.reproduced_declared else " (without the tolerances it is)")
        if self.status == "not determinable":
            head = f"Not determinable: {self.spec.not_public}. {spread[0].upper()}{spread[1:]}"
            if under:
                head += f"; the paper's value under {len(under)} of them"
        elif self.letter_only:
            head = (f"Reproduced by its letter only under {which}: no bathtub, but not the flat curve the paper "
                    f"describes: its slowest split takes {self.declared_value.rise:.1f}x its fastest's time"
                    + (f"; reproduced under {self.elsewhere()}" if n > 1 else "") + f"; {spread}")
        elif self.reproduced_declared:
            head = f"Reproduced under {which}{strict}" + (f"; so are {self.elsewhere()}" if n > 1 else "")
            head += f"; {spread}"
        elif under:
            head = (f"Not reproduced under {which}{strict}; reproduced only under other readings: "
                    f"{self.elsewhere()}; {spread}")
        else:
            head = f"Not reproduced under any reading; {spread}"
        if self.incompatible:
            head += ("; no reading reproduces it together with finding "
                     + ", ".join(f"F{i}" for i in self.incompatible))
        return f"{head}. {self.spec.why}".strip()

    def to_dict(self) -> dict:
        """findings.json: finding, paper, unit, readings {name: value}, status, evidence; and the literal and best
        readings' values with their notes, and today's strategies' value."""
        return {"finding": self.spec.finding, "paper": self.spec.paper, "unit": self.spec.unit,
                "readings": {name: _plain(v.value) for name, v in self.values.items()},
                "status": self.status, "evidence": self.evidence(),
                "declared": {"reading": self.declared or self.literal, "value": _plain(self.declared_value.value),
                             "note": self.declared_value.note, "reproduced": self.reproduced_declared,
                             "reproduced_without_tolerances": self.reproduced_declared_strict},
                "reproduced_under": len(self.reproduced_under()),
                "reproduced_under_without_tolerances": len(self.reproduced_under_strict()),
                "incompatible_with": [f"F{i}" for i in self.incompatible], "conditions": self.conditions,
                "span": self.span(), "not_public": self.spec.not_public,
                "literal": {"reading": self.literal, "value": _plain(self.paper_setup.value),
                            "note": self.paper_setup.note},
                "best": {"reading": self.best, "value": _plain(self.values[self.best].value),
                         "note": self.values[self.best].note},
                "modern_setup": {"value": _plain(self.modern_setup.value), "note": self.modern_setup.note}}


def matches(paper, value, unit: str) -> bool:
    """Same split or shape, or |value / paper - 1| <= TOLERANCE for a ratio."""
    if value is None:
        return False
    if unit == "x":
        return abs(float(value) / float(paper) - 1.0) <= TOLERANCE
    return str(value) == str(paper)


def matches_strict(paper, value, unit: str) -> bool:
    """Without the tolerances: the same split or shape (a shape as measured with no flatness allowance), or a ratio
    that rounds to the paper's at the paper's printed precision (3.0: 2.95 to 3.05)."""
    if value is None:
        return False
    if unit == "x":
        decimals = len(repr(float(paper)).split(".")[1])
        return abs(float(value) - float(paper)) <= 0.5 * 10.0 ** -decimals + 1e-12
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
    if f.has("why") and f.has("evidence"):
        raise InputError(f.name("evidence"), "give `evidence` or its older name `why`, not both")
    spec = FindingSpec(finding=f.text("finding"), paper=paper, measure=measure,
                       paper_setup=_setup(f.sub("paper_setup"), measure),
                       modern_setup=_setup(f.sub("modern_setup"), measure),
                       paper_split=f.text("paper_split", ""),
                       why=f.text("evidence", "") or f.text("why", ""), not_public=f.text("not_public", ""),
                       flat=f.boolean("paper_means_flat", False))
    if spec.flat and measure != "bathtub":
        raise InputError(f.name("paper_means_flat"), "applies to measure bathtub only")
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


def check(specs: list, studies: list, readings: rd.Readings = rd.NO_READINGS) -> None:
    """Every setup names a study of the folder and selects exactly one of its variants, under every reading of
    the paper's setup (before anything runs)."""
    by_name = {s.name: s for s in studies}
    every = readings.all()
    for i, spec in enumerate(specs):
        for side in ("paper_setup", "modern_setup"):
            setup = getattr(spec, side)
            where = f"report.findings[{i}].{side}"
            if setup.study not in by_name:
                raise InputError(f"{where}.study", f"no study {setup.study!r} in the folder; it has "
                                 f"{', '.join(sorted(by_name))}")
            study = by_name[setup.study]
            under = every if side == "paper_setup" and readings.applies(setup.study) else [rd.Reading(())]
            for reading in {tuple(sorted(r.clusters.items())): r for r in under}.values():
                if spec.measure not in ("max-speedup", "spread"):
                    variant_of(study, _mapped(setup.variant, reading), f"{where}.variant")
                if spec.measure == "speedup":
                    variant_of(study, _mapped(setup.over, reading), f"{where}.over")


def _mapped(selector: dict, reading) -> dict:
    """A variant selector with its cluster read as ``reading`` reads it."""
    if "cluster" not in selector:
        return selector
    return {**selector, "cluster": reading.cluster(str(selector["cluster"]))}


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

def evaluate(specs: list, sections: list, readings: rd.Readings = rd.NO_READINGS, runs: dict | None = None) -> list:
    """Every finding measured under every reading of the paper's setup and with today's strategies.

    ``sections``: the report's sections of the studies as written (report/build.py: Section); ``runs``: run
    label -> {study name: Section} of the studies run again with a reading's overrides (report/readings.py).
    The findings come back scored (``score``): each knows the best reading and what reproducing ones share.
    """
    by_name = {s.study.name: s for s in sections}
    runs = {"": by_name, **(runs or {})}
    every = readings.all()
    retimes, sims, memo = {}, {}, {}
    out = []
    for index, spec in enumerate(specs):
        values = {}
        for reading in every:
            setup = spec.paper_setup
            applies = readings.applies(setup.study)
            label = reading.run_label_for(rd.has_tier(by_name[setup.study].study)) if applies else ""
            section = runs[label][setup.study]
            here = reading if applies else rd.Reading(())
            key = (index, id(section), _relevant(spec, section.study, here))
            if key not in memo:
                roles = rd.roles(section.study, readings) if applies else None
                memo[key] = _tidy(_measure_under(spec, section, setup, here, roles, retimes, sims))
            values[rd.reading_name(reading)] = memo[key]
        modern = _tidy(measure(spec, by_name[spec.modern_setup.study], spec.modern_setup))
        out.append(Finding(spec, values, modern, literal=rd.reading_name(every[0])))
    score(out, readings)
    return out


def _relevant(spec: FindingSpec, study, reading) -> tuple:
    """What of ``reading`` can change ``spec``'s value in ``study``: its strategy selections, its costing, and the
    grids, clusters and device counts of the clusters the finding reads (of every cluster where it compares
    them all): readings that agree on these give the same value, computed once."""
    selectors = [spec.paper_setup.variant, spec.paper_setup.over]
    named = [str(sel["cluster"]) for sel in selectors if "cluster" in sel]
    if spec.measure in ("max-speedup", "spread") or not named:
        named = list(dict.fromkeys(v.cluster.name for v in study.variants))
    mp, devices = reading.mp, reading.devices
    return (tuple(sorted(reading.strategy.items())), reading.cost,
            tuple((c, reading.cluster(c), mp.get(c), devices.get(c)) for c in named))


def _measure_under(spec: FindingSpec, section, setup: Setup, reading, roles, retimes: dict, sims: dict) -> Value:
    """The value of ``spec`` in ``section`` under ``reading``: its rows, its clusters, its costing (``roles``: the
    clusters findings name, readings.roles; None: the study is not read)."""
    study, data = section.study, section.data
    if reading.cost != "comet-dse":
        key = (id(section), reading.cost)
        if key not in retimes:
            retimes[key] = rd.retimed(data, study, reading.cost, sims)
        data = retimes[key]
        if data is None:
            return Value(None, "not costed: the published simulator has no remote-memory roofline")
    rows = rd.mask(data, study, reading)
    selected = Setup(study=setup.study, variant=_mapped(setup.variant, reading), over=_mapped(setup.over, reading),
                     where=setup.where)
    clusters = None if roles is None else {reading.cluster(c) for c in roles}
    return _measure(spec, study, data, selected, rows, clusters)


def _tidy(value: Value) -> Value:
    """The note without a leading separator (notes are built from optional parts)."""
    return Value(value.value, value.note.lstrip("; "), value.strict, value.rise)


def measure(spec: FindingSpec, section, setup: Setup) -> Value:
    """The value of ``spec.measure`` in one setup (the study as written), with its note."""
    rows = np.ones(len(section.data["variant"]), dtype=bool)
    return _measure(spec, section.study, section.data, setup, rows, None)


def _measure(spec: FindingSpec, study, data, setup: Setup, rows, clusters) -> Value:
    """The value of ``spec.measure`` from ``data``'s ``rows`` (``clusters``: the variants' clusters an across-variant
    measure compares; None: every variant)."""
    rows = rows.copy()
    for column, allowed in setup.where.items():
        rows &= np.isin(data[column], allowed)
    if spec.measure in ("max-speedup", "spread"):
        return _across_variants(spec.measure, study, data, rows, clusters)
    variant = variant_of(study, setup.variant, spec.finding)
    if spec.measure == "speedup":
        return _speedup(spec, data, variant, variant_of(study, setup.over, spec.finding), rows)
    return _split_measure(spec, data, variant, rows)


def _split_measure(spec: FindingSpec, data, variant, rows) -> Value:
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
        curve = [(s.mp, s.name, float(times[s.any_memory_row])) for s in runnable]
        tolerated = bathtub(curve)
        return Value(tolerated.value, tolerated.note, bathtub(curve, 0.0).value, tolerated.rise)
    if spec.measure == "best-split":
        if fits:
            return Value(min(fits, key=lambda s: times[s.row]).name, note)
        if not runnable:
            return Value(None, "no valid split")
        fastest = min(runnable, key=lambda s: times[s.any_memory_row])
        return Value(None, f"{_nothing_fits(variant, runnable)}; memory ignored the fastest is {fastest.name}" + note)
    if not runnable:
        return Value(None, "no valid split")
    return Value(min(runnable, key=lambda s: times[s.any_memory_row]).name, note)


def bathtub(curve: list, tolerance: float = BATHTUB_TOLERANCE) -> Value:
    """'yes' when the fastest of ``curve`` [(MP, name, seconds)] is an inner split and both the smallest and the
    largest MP take more than (1 + ``tolerance``) times as long; 'no' otherwise (a side within the tolerance is
    flat). None with fewer than three splits."""
    order = sorted(curve)
    if len(order) < 3:
        return Value(None, "fewer than three valid splits")
    t = [c[2] for c in order]
    low = int(np.argmin(t))
    left, right = t[0] / t[low], t[-1] / t[low]
    tub = 0 < low < len(t) - 1 and left > 1.0 + tolerance and right > 1.0 + tolerance

    def side(i, ratio):
        flat = " (flat: within {:.0%})".format(tolerance) if ratio <= 1.0 + tolerance and i != low else ""
        return f"{order[i][1]} {ratio:.2f}x{flat}"

    return Value("yes" if tub else "no", f"memory ignored: fastest {order[low][1]}; {side(0, left)}, "
                                         f"{side(len(t) - 1, right)}", rise=max(t) / t[low])


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
    return f"; the paper's {mine.name} {fit}, {float(times[mine.any_memory_row]):.3g} s/step memory ignored"


def _best(data, variant_index: int, rows, feasible: bool = True):
    """Row of the variant's fastest strategy among ``rows`` (that fits, or that only memory rules out)."""
    ok = data["feasible"] if feasible else (data["infeasible_mask"] & ~analysis.MEMORY_BIT) == 0
    sel = np.flatnonzero((data["variant"] == variant_index) & rows & ok)
    return int(sel[np.argmax(data["tokens_per_second"][sel])]) if len(sel) else None


def _speedup(spec: FindingSpec, data, variant, over, rows) -> Value:
    base, row = _best(data, over.index, rows), _best(data, variant.index, rows)
    speed = data["tokens_per_second"]
    if base is None or row is None:
        free, free_base = _best(data, variant.index, rows, False), _best(data, over.index, rows, False)
        empty = over.label if base is None else variant.label
        note = f"nothing fits on {empty}"
        if free is not None and free_base is not None:
            note += (f"; memory ignored {_split_name(data, free)} over {_split_name(data, free_base)}: "
                     f"{speed[free] / speed[free_base]:.2f}x")
        return Value(None, note)
    note = f"{_split_name(data, row)} over {_split_name(data, base)}"
    split = analysis.splits(data, variant.index, rows)
    paper = next((s for s in split if s.name == spec.paper_split and s.any_memory_row is not None), None)
    if paper is not None and paper.name != _split_name(data, row):
        need = "" if paper.feasible else f", needs {paper.least_memory / GiB:.1f} GiB per device"
        note += (f"; the paper's {paper.name} would be {speed[paper.any_memory_row] / speed[base]:.2f}x"
                 f"{need}")
    return Value(float(speed[row] / speed[base]), note)


def _split_name(data, row: int) -> str:
    return f"MP{int(data['tp'][row] * data['pp'][row])}_DP{int(data['dp'][row])}"


def _across_variants(kind: str, study, data, rows, clusters) -> Value:
    """max-speedup: the best variant over the baseline; spread: the fastest variant over the slowest, of the
    variants on which something fits (``clusters``: those of these clusters only; None: all)."""
    speed, labels, empty = {}, {}, []
    for v in study.variants:
        if clusters is not None and v.cluster.name not in clusters:
            continue
        row = _best(data, v.index, rows)
        if row is None:
            empty.append(v.label)
            continue
        speed[v.index], labels[v.index] = float(data["tokens_per_second"][row]), v.label
    if kind == "max-speedup":
        base = _best(data, study.baseline, rows)
        if base is None or not speed:
            return Value(None, "nothing fits on the baseline")
        top = max(speed, key=speed.get)
        return Value(speed[top] / float(data["tokens_per_second"][base]), f"{labels[top]}")
    note = f"; nothing fits on {', '.join(empty)}" if empty else ""
    if len(speed) < 2:
        return Value(None, "fewer than two variants on which something fits" + note)
    fast, slow = max(speed, key=speed.get), min(speed, key=speed.get)
    return Value(speed[fast] / speed[slow], f"{labels[fast]} over {labels[slow]}" + note)


# --- scoring --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scorecard:
    """How many findings each reading reproduces (by reading name, in the order of ``Readings.all``), with and
    without the tolerances; the declared reading (the headline), the best and the literal ones; and the pairs of
    findings that no single reading reproduces together (numbers from 1)."""

    scores: dict
    best: str
    literal: str
    total: int
    declared: str = ""
    strict: dict = None
    incompatible: tuple = ()

    @property
    def headline(self) -> str:
        """The reading the score is stated for: the declared one, else the literal one."""
        return self.declared or self.literal

    def distribution(self) -> dict:
        """score -> how many readings have it, highest first."""
        out = {}
        for n in self.scores.values():
            out[n] = out.get(n, 0) + 1
        return dict(sorted(out.items(), reverse=True))


def score(table: list, readings: rd.Readings = rd.NO_READINGS) -> Scorecard | None:
    """Count each reading's reproduced findings (with and without the tolerances), name the declared reading, the
    best one (the most findings; of those, the fewest answers away from the literal reading, then the first) and
    the pairs of findings no reading reproduces together; tell every finding the declared and best readings, what
    the readings that reproduce it share and which findings it cannot be reproduced with (``Finding.declared``,
    ``best``, ``conditions``, ``incompatible``)."""
    if not table:
        return None
    every = readings.all()
    names = [rd.reading_name(r) for r in every]
    decidable = [f for f in table if f.status != "not determinable"]
    scores = {n: sum(1 for f in decidable if matches(f.spec.paper, f.values[n].value, f.spec.unit)) for n in names}
    strict = {n: sum(1 for f in decidable if matches_strict(f.spec.paper, f.values[n].untolerated, f.spec.unit))
              for n in names}
    distance = {rd.reading_name(r): (readings.distance(r) if readings.questions else 0) for r in every}
    best = min(names, key=lambda n: (-scores[n], distance[n], names.index(n)))
    chosen = readings.declared_reading()
    declared = rd.reading_name(chosen) if chosen is not None else ""
    by_name = dict(zip(names, every))
    under = {id(f): set(f.reproduced_under()) for f in table}
    pairs = tuple((i + 1, j + 1) for i, a in enumerate(table) for j, b in enumerate(table) if i < j
                  and a in decidable and b in decidable and under[id(a)] and under[id(b)]
                  and not under[id(a)] & under[id(b)])
    for i, f in enumerate(table):
        f.best, f.declared = best, declared
        f.incompatible = tuple(b if a == i + 1 else a for a, b in pairs if i + 1 in (a, b))
        f.conditions = _shared(readings, [by_name[n] for n in names if n in under[id(f)]],
                               [by_name[n] for n in names if n not in under[id(f)]])
    return Scorecard(scores=scores, best=best, literal=names[0], total=len(table), declared=declared,
                     strict=strict, incompatible=pairs)


def _shared(readings: rd.Readings, under: list, others: list) -> str:
    """What reproducing a finding takes: the answers every reading in ``under`` (those that reproduce it) gives
    where a question's answers are not all among them; where no single answer decides, the answers every one
    of ``others`` gives ('except ...'). '' when every reading reproduces it or none does."""
    if not under or not others or not readings.questions:
        return ""

    def narrowed(group: list) -> list:
        parts = []
        for i, (question, answers) in enumerate(readings.questions):
            given = {r.answers[i].name for r in group}
            if len(given) < len(answers):
                parts.append(f"{question}: {' or '.join(a.name for a in answers if a.name in given)}")
        return parts

    parts = narrowed(under)
    if parts:
        return "; ".join(parts)
    parts = narrowed(others)
    return f"all but the readings with {' and '.join(parts)}" if parts else "no single answer decides it"


# --- output ---------------------------------------------------------------------------------------

def text(value, unit: str) -> str:
    """A value as the table writes it: a split, yes/no, or a ratio '3.08x' ('-' when there is none); a ratio as
    findings.json holds it (``_plain``), so that the table and the JSON read the same."""
    if value is None:
        return "-"
    return f"{float(_plain(float(value))):.2f}x" if unit == "x" else str(value)


text_of = text    # the name Finding.span uses (its local ``text`` is a string)
