"""Readings: every public reading of a paper's setup, each a global set of study overrides.

A report folder's report.yaml may hold a ``readings:`` block (studies/README.md): the studies it applies to, and
questions, each with its answers; an answer is a set of overrides of those studies, defined from public evidence
(docs/case-studies.md, "Readings"). A **reading** takes one answer per question; the report evaluates every finding
under every combination (``Readings.all``), the first answer of each question making the *literal* reading.

An answer may set

- ``seq_len`` and ``global_batch``: the studies are run again with them (their own results);
- ``expansion: {field: value}``: the studies that have an expansion tier are run again with these fields merged
  into their ``expansion:`` (e.g. ``compute``, the tier's compute roof); the others are not affected;
- ``strategy: {knob: value}``: the rows with that value of a knob the study searches;
- ``mp: {cluster: [MP, ...]}``: the rows of that cluster's splits on the grid (the study field ``mp:``);
- ``clusters: {cluster: other}``: where a finding names ``cluster``, the reading reads ``other`` (a cluster of the
  same study);
- ``devices: {cluster: n}``: that cluster's rows at n devices (one of the study's counts);
- ``cost: gemm`` or ``cost: elementwise``: the rows' times costed as the COMET authors' simulator does
  (comet_dse/cost/astrasim.py), with Layernorm as their file writes it or element-wise; memory stays comet-dse's.

The selections (strategy, mp, clusters, devices) restrict the sweep of the study as written: the study must search
every value an answer selects, so that a selection equals a run with that override (tests/test_readings.py checks
one). That way the COMET report's 864 readings cost two sweeps per study (four of the one with an expansion tier),
not 864.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from comet_dse.base.errors import InputError
from comet_dse.base.loading import Fields
from comet_dse.strategy.declared import KNOB

RUN_KEYS = ("seq_len", "global_batch", "expansion")
TIER_RUN_KEYS = ("expansion",)    # run keys that change only a study with an expansion tier
COSTS = ("comet-dse", "gemm", "elementwise")
# Knobs that only matter where a cluster has an expansion tier: a study without one need not search them.
TIER_KNOBS = ("expansion_overlap", "expansion_roofline")


@dataclass(frozen=True)
class Answer:
    """One answer to one question: its overrides, what it assumes and on what evidence."""

    question: str
    name: str
    assumes: str = ""
    evidence: str = ""
    run: tuple = ()                 # ((key, value), ...): study fields to run again with
    strategy: tuple = ()            # ((knob, value name), ...)
    mp: tuple = ()                  # ((cluster, (MP, ...)), ...)
    clusters: tuple = ()            # ((cluster, the reading's cluster), ...)
    devices: tuple = ()             # ((cluster, count), ...)
    cost: str = "comet-dse"


@dataclass(frozen=True)
class Reading:
    """One answer per question, in the order of the questions."""

    answers: tuple

    @property
    def name(self) -> str:
        return " ".join(a.name for a in self.answers)

    @property
    def run(self) -> tuple:
        return tuple(kv for a in self.answers for kv in a.run)

    def run_label_for(self, tier: bool) -> str:
        """The answers that change the sweep of a study with (``tier``) or without an expansion tier, joined ('' when
        none does): the suffix of its results. Without a tier the answers that only change one (``TIER_RUN_KEYS``)
        are left out."""
        return "+".join(a.name for a in self.answers if _runs_again(a, tier))

    def overrides_for(self, tier: bool) -> dict:
        """The study fields a study with or without an expansion tier runs again with (``run_label_for``); a
        mapping's fields are given as a dict (load_study merges it into the study's own)."""
        return {k: dict(v) if k in TIER_RUN_KEYS else v for a in self.answers for k, v in a.run
                if tier or k not in TIER_RUN_KEYS}

    @property
    def strategy(self) -> dict:
        return {k: v for a in self.answers for k, v in a.strategy}

    @property
    def mp(self) -> dict:
        return {k: v for a in self.answers for k, v in a.mp}

    @property
    def clusters(self) -> dict:
        return {k: v for a in self.answers for k, v in a.clusters}

    @property
    def devices(self) -> dict:
        return {k: v for a in self.answers for k, v in a.devices}

    @property
    def cost(self) -> str:
        return next((a.cost for a in self.answers if a.cost != "comet-dse"), "comet-dse")

    def cluster(self, name: str) -> str:
        """The cluster this reading reads where a finding names ``name``."""
        return self.clusters.get(name, name)


@dataclass(frozen=True)
class Readings:
    """The readings block: the studies it applies to and its questions (question, (Answer, ...))."""

    studies: tuple
    questions: tuple = ()
    firsts: dict = field(default_factory=dict)      # question -> its first (literal) answer's name
    declared: tuple = ()                            # ((question, answer name, evidence), ...): the declared reading

    def declared_reading(self) -> Reading | None:
        """The declared reading (``declare``), or None where none is declared."""
        if not self.declared:
            return None
        chosen = {q: name for q, name, _ in self.declared}
        return Reading(tuple(next(a for a in answers if a.name == chosen[q]) for q, answers in self.questions))

    def all(self) -> list:
        """Every reading, in product order (the literal one first)."""
        if not self.questions:
            return [Reading(())]
        return [Reading(combo) for combo in itertools.product(*(answers for _, answers in self.questions))]

    def distance(self, reading: Reading) -> int:
        """Answers of ``reading`` that are not the literal ones."""
        return sum(1 for a in reading.answers if a.name != self.firsts[a.question])

    def runs(self, tier: bool = True) -> dict:
        """run label -> the study overrides of that run ('' -> none: the studies as written), for a study with
        (``tier``) or without an expansion tier."""
        out = {}
        for r in self.all():
            out.setdefault(r.run_label_for(tier), r.overrides_for(tier))
        return out

    def applies(self, study_name: str) -> bool:
        return study_name in self.studies


def _runs_again(answer: Answer, tier: bool) -> bool:
    """True where ``answer`` changes the sweep of a study with (``tier``) or without an expansion tier."""
    return any(tier or k not in TIER_RUN_KEYS for k, _ in answer.run)


def has_tier(study) -> bool:
    """True where some variant of ``study`` has an expansion tier (its tier answers can change it)."""
    return any(v.cluster.accelerator.expansion is not None for v in study.variants)


NO_READINGS = Readings(studies=())
AS_WRITTEN = "as written"       # the one reading of a report without a readings block


def reading_name(reading: Reading) -> str:
    return reading.name or AS_WRITTEN


def from_yaml(raw, prefix: str = "report.readings") -> Readings:
    """The ``readings:`` block of report.yaml, every field checked (errors name it)."""
    f = Fields(raw, prefix)
    studies = tuple(str(s) for s in _list(f.raw("studies"), f.name("studies")))
    questions, firsts = [], {}
    for i, q in enumerate(_list(f.raw("questions"), f.name("questions"))):
        qf = Fields(q, f"{prefix}.questions[{i}]")
        title = qf.text("question")
        answers = tuple(_answer(Fields(a, f"{qf.prefix}.answers[{j}]"), title)
                        for j, a in enumerate(_list(qf.raw("answers"), qf.name("answers"))))
        names = [a.name for a in answers]
        if len(set(names)) != len(names):
            raise InputError(qf.name("answers"), "names an answer twice")
        qf.reject_unknown()
        questions.append((title, answers))
        firsts[title] = answers[0].name
    f.reject_unknown()
    every = [a.name for _, answers in questions for a in answers]
    if len(set(every)) != len(every):
        raise InputError(f.name("questions"), "two answers share a name; a reading's name lists its answers")
    return Readings(studies=studies, questions=tuple(questions), firsts=firsts)


def declare(readings: Readings, raw, prefix: str) -> Readings:
    """``readings`` with its declared reading: ``raw`` is the declared-reading file ({answers: {question: {answer,
    evidence}}}), one answer, with its evidence, to every question of the readings block (errors name the field)."""
    from dataclasses import replace

    f = Fields(raw, prefix)
    given = f.sub("answers")
    declared = []
    for question, answers in readings.questions:
        if not given.has(question):
            raise InputError(f"{given.prefix}.{question}", "is missing: the declared reading answers every question "
                             f"of report.yaml's readings ({', '.join(q for q, _ in readings.questions)})")
        qf = given.sub(question)
        name = qf.text("answer")
        if name not in {a.name for a in answers}:
            raise InputError(qf.name("answer"), f"must be one of {', '.join(a.name for a in answers)}, got {name!r}")
        evidence = qf.text("evidence", "")
        if not evidence.strip():
            raise InputError(qf.name("evidence"), "is missing: every declared answer states its public evidence")
        if qf.has("reviews"):
            evidence += "".join(_review(Fields(item, f"{qf.name('reviews')}[{i}]"))
                                for i, item in enumerate(_list(qf.raw("reviews"), qf.name("reviews"))))
        qf.reject_unknown()
        declared.append((question, name, evidence))
    given.reject_unknown()
    f.reject_unknown()
    if not readings.questions:
        raise InputError(prefix, "declares a reading, but report.yaml has no readings block to read")
    return replace(readings, declared=tuple(declared))


def _review(f: Fields) -> str:
    """One dated review of a declared answer ({date, evidence, outcome}: the evidence weighed after the declaration
    and what became of the answer, kept or revised), as the text shown after the answer's evidence. A revised
    answer keeps its first declaration visible: the review says what it was."""
    date, weighed, outcome = f.text("date"), f.text("evidence"), f.text("outcome")
    f.reject_unknown()
    return f" [Reviewed {date}: {weighed.strip()} Outcome: {outcome.strip()}]"


def _list(value, where: str) -> list:
    if not isinstance(value, list) or not value:
        raise InputError(where, "must be a non-empty list")
    return value


def _answer(f: Fields, question: str) -> Answer:
    name = f.text("name")
    if not name or " " in name:
        raise InputError(f.name("name"), f"must be one word (it names the answer in reading names), got {name!r}")
    s = f.sub("set") if f.has("set") else Fields({}, f.name("set"))
    run = tuple((k, _run_value(s, k)) for k in RUN_KEYS if s.has(k))
    strategy = ()
    if s.has("strategy"):
        st = s.sub("strategy")
        for knob, value in st.data.items():
            if knob not in KNOB:
                raise InputError(f"{st.prefix}.{knob}", "is not a strategy knob")
            try:
                coerced = KNOB[knob].coerce(value)
            except ValueError as exc:
                raise InputError(f"{st.prefix}.{knob}", str(exc)) from None
            strategy += ((knob, _cell(coerced)),)
            st.raw(knob)
    mp = tuple((str(c), tuple(int(x) for x in _list(v, f"{s.name('mp')}.{c}")))
               for c, v in (s.raw("mp", {}) or {}).items())
    clusters = tuple((str(k), str(v)) for k, v in (s.raw("clusters", {}) or {}).items())
    devices = tuple((str(k), int(v)) for k, v in (s.raw("devices", {}) or {}).items())
    cost = str(s.raw("cost", "comet-dse"))
    if cost not in COSTS:
        raise InputError(s.name("cost"), f"must be one of {', '.join(COSTS)}, got {cost!r}")
    s.reject_unknown()
    answer = Answer(question=question, name=name, assumes=f.text("assumes", ""), evidence=f.text("evidence", ""),
                    run=run, strategy=strategy, mp=mp, clusters=clusters, devices=devices, cost=cost)
    f.reject_unknown()
    return answer


def _run_value(s: Fields, key: str):
    """An answer's run value: as given, but ``expansion`` a non-empty mapping, kept as sorted (field, value)
    pairs (a Reading stays hashable); its fields are checked where the study is loaded with them."""
    value = s.raw(key)
    if key not in TIER_RUN_KEYS:
        return value
    if not isinstance(value, dict) or not value:
        raise InputError(s.name(key), "must be a mapping of expansion-tier fields, e.g. {compute: 10 TFLOP/s}")
    return tuple(sorted((str(k), v) for k, v in value.items()))


def _cell(value):
    """A knob value as the report's data columns hold it: a choice by name, a switch as a bool."""
    return value.value if hasattr(value, "value") and not isinstance(value, bool) else value


def check(readings: Readings, studies: list) -> None:
    """Before anything runs: every study the block names is in the folder, and every selection an answer makes
    is one its studies can make (a cluster, device count or knob value they search)."""
    by_name = {s.name: s for s in studies}
    for name in readings.studies:
        if name not in by_name:
            raise InputError("report.readings.studies", f"no study {name!r} in the folder; it has "
                             f"{', '.join(sorted(by_name))}")
    for _, answers in readings.questions:
        for a in answers:
            where = f"report.readings: answer {a.name}"
            for study in (by_name[n] for n in readings.studies):
                clusters = {v.cluster.name for v in study.variants}
                for knob, value in a.strategy:
                    searched = study.space.values.get(knob, KNOB[knob].search)
                    if not isinstance(searched, tuple):
                        raise InputError(where, f"selects {knob}, which the studies enumerate; select a listed knob")
                    if value not in {_cell(v) for v in searched}:
                        if not (knob in TIER_KNOBS and not has_tier(study)):
                            raise InputError(where, f"selects {knob} {value}, which study {study.name} does not "
                                             f"search (it tries {', '.join(str(_cell(v)) for v in searched)})")
                for literal, other in a.clusters:
                    if literal in clusters and other not in clusters:
                        raise InputError(where, f"reads {other} for {literal}, which study {study.name} does not "
                                         "run; add it to its clusters")
                for cluster, count in a.devices:
                    if cluster not in clusters:
                        continue
                    readable = {cluster} | {o for _, ans in readings.questions for b in ans
                                            for lit, o in b.clusters if lit == cluster}
                    for v in study.variants:
                        if v.cluster.name in readable and count not in v.devices:
                            raise InputError(where, f"selects {count} devices of {v.cluster.name}; study "
                                             f"{study.name} runs {', '.join(map(str, v.devices))}")


def roles(study, readings: Readings) -> list:
    """The clusters of a study that findings name (the literal ones): its clusters less those only an answer
    reads in place of another."""
    targets = {other for _, answers in readings.questions for a in answers for literal, other in a.clusters
               if other != literal}
    names = list(dict.fromkeys(v.cluster.name for v in study.variants))
    return [n for n in names if n not in targets] or names


def mask(data: dict, study, reading: Reading) -> np.ndarray:
    """The rows of a study's results that ``reading`` selects (its strategy values, MP grids and device counts)."""
    rows = np.ones(len(data["variant"]), dtype=bool)
    tierless = not has_tier(study)
    for knob, value in reading.strategy.items():
        if knob in data and not (knob in TIER_KNOBS and tierless):     # a tier knob cannot matter without a tier
            rows &= data[knob] == value
    mp = data["tp"] * data["pp"]
    by_cluster = {}
    for v in study.variants:
        by_cluster.setdefault(v.cluster.name, []).append(v.index)
    for literal, grid in reading.mp.items():
        for index in by_cluster.get(reading.cluster(literal), []):
            rows &= ~((data["variant"] == index) & ~np.isin(mp, grid))
    for literal, count in reading.devices.items():
        for index in by_cluster.get(reading.cluster(literal), []):
            rows &= ~((data["variant"] == index) & (data["devices"] != count))
    return rows


def retimed(data: dict, study, layernorm: str, cache: dict) -> dict | None:
    """``data`` with every row's step time and tokens/s as the COMET authors' simulator gives them for its split
    (comet_dse/cost/astrasim.py: one iteration of their 2-block workload); None where a variant has an expansion tier
    (the published simulator cannot cost one). ``cache``: (variant, devices, MP, batch) -> seconds."""
    from comet_dse.cost.astrasim import iteration

    if any(v.cluster.accelerator.expansion is not None and v.cluster.accelerator.expansion.capacity > 0
           for v in study.variants):
        return None
    model = study.models[0]
    out = dict(data)
    times = np.empty(len(data["variant"]))
    keys = np.stack([data["variant"], data["devices"], data["tp"] * data["pp"], data["global_batch"]], axis=1)
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    for i, (variant, devices, mp, batch) in enumerate(unique.astype(int)):
        key = (study.name, layernorm, variant, devices, mp, batch)
        if key not in cache:
            cluster = study.variants[variant].cluster
            cache[key] = iteration(model, cluster, devices, mp, batch, layernorm).total
        times[inverse.reshape(-1) == i] = cache[key]
    out["step_time_s"] = times
    out["tokens_per_second"] = data["global_batch"] * model.seq_len / times
    return out
