"""The strategy space: every parallelisation of a model on a number of devices.

Degrees are enumerated so that tp * pp * dp = devices always holds; every
other rule (heads divisibility, batch divisibility, interleaving, memory) is
left to the cost model's validity rules, so that a search can report how many
points each rule excluded. Choices that cannot change the result are not
enumerated twice: a knob that does not apply to a point (``Knob.applies``:
sequence parallelism with tp = 1, ZeRO stages with dp = cp = 1, ...) keeps only its
first value there, and interleaving is tried only with pp > 1.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from comet_dse.base.bounds import BOUNDS
from comet_dse.base.errors import InputError
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays, combinations
from comet_dse.strategy.declared import CROSS_RULES, KNOB, KNOBS
from comet_dse.strategy.knob import DERIVED, GIVEN
from comet_dse.workload.families import family_of
from comet_dse.workload.family import TooManyRows

MAX_INNER = 1_000_000  # combinations of the non-degree knobs' value lists (held in memory per search)
COUNT_BLOCK_ROWS = 2_000_000   # rows built at a time when counting
MAX_STRATEGIES = BOUNDS["strategies"].high   # rows one search, what-if or explorer request builds at once


@dataclass(frozen=True)
class SearchSpace:
    """Which values each strategy knob may take: axes (knob -> values) over the declared knobs.

    values: knob name -> tuple of values to try (a knob with one value is
      fixed for the whole search). A knob not named takes its declared
      search values (``Knob.search``): every valid value for the DERIVED
      degrees (tp, pp, dp: divisors of the device count; cp: divisors of the
      sequence that leave at least 4096 tokens per device; ep: common divisors
      of the experts and dp for MoE models; micro_batch: divisors of the
      per-replica batch up to max_micro_batch; interleave: divisors of the
      layers per stage up to max_interleave), the declared tuple otherwise
      (recompute: all three, sequence_parallel: off and on, zero: 0-3; every
      other knob its default). The global batch is given per search, not here.
    mp: the model-parallel degrees MP = tp * pp allowed (None: any), a split
      constraint over two knobs (with ``values["dp"]``: the MP x DP split).
    max_tp: the largest TP degree enumerated when ``values`` names no tp (None: any); the searches set it
      to the scale-up domain (``with_cluster_defaults``).
    ``SearchSpace.of(tp=(4, 8), recompute=("full",))`` builds one from keywords.
    """

    values: dict = field(default_factory=dict)
    max_micro_batch: int = 16
    max_interleave: int = 8
    mp: tuple | None = None
    max_tp: int | None = None

    @classmethod
    def of(cls, max_micro_batch: int = 16, max_interleave: int = 8, mp=None, **values) -> "SearchSpace":
        return cls(values, max_micro_batch, max_interleave, mp)

    def __post_init__(self) -> None:
        checked = {}
        for name, items in self.values.items():
            where = f"strategy.{name}"
            if name not in KNOB or KNOB[name].search == GIVEN:
                known = ", ".join(k.name for k in KNOBS if k.search != GIVEN)
                raise InputError(where, f"is not a strategy knob a search varies; knobs: {known}")
            items = tuple(items) if isinstance(items, (list, tuple)) else (items,)
            if not items:
                raise InputError(where, "is an empty list; give at least one value")
            try:
                checked[name] = tuple(dict.fromkeys(KNOB[name].coerce(x) for x in items))
            except ValueError as exc:
                raise InputError(where, str(exc)) from None
        object.__setattr__(self, "values", checked)
        object.__setattr__(self, "mp", _degrees(self.mp, "strategy.mp"))
        if self.max_tp is not None and (isinstance(self.max_tp, bool) or not isinstance(self.max_tp, int)
                                        or self.max_tp < 1):
            raise InputError("strategy.max_tp", f"must be a positive integer, got {self.max_tp!r}")
        for attr in ("max_micro_batch", "max_interleave"):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"strategy.{attr}", f"must be a positive integer, got {value!r}")
        for names, holds, message in CROSS_RULES:
            for combo in combinations({n: self.choices(n) for n in names}):
                if not holds(_Point(combo)):
                    raise InputError(f"strategy.{names[0]}", f"{message}, but the search would combine "
                                     + " with ".join(f"{n} {_text(v)}" for n, v in combo.items()))

    def given(self, name: str):
        """The values the user gave for a knob, or None (then the knob's declared search values apply)."""
        return self.values.get(name)

    def choices(self, name: str) -> tuple:
        """The values tried for a knob that is not DERIVED: the given ones, or its declared search tuple."""
        knob = KNOB[name]
        if knob.search in (DERIVED, GIVEN):
            raise ValueError(f"{name} is enumerated from the model and devices, not chosen from a list")
        return self.values.get(name, knob.search)


def scale_up_domain(cluster: Cluster, devices: int) -> int:
    """Devices of one scale-up domain in a job of ``devices`` devices: the size the innermost network dimension
    takes for that job (an NVLink/NVSwitch domain: 8 on a DGX, 72 on a GB200 NVL72; one ICI axis of a TPU
    torus; an Infinity Fabric or Gaudi node), where TP's per-layer collectives run at the fastest links."""
    return int(cluster.dim_sizes(devices)[0])


def _knob_defaults(values: dict, clusters: list) -> dict:
    """``values`` with, for every knob it does not name that declares a ``cluster_default``, what that default
    gives for the accelerators of ``clusters`` (strategy/declared.py: flash attention on where every accelerator lists
    a fused-kernel rate, and a kernel they all list)."""
    accelerators = [c.accelerator for c in clusters]
    out = dict(values)
    for knob in KNOBS:
        if knob.cluster_default is not None and knob.name not in out:
            chosen = knob.cluster_default(accelerators)
            if chosen is not None:
                out[knob.name] = chosen
    return out


def with_cluster_defaults(space: SearchSpace, cluster: Cluster, devices: int,
                          tp_across_nodes: bool = False) -> SearchSpace:
    """``space`` with the defaults of a search that depend on the cluster (docs/design-space.md, "Defaults"):

    - each knob the space does not name takes its declared cluster default (``_knob_defaults``: flash
      attention on where the accelerator lists a fused-kernel rate; ``--flash-attention off`` keeps it off);
    - TP no larger than the scale-up domain (``scale_up_domain``), unless the space names tp values (an
      explicit list beyond it is tried as given), an MP constraint (MP = TP x PP), pure model parallelism, or
      ``tp_across_nodes``.
    """
    values = _knob_defaults(space.values, [cluster])
    pure = values.get("model_parallel") is not None and any(str(v) == "pure-mp" for v in values["model_parallel"])
    asked = tp_across_nodes or "tp" in values or space.mp is not None or pure
    max_tp = None if asked else scale_up_domain(cluster, devices)
    return dataclasses.replace(space, values=values, max_tp=max_tp)


def with_study_defaults(space: SearchSpace, clusters: list) -> SearchSpace:
    """A study's ``strategy:`` space with the knobs' cluster defaults for every base cluster at once
    (``_knob_defaults``: flash attention only where all of them list a kernel they share). The scale-up rule
    of searches is not applied: a study searches what its file says (studies/README.md)."""
    return dataclasses.replace(space, values=_knob_defaults(space.values, clusters))


def _degrees(items, where: str) -> tuple | None:
    """``items`` (one positive integer or a list of them, None for any) as a tuple without repeats."""
    if items is None:
        return None
    items = tuple(items) if isinstance(items, (list, tuple)) else (items,)
    if not items or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1 for x in items):
        raise InputError(where, f"must be positive integers, got {list(items)!r}")
    return tuple(dict.fromkeys(int(x) for x in items))


class _Point:
    """Attribute access over a dict of knob values (for the CROSS_RULES)."""

    def __init__(self, values: dict):
        self.__dict__.update(values)


def _text(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _inner_codes(space: SearchSpace) -> tuple:
    """(knobs, {knob: codes}): every combination of the non-degree knobs' values, as code columns."""
    chosen = [k for k in KNOBS if k.search not in (DERIVED, GIVEN)]
    n = math.prod(len(space.choices(k.name)) for k in chosen)
    if n > MAX_INNER:
        listed = ", ".join(f"{k.name} ({len(space.choices(k.name))})" for k in chosen if len(space.choices(k.name)) > 1)
        raise InputError("strategy", f"the value lists of {listed} combine into {n:,} strategies per degree split; "
                         f"at most {MAX_INNER:,}: shorten the lists")
    inner = combinations({k.name: space.choices(k.name) for k in chosen})
    return chosen, {k.name: np.array([k.encode(combo[k.name]) for combo in inner]) for k in chosen}


def _block(outer: list, degrees: tuple, chosen: list, codes: dict, global_batch: int) -> StrategyArrays:
    """Every outer row (the values of the knobs ``degrees``) with every inner combination (``codes``), before
    dropping repeats."""
    o = np.array(outer, dtype=float)
    n_inner = len(next(iter(codes.values()))) if codes else 1
    columns = {name: np.repeat(o[:, i], n_inner) for i, name in enumerate(degrees)}
    for k in chosen:
        columns[k.name] = np.tile(codes[k.name], len(o))
    columns["global_batch"] = np.full(len(o) * n_inner, float(global_batch))
    return StrategyArrays(columns)


def _keep(st: StrategyArrays, chosen: list, space: SearchSpace) -> np.ndarray:
    """False where a knob that does not apply (``Knob.applies``) takes other than its first value."""
    keep = np.ones(len(st), dtype=bool)
    for k in chosen:
        if k.applies is not None and len(space.choices(k.name)) > 1:
            first = k.encode(space.choices(k.name)[0])
            keep &= np.asarray(k.applies(st) | (getattr(st, k.name) == first), dtype=bool)
    return keep


def for_family(space: SearchSpace, family) -> SearchSpace:
    """``space`` with every knob the family's kernel does not read (``WorkloadFamily.reads``; not derived, not
    given) held at its default: a recommendation model's search does not multiply its points by recomputation
    or ZeRO stages, which change nothing of its cost."""
    if not family.reads:
        return space
    values = dict(space.values)
    for k in KNOBS:
        if k.search not in (DERIVED, GIVEN) and k.name not in family.reads:
            values[k.name] = (k.default,)
    return dataclasses.replace(space, values=values)


def enumerate_strategies(model: Transformer, devices: int, global_batch: int, space: SearchSpace,
                         limit: int | None = MAX_STRATEGIES) -> StrategyArrays:
    """Every strategy of ``space`` for ``model`` on ``devices`` devices, as arrays.

    The DERIVED degrees are enumerated by the model's workload family with their rules (outer rows,
    workload/family.py: degree_rows; a transformer's in workload/transformer.py); every
    other knob takes each of its values (inner rows, the product in the
    declaration order of the knobs). A point where a knob does not apply
    (``Knob.applies``) is kept only with that knob's first value.
    ``limit``: the most rows built (outer rows x inner combinations, before repeats are dropped; a search,
    what-if or explorer request holds them all in memory); a larger space is refused as soon as the
    enumeration passes it, before anything is built. A sweep, which builds its strategies per set and
    counts its points first (--max-points), passes None.
    """
    family = family_of(model)
    space = for_family(space, family)
    chosen, codes = _inner_codes(space)
    n_inner = len(next(iter(codes.values()))) if codes else 1
    try:
        outer = family.degree_rows(model, devices, global_batch, space, None if limit is None else limit // n_inner)
    except TooManyRows:
        raise InputError("strategy", f"the search holds more than {limit:,} strategies for {devices:,} devices "
                         f"(degree splits x micro-batches x {n_inner:,} combinations of the other knobs); at most "
                         f"{limit:,} are evaluated at once: give fewer values (--tp, --pp, --micro-batch, "
                         "--recompute, ...) or run a sweep, which evaluates in chunks") from None
    st = _block(outer, family.degree_columns, chosen, codes, global_batch)
    keep = _keep(st, chosen, space)
    return st if keep.all() else st.take(np.flatnonzero(keep))


def count_strategies(model: Transformer, devices: int, global_batch: int, space: SearchSpace,
                     limit: int | None = None) -> int:
    """len(enumerate_strategies(...)), computed a block of rows at a time so that memory stays bounded;
    stops early (with a count above ``limit``) once the count exceeds ``limit``."""
    family = family_of(model)
    space = for_family(space, family)
    outer = family.degree_rows(model, devices, global_batch, space)
    chosen, codes = _inner_codes(space)
    n_inner = len(next(iter(codes.values()))) if codes else 1
    step = max(1, COUNT_BLOCK_ROWS // n_inner)
    total = 0
    for i in range(0, len(outer), step):
        block = _block(outer[i:i + step], family.degree_columns, chosen, codes, global_batch)
        total += int(np.count_nonzero(_keep(block, chosen, space)))
        if limit is not None and total > limit:
            break
    return total
