"""What-if questions about one cluster: which resource, scaled, buys the most, and what capacity makes a split fit.

``whatif(model, cluster, devices, global_batch)`` searches every strategy (the same batched model as
``comet-dse search``) on the cluster as it is and on the cluster with each resource scaled by each
factor (default x0.5 and x2), and reports each variant's best step time and its speedup over the
cluster as it is. ``smallest_capacity`` answers "what HBM capacity makes MP64 x DP64 fit?": the
least value of a capacity resource at which the search space (e.g. one split, ``SearchSpace(mp=...)``)
holds a strategy that fits, found by bisection over that resource with the same validity rules.
Scaling a resource goes through answers/overrides.py, so every value is checked against the bounds a
cluster file's field is checked against; a factor that leaves them is a note in that cell, not an error.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from comet_dse.answers.overrides import _set_one, apply_overrides
from comet_dse.base import vocabulary
from comet_dse.base.errors import InputError
from comet_dse.base.tables import Tabular
from comet_dse.base.units import format_bytes
from comet_dse.design_space.search import strategy_at
from comet_dse.design_space.space import SearchSpace, enumerate_strategies
from comet_dse.design_space.table import RULES, evaluate_columns, reason_counts
from comet_dse.hardware.economics_block import amount
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.text import compact_text
from comet_dse.whole_run import economics
from comet_dse.workload.families import DEFAULT, family_of
from comet_dse.workload.family import WorkloadFamily

MEMORY_BIT = 1 << RULES.index("memory")
BISECTION_STEPS = 40          # halvings of the capacity interval: to well under 1 MiB of 4 TiB
DEFAULT_FACTORS = (0.5, 2.0)  # what each resource is scaled by unless asked otherwise
CAPACITY_RESOURCES = ("hbm_capacity", "sram_capacity", "expansion_capacity")   # what a capacity fit may vary


def default_resources(cluster: Cluster, model=None) -> list:
    """The resources a what-if scales by default: compute, HBM capacity and bandwidth, on-chip SRAM, the
    whole network's bandwidth and, with several network dimensions, each one's (per device, per
    direction: ``network.<dim>.bandwidth``); the expansion tier's capacity and bandwidth when the
    cluster has one, and its compute roof where it has one (``MemoryTier.compute``); for a recommendation
    ``model`` on a cluster with a host memory tier, its capacity and link bandwidth (the tier only its
    embedding rows use)."""
    names = ["peak_flops", "hbm_capacity", "hbm_bandwidth", "sram_capacity", "network_bandwidth"]
    if len(cluster.network) > 1:
        names += [f"network.{d.name}.bandwidth" for d in cluster.network]
    tier = cluster.accelerator.expansion
    if tier is not None:
        names += ["expansion_capacity", "expansion_bandwidth"] + (["expansion_compute"] if tier.compute else [])
    host = cluster.accelerator.host
    if host is not None and host.row_reads and getattr(model, "kind", None) == "recommendation":
        names += ["host_memory_capacity", "host_memory_bandwidth"]
    return names


@dataclass(frozen=True)
class Best:
    """The fastest strategy that fits on one cluster variant (or why none does)."""

    step_time_s: float | None
    tokens_per_second: float | None
    strategy: dict | None          # knob name -> value (choices by name), as Strategy.to_dict()
    strategy_text: str | None      # compact text, e.g. 'tp8 pp16 dp32 mb1 v1 selective sp z1'
    evaluated: int
    feasible: int
    note: str = ""                 # why nothing fits, when nothing does
    time_to_train_s: float | None = None      # with a token budget (whole_run/economics.py); None: none given or unknown
    energy_j: float | None = None
    training_cost_usd: float | None = None
    training: dict | None = None              # with a token budget: economics.training_of in full (the baseline's
                                              # carries its error band's ranges, economics.with_ranges)


@dataclass(frozen=True)
class Cell:
    """One resource scaled by one factor: the new value, the best strategy there and its speedup."""

    resource: str
    factor: float
    value: float | None            # the scaled value in SI units (None for a topology or out of range)
    step_time_s: float | None
    speedup: float | None          # baseline step time / this step time (None when either has no fit)
    strategy_text: str | None
    note: str = ""
    added_usd: float | None = None         # what the change adds to the cluster's price (None: no per-unit price)
    added_w: float | None = None           # ... to its draw while the resource is busy, PUE included (None: no per-unit power)
    speedup_per_musd: float | None = None  # (speedup - 1) per added million USD (None: no price, or it adds none:
                                           # a change that lowers the price is in usd_saved_per_slowdown_pct)
    speedup_per_kw: float | None = None    # (speedup - 1) per added kW (None where it adds none)
    time_to_train_s: float | None = None   # with a token budget: the scaled cluster's best strategy
    energy_j: float | None = None
    training_cost_usd: float | None = None
    usd_saved_per_slowdown_pct: float | None = None   # a change that lowers the price: USD saved per 1 % of speed
                                                      # it costs (inf: it costs none; None: it saves nothing)
    w_saved_per_slowdown_pct: float | None = None     # ... W of draw saved per 1 % of speed


@dataclass(frozen=True)
class CapacityFit:
    """The smallest value of a capacity resource at which the searched strategies hold one that fits."""

    resource: str
    constraint: str                # what was searched, e.g. "MP64 x DP64" or "any split"
    current: float                 # the cluster's value [bytes]
    smallest: float | None         # the least that fits [bytes] (None: nothing fits up to the bound)
    fits_now: bool
    strategy_text: str | None      # the strategy that fits at the smallest value
    note: str = ""
    split: str | None = None       # its parallel split, e.g. "TP8 x PP4 x DP32"


@dataclass(frozen=True)
class WhatIf(Tabular):
    """A what-if result: the baseline, one Cell per resource and factor, and the capacity fit."""

    model: str
    cluster: str
    devices: int
    global_batch: int
    factors: tuple
    baseline: Best
    cells: list = field(default_factory=list)
    fit: CapacityFit | None = None
    tokens: float | None = None            # the token budget of the training figures, if one was given
    unit: str = "tokens"                   # what the throughput counts (the model's workload family's unit)

    def rows(self) -> list:
        """One dict per cell (the table form: ``to_arrow()``, ``to_pandas()``)."""
        return [{"model": self.model, "cluster": self.cluster, "devices": self.devices, **asdict(c)}
                for c in self.cells]

    def speedup(self, resource: str, factor: float) -> float | None:
        """The speedup of ``resource`` scaled by ``factor`` (a cell of the table)."""
        for c in self.cells:
            if c.resource == resource and math.isclose(c.factor, factor):
                return c.speedup
        raise KeyError(f"no cell for {resource} x{factor:g}")

    def to_dict(self) -> dict:
        """The JSON form of ``comet-dse whatif --json`` (``training``: the baseline's, as ``baseline.training``);
        each cell's ``unit`` is the SI unit of its value
        (vocabulary.Resource.si_unit; bandwidths per device, per direction unless named link_bandwidth)."""
        return {"model": self.model, "cluster": self.cluster, "devices": self.devices,
                "global_batch": self.global_batch, "factors": list(self.factors), "tokens": self.tokens,
                "baseline": asdict(self.baseline), "cells": [{**asdict(c), "unit": si_unit(c.resource)}
                                                             for c in self.cells],
                "fit": asdict(self.fit) if self.fit else None,
                "training": self.baseline.training}        # the baseline's, as estimate --json names it


def whatif(model: Transformer, cluster: Cluster, devices: int, global_batch: int, space: SearchSpace | None = None,
           resources=None, factors=DEFAULT_FACTORS, capacity: str | None = "hbm_capacity",
           tokens: float | None = None) -> WhatIf:
    """Search ``space`` on ``cluster`` and on ``cluster`` with each resource scaled by each factor.

    resources: names as ``--set`` takes them (overrides.resource_names); default ``default_resources``.
    factors: positive multipliers. capacity: the capacity resource whose smallest fitting value is
    found (``smallest_capacity``), or None to skip that. tokens: a token budget: each best strategy's time
    to train, energy and cost are reported too (whole_run/economics.py). Every cell says what the change adds to the
    cluster's price and draw (per-unit prices and powers, hardware/economics_block.py) and the speedup per added
    dollar and watt.
    """
    space = space or SearchSpace()
    factors = check_factors(factors)
    resources = check_resources(cluster, resources or default_resources(cluster, model))
    cluster.dim_sizes(devices)
    st = enumerate_strategies(model, devices, global_batch, space)
    cols = evaluate_columns(model, cluster, devices, st)
    family = family_of(model)
    baseline = best_in(cols, cluster, devices, tokens, model.total_params(), family)
    cells = [scaled_best(model, cluster, devices, candidates(st, cols, r, family), baseline, r, f, tokens)
             for r in resources for f in factors]
    fit = smallest_capacity(model, cluster, devices, global_batch, space, capacity, st) if capacity else None
    return WhatIf(model.name, cluster.name, devices, global_batch, factors, baseline, cells, fit, tokens,
                  family.unit)


def check_factors(factors) -> tuple:
    """The factors as a tuple of positive finite floats, or an InputError naming --scale."""
    items = tuple(factors) if isinstance(factors, (list, tuple)) else (factors,)
    out = []
    for x in items:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x < math.inf:
            raise InputError("--scale", f"factors must be positive finite numbers like 0.5,2; got {x!r}")
        out.append(float(x))
    if not out:
        raise InputError("--scale", "give at least one factor, e.g. 0.5,2")
    return tuple(dict.fromkeys(out))


def check_resources(cluster: Cluster, names) -> tuple:
    """``names`` (one name or a list of names) if each is a resource of ``cluster`` that can be scaled (x1
    applies cleanly); an InputError otherwise (``resources=5`` was a raw TypeError)."""
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise InputError("resources", f"must be a resource name or a list of them (as --set names them), got "
                                      f"{names!r:.60}")
    names = tuple(dict.fromkeys(names))
    for name in names:
        if name.endswith(".topology"):
            raise InputError(f"--resources {name}", "a topology has no scale; compare topologies with "
                             "`search --set network.<dim>.topology=...`")
        _set_one(cluster, name, "x1", "--resources")
    return names


def candidates(st, cols: dict, resource: str, family: WorkloadFamily = DEFAULT):
    """The strategies of ``st`` (evaluated into ``cols``) that can be the best once ``resource`` changes:
    those that break no rule but memory when it is a capacity or the reserve (memory may then fit), else
    those that fit (no rule but memory depends on a resource's size, and memory only on the capacities and
    the reserve); ``family``: the model's workload family, whose rule bits the columns hold."""
    if resource.endswith("capacity") or resource in ("reserved_memory", "workspace_memory", "fragmentation"):
        return st.take(np.flatnonzero((cols["infeasible_mask"] & ~(1 << family.rules.index("memory"))) == 0))
    return st.take(np.flatnonzero(cols["feasible"]))


def best_of(model: Transformer, cluster: Cluster, devices: int, st, tokens: float | None = None) -> Best:
    """The fastest feasible strategy of ``st`` on ``cluster``, or why there is none. No strategy at all (the
    ``candidates`` of a resource when none can fit) is such an answer, not an evaluation of nothing."""
    if not len(st):
        return Best(None, None, None, None, 0, 0, "no strategy fits: none can, whatever this resource is")
    return best_in(evaluate_columns(model, cluster, devices, st), cluster, devices, tokens, model.total_params(),
                   family_of(model))


def best_in(cols: dict, cluster: Cluster | None = None, devices: int | None = None,
            tokens: float | None = None, parameters: float = math.nan, family: WorkloadFamily = DEFAULT) -> Best:
    """The fastest feasible row of evaluated columns, or why there is none; with a ``cluster``, its
    ``devices``, a token budget and the model's ``parameters`` (what a checkpoint holds) also its time to
    train, energy and cost (None where unknown) and the whole training figure (``training``); ``family``: the
    model's workload family (its rule bits, the knobs its strategy text names)."""
    ok = np.flatnonzero(cols["feasible"])
    if not len(ok):
        counts = reason_counts(cols["infeasible_mask"], family.rules)
        note = "no strategy fits; broken rules: " + ", ".join(f"{k} {v:,}" for k, v in counts.items())
        return Best(None, None, None, None, len(cols["feasible"]), 0, note)
    row = int(ok[np.argmin(cols["step_time_s"][ok])])
    strategy = strategy_at(cols, row).to_dict()
    figures = {}
    if tokens and cluster is not None:
        parts = {k[len("time_"):-len("_s")]: float(v[row]) for k, v in cols.items()
                 if k.startswith("time_") and k.endswith("_s")}
        train = economics.training_of(cluster, devices, float(cols["step_time_s"][row]),
                                      float(cols["tokens_per_second"][row]), parts, tokens, parameters)
        figures = {k: _or_none(train[k]) for k in ("time_to_train_s", "energy_j", "training_cost_usd")}
        figures["training"] = train
    return Best(float(cols["step_time_s"][row]), float(cols["tokens_per_second"][row]), strategy,
                compact_text(strategy, family.strategy_knobs), len(cols["feasible"]), len(ok), **figures)


def _or_none(x: float) -> float | None:
    """``x``, or None where it is unknown (NaN)."""
    return None if x is None or math.isnan(x) else float(x)


def added(cluster: Cluster, scaled: Cluster, devices: int) -> tuple:
    """(USD, W) that ``scaled`` adds over ``cluster``: devices x the sum of unit_price x (amount now - before)
    over the resources with a per-unit price, and PUE x devices x the same with unit_power (the draw added
    while the resource is busy). None where no changed resource has a per-unit figure."""
    econ = cluster.economics
    out = []
    for figures in (econ.unit_price, econ.unit_power):
        changed = [r for r in figures if amount(scaled, r) != amount(cluster, r)]
        out.append(devices * sum(figures[r] * (amount(scaled, r) - amount(cluster, r)) for r in changed)
                   if changed else None)
    usd, watts = out
    pue = economics.rates(cluster, devices).pue
    return usd, None if watts is None else pue * watts


def per_added(speedup: float | None, added_: float | None, unit: float) -> float | None:
    """(speedup - 1) per ``unit`` of the added USD or W where the change adds some; None when either is unknown
    or the change adds nothing or takes away (a scale-down: ``per_saved``, so that a slowdown that saves money
    never reads as a gain per added dollar)."""
    if speedup is None or added_ is None or not added_ > 0:
        return None
    return (speedup - 1.0) / (added_ / unit)


def per_saved(speedup: float | None, added_: float | None) -> float | None:
    """What a change that lowers the price or the draw saves per 1 % of speed it costs: -added / (100 x (1 -
    speedup)) in USD or W; inf where it costs no speed (cheaper and as fast or faster); None when either is
    unknown or the change saves nothing."""
    if speedup is None or added_ is None or not added_ < 0:
        return None
    if speedup >= 1.0:
        return math.inf
    return -added_ / (100.0 * (1.0 - speedup))


def scaled_best(model: Transformer, cluster: Cluster, devices: int, st, baseline: Best, resource: str,
                factor: float, tokens: float | None = None) -> Cell:
    """The best strategy of ``st`` with ``resource`` scaled by ``factor`` and its speedup over ``baseline``;
    a value beyond the plausible bounds is a note in the cell, not an error."""
    try:
        scaled = apply_overrides(cluster, [(resource, f"x{factor!r}")], where="--resources")
    except InputError as exc:
        return Cell(resource, factor, None, None, None, None, exc.message)
    best = best_of(model, scaled, devices, st, tokens)
    speedup = baseline.step_time_s / best.step_time_s if best.step_time_s and baseline.step_time_s else None
    usd, watts = added(cluster, scaled, devices)
    return Cell(resource, factor, resource_value(scaled, resource), best.step_time_s, speedup,
                best.strategy_text, best.note, usd, watts, per_added(speedup, usd, 1e6), per_added(speedup, watts, 1e3),
                best.time_to_train_s, best.energy_j, best.training_cost_usd, per_saved(speedup, usd),
                per_saved(speedup, watts))


def resource_value(cluster: Cluster, resource: str) -> float | None:
    """The value of ``resource`` on ``cluster`` in SI units (peak_flops: the bf16 rate, else the largest;
    network_* : the innermost dimension's; a bandwidth per device per direction, but link_bandwidth per
    link), None where it is a name (a topology)."""
    acc = cluster.accelerator
    if resource == "peak_flops":
        return acc.peak_flops.get("bf16", max(acc.peak_flops.values()))
    if resource.startswith("peak_flops."):
        return acc.peak_flops.get(resource.split(".", 1)[1])
    if resource.startswith(("hbm_", "sram_", "expansion_", "host_memory_")):
        tier, attr = resource.replace("host_memory_", "host_").split("_", 1)
        return getattr(getattr(acc, tier), attr) if getattr(acc, tier) is not None else None
    if resource in ("device_price_usd", "device_power_w", "reserved_memory", "workspace_memory", "fragmentation"):
        return getattr(cluster, resource)
    if resource in ("network_bandwidth", "network_latency"):
        attr = "bandwidth" if resource == "network_bandwidth" else "latency"
        return getattr(cluster.network[0], attr)
    _, dim, attr = resource.split(".")
    value = getattr(next(d for d in cluster.network if d.name == dim), attr)
    return value if isinstance(value, (int, float)) else None


def si_unit(resource: str) -> str:
    """The SI unit of a resource's value (vocabulary), '' for a name the vocabulary does not know."""
    try:
        return vocabulary.resource(resource).si_unit
    except KeyError:
        return ""


def describe_space(space: SearchSpace) -> str:
    """The split a space is constrained to, e.g. 'MP64 x DP64', 'MP64', 'TP8 x PP8' or 'any split'."""
    words = []
    if space.mp is not None:
        words.append("MP" + "|".join(map(str, space.mp)))
    for name in ("tp", "pp", "cp", "dp"):
        if space.given(name) is not None:
            words.append(name.upper() + "|".join(str(int(v)) for v in space.given(name)))
    text = " x ".join(words) or "any split"
    if space.max_tp is not None:
        text += f" with TP <= {space.max_tp} (the scale-up domain)"
    return text


def split_text(strategy: dict | None) -> str | None:
    """A strategy's parallel split, e.g. 'TP8 x PP4 x DP32' (CP and EP where above 1)."""
    if not strategy:
        return None
    names = [n for n in ("tp", "cp", "ep", "pp", "dp") if n in ("tp", "pp", "dp") or int(strategy.get(n, 1)) > 1]
    return " x ".join(f"{n.upper()}{int(strategy[n])}" for n in names)


def smallest_capacity(model: Transformer, cluster: Cluster, devices: int, global_batch: int,
                      space: SearchSpace | None = None, resource: str = "hbm_capacity", st=None) -> CapacityFit:
    """The least value of ``resource`` (a capacity) at which ``space`` holds a strategy that fits.

    Only the strategies that break no rule but memory can ever fit, and more capacity never makes a
    fitting strategy stop fitting: the answer is found by bisection over the resource's plausible range
    (hardware/load.py), evaluating those strategies only.
    """
    from comet_dse.design_space.study import AXIS_LIMITS

    if resource not in CAPACITY_RESOURCES:
        raise InputError("--capacity", f"must be one of {', '.join(CAPACITY_RESOURCES)}, got {resource!r}")
    space = space or SearchSpace()
    check_resources(cluster, [resource])
    st = st if st is not None else enumerate_strategies(model, devices, global_batch, space)
    constraint = describe_space(space)
    current = resource_value(cluster, resource)
    cols = evaluate_columns(model, cluster, devices, st)
    family = family_of(model)
    candidates_ = candidates(st, cols, resource, family)
    if not len(candidates_):
        counts = reason_counts(cols["infeasible_mask"], family.rules)
        return CapacityFit(resource, constraint, current, None, False, None,
                           "no strategy is valid even with unlimited memory; broken rules: "
                           + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    high, zero_ok = AXIS_LIMITS[resource]

    def fitting(value: float):
        changed = apply_overrides(cluster, [(resource, value)], where="--capacity")
        best = best_of(model, changed, devices, candidates_)
        return best if best.step_time_s is not None else None

    if fitting(high) is None:
        return CapacityFit(resource, constraint, current, None, False, None,
                           f"does not fit even with {format_bytes(high)}, the plausible bound of {resource}")
    low, top = 0.0, high
    if zero_ok and fitting(0.0) is not None:
        top = 0.0
    for _ in range(BISECTION_STEPS if top else 0):
        middle = (low + top) / 2
        if fitting(middle) is not None:
            top = middle
        else:
            low = middle
        if top - low <= max(2.0**20, 1e-4 * top):
            break
    best = fitting(top)
    return CapacityFit(resource, constraint, current, top, bool(cols["feasible"].any()), best.strategy_text,
                       split=split_text(best.strategy))
