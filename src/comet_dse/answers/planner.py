"""A deadline or a budget in one question: the cheapest design (cluster, size, strategy) that trains a token
budget within a number of days, or the fastest within a number of dollars, across cluster presets and sizes.

For every cluster and device count the search (design_space.search, the command line's defaults) finds the
fastest strategy that fits; with the global batch and the token budget fixed, the fastest is also the
cheapest on that cluster and size (every cost grows with the time to train). Each candidate's time to train
includes the goodput (whole_run/goodput.py) and carries the range of its error band (``band_of``: errorband's, given by
the caller, which sits on the same floor). Costs are on ONE basis for every candidate (``basis``: rent or
own); a cluster without a figure for that basis has an unknown cost and is never chosen on cost.

Floor 8 (docs/architecture.md): a question, like whatif.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from comet_dse.answers.estimate import estimate
from comet_dse.base.errors import InputError
from comet_dse.design_space.search import search, strategy_at
from comet_dse.design_space.space import SearchSpace, with_cluster_defaults
from comet_dse.hardware.slices import nearest as nearest_slices
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.text import compact_text
from comet_dse.whole_run.economics import cost_column, with_ranges
from comet_dse.workload.families import family_of

NO_FIT = "no strategy fits"      # a Candidate's note where the size was searched and nothing fits
DEFAULT_DEVICES = (512, 1024, 2048, 4096, 8192, 16384)   # the sizes tried unless asked otherwise


@dataclass(frozen=True)
class Candidate:
    """The fastest strategy on one cluster at one size, and what training on the budget takes there
    (``training``: economics.training_of with its ranges, economics.with_ranges; None when nothing fits or
    the size does not suit the cluster, ``note`` says why)."""

    cluster: str
    devices: int
    strategy_text: str | None
    step_time_s: float | None
    training: dict | None
    band_text: str = ""
    note: str = ""
    band_assumed: bool = False     # the range is an assumed band's (no validated family backs this design)

    @property
    def days(self) -> float | None:
        return self.training["time_to_train_s"] / 86400.0 if self.training else None

    def cost(self, basis: str) -> float | None:
        """The cost of training on ``basis`` (None: unknown, no figure for it)."""
        if not self.training:
            return None
        value = self.training[cost_column(basis)]
        return None if value is None or math.isnan(value) else value

    def cost_range(self, basis: str) -> list | None:
        return self.training.get(f"{cost_column(basis)}_range") if self.training else None

    def time_range(self) -> list | None:
        return self.training.get("time_to_train_s_range") if self.training else None


def why_not_offered(cluster: Cluster, count: int) -> str | None:
    """Why ``count`` devices of ``cluster`` cannot be bought or rented as they are, or None: beyond its largest
    size (``max_devices``: the largest published job or system), no layout on its network, or, on a machine
    rented in slices (a TPU pod, hardware/slices.py), no whole number of equal offered slices."""
    try:
        cluster.dim_sizes(count)
    except InputError as exc:
        return exc.message
    if cluster.rented_in_slices and cluster.slice_layout(count) is None:
        return f"no whole number of equal {cluster.name} slices ({cluster.slices.text()})"
    return None


def nearest_offered(cluster: Cluster, n: int) -> int:
    """The offered count nearest ``n`` where ``n`` is not offered: on a machine rented in slices, the nearest
    whole number of equal slices (the smaller on a tie); elsewhere the nearest multiple of its bounded network
    dimensions (a TPU pod's torus, an NVL72 rack)."""
    if cluster.rented_in_slices:
        caps, outer = cluster.slice_caps()
        below, above = nearest_slices(cluster.slices, caps, outer, n, cluster.max_devices)
        near = [c for c in (below, above) if c is not None]
        return min(near, key=lambda c: (abs(c - n), c)) if near else n
    unit = math.prod(d.size for d in cluster.network if d.size is not None)
    return max(unit, round(n / unit) * unit)


def sizes_for(cluster: Cluster, wanted, refused: list | None = None) -> list:
    """The device counts of ``wanted`` that ``cluster`` is offered in, each one that it is not replaced by the
    nearest one that it is (``nearest_offered``), without repeats. ``refused``: where given, each count beyond
    the largest size or with no offered replacement is appended as (count, why) (``why_not_offered``)."""
    out = []
    for n in wanted:
        why = why_not_offered(cluster, n)
        count = n
        beyond = cluster.max_devices is not None and n > cluster.max_devices
        if why is not None and beyond:
            if refused is not None:
                refused.append((n, why))
            continue
        if why is not None:
            count = nearest_offered(cluster, n)
            if why_not_offered(cluster, count) is not None:
                if refused is not None:
                    refused.append((n, why))
                continue
        if count not in out:
            out.append(count)
    return out


def candidate(model: Transformer, cluster: Cluster, devices: int, global_batch: int, tokens: float,
              band_of) -> Candidate:
    """The fastest strategy that fits on ``devices`` devices of ``cluster`` and its training figures with their
    ranges (``band_of(cluster, dtype, moe, kind=)``: the error band of the model's kind, errorband.band_of_cluster)."""
    space = with_cluster_defaults(SearchSpace(), cluster, devices, False)
    found = search(model, cluster, devices, global_batch, space)
    if not found.feasible:
        return Candidate(cluster.name, devices, None, None, None, note=NO_FIT)
    strategy = strategy_at(found.columns, int(found.ranked[0]))
    result = estimate(model, cluster, devices, strategy, tokens=tokens)
    band = band_of(cluster, strategy.dtype.value, bool(model.moe), kind=model.kind)
    only = family_of(model).strategy_knobs
    return Candidate(cluster.name, devices, compact_text(strategy.to_dict(), only), result.step_time_s,
                     with_ranges(result.training, band), band["text"], band_assumed=bool(band.get("assumed")))


def candidates(model: Transformer, clusters: list, devices, global_batch: int, tokens: float, band_of,
               progress: bool = False) -> list:
    """Every cluster at every size it can take (``sizes_for``): a Candidate each. ``progress``: a bar on stderr
    (labelled by the design being searched) once the work has run for a second."""
    import sys

    from tqdm import tqdm

    designs, out = [], []
    for cluster in clusters:            # a size the cluster cannot take: a Candidate that says why
        refused = []
        designs += [(cluster, n) for n in sizes_for(cluster, devices, refused)]
        out += [Candidate(cluster.name, n, None, None, None, note=why) for n, why in refused]
    with tqdm(total=len(designs), unit="design", file=sys.stderr, disable=not progress, delay=1.0,
              leave=False, desc="plan") as bar:
        for cluster, n in designs:
            bar.set_postfix_str(f"{cluster.name} x {n:,}", refresh=False)
            out.append(candidate(model, cluster, n, global_batch, tokens, band_of))
            bar.update()
    return out


def left_out(cands: list, basis: str) -> list:
    """The designs that fit but have no cost on ``basis`` (no rent figure, or no device price or power): they
    are never a cost answer, and never costed the other way; each (cluster, devices, why)."""
    why = "no rent figure" if basis == "rent" else "no device price or power"
    return [(c.cluster, c.devices, why) for c in cands if c.training and c.cost(basis) is None]


def _judged(c: Candidate, key: str, value: float | None, slow_end: bool) -> float | None:
    """A candidate's figure as a question judges it: as predicted, or with ``slow_end`` at the slow (high) end
    of its error band where it has one."""
    if value is None or not slow_end:
        return value
    band = c.training.get(f"{key}_range")
    return band[1] if band else value


def cheapest_within(cands: list, deadline_s: float, basis: str, slow_end: bool = False) -> Candidate | None:
    """The cheapest candidate on ``basis`` whose time to train is within ``deadline_s``; None if none is. With
    ``slow_end`` time and cost are judged at the slow end of each error band (a design without a validated
    band as predicted)."""
    ok = [c for c in cands if c.training and c.cost(basis) is not None
          and _judged(c, "time_to_train_s", c.training["time_to_train_s"], slow_end) <= deadline_s]
    return min(ok, key=lambda c: (_judged(c, cost_column(basis), c.cost(basis), slow_end),
                                  c.training["time_to_train_s"])) if ok else None


def fastest_within(cands: list, budget_usd: float, basis: str, slow_end: bool = False) -> Candidate | None:
    """The fastest candidate whose cost on ``basis`` is within ``budget_usd``; None if none is (``slow_end``: as
    cheapest_within)."""
    ok = [c for c in cands if c.training and c.cost(basis) is not None
          and _judged(c, cost_column(basis), c.cost(basis), slow_end) <= budget_usd]
    return min(ok, key=lambda c: (_judged(c, "time_to_train_s", c.training["time_to_train_s"], slow_end),
                                  c.cost(basis))) if ok else None


@dataclass(frozen=True)
class Plan:
    """A plan's question and answers: every candidate, the cheapest within ``deadline_s`` and the fastest within
    ``budget_usd`` (None: not asked, or nothing qualifies), all costs on ``basis``."""

    model: str
    tokens: float
    global_batch: int
    clusters: tuple
    basis: str
    deadline_s: float | None
    budget_usd: float | None
    candidates: list
    slow_end: bool = False        # judge the deadline and the budget at the slow end of each error band
    unit: str = "tokens"          # what ``tokens`` counts: the model's workload family's unit (samples for DLRM)

    @property
    def cheapest(self) -> Candidate | None:
        return (cheapest_within(self.candidates, self.deadline_s, self.basis, self.slow_end)
                if self.deadline_s else None)

    @property
    def fastest(self) -> Candidate | None:
        return fastest_within(self.candidates, self.budget_usd, self.basis, self.slow_end) if self.budget_usd else None

    def answer_lines(self) -> list:
        """One line per question asked: the design that answers it with its time and cost and their ranges
        under the error band, or that none does."""
        from comet_dse.base.units import format_duration, format_usd

        def shown(c: Candidate) -> str:
            tr, cr = c.time_range(), c.cost_range(self.basis)
            which = "assumed band" if c.band_assumed else "error band"
            band = (f" ({which}: {format_duration(tr[0])} .. {format_duration(tr[1])}, "
                    f"{format_usd(cr[0])} .. {format_usd(cr[1])})" if tr and cr else
                    f" ({which}: {format_duration(tr[0])} .. {format_duration(tr[1])})" if tr else " (not validated)")
            late = (" - at the band's slow end it misses the deadline" if tr and self.deadline_s
                    and tr[1] > self.deadline_s else "")
            return (f"{c.cluster} x {c.devices:,}, {c.strategy_text}: {format_duration(c.training['time_to_train_s'])},"
                    f" {format_usd(c.cost(self.basis))} ({self.basis}ing){band}{late}")

        lines = (["Judged at the slow end of each error band (a design without a validated one: of the band "
                  "assumed for it; without either: as predicted)"]
                 if self.slow_end else [])
        if self.deadline_s:
            c = self.cheapest
            lines.append(f"Cheapest within {format_duration(self.deadline_s)}: "
                         + (shown(c) if c else "none of these designs meets the deadline with a known cost"))
        if self.budget_usd:
            c = self.fastest
            lines.append(f"Fastest within {format_usd(self.budget_usd)}: "
                         + (shown(c) if c else "none of these designs fits the budget"))
        return lines

    def to_dict(self) -> dict:
        """The JSON of ``comet-dse plan --json`` (SI units; each candidate's ``training`` as estimate's)."""
        def one(c: Candidate | None):
            return None if c is None else {"cluster": c.cluster, "devices": c.devices, "strategy": c.strategy_text,
                                           "step_time_s": c.step_time_s, "training": c.training,
                                           "error_band": c.band_text, "band_assumed": c.band_assumed,
                                           "note": c.note}
        return {"model": self.model, "tokens": self.tokens, "unit": self.unit, "global_batch": self.global_batch,
                "left_out_of_costs": [{"cluster": c, "devices": n, "why": w} for c, n, w in left_out(self.candidates,
                                                                                                   self.basis)],
                "clusters": list(self.clusters), "cost_basis": self.basis, "deadline_s": self.deadline_s,
                "budget_usd": self.budget_usd, "slow_end": self.slow_end, "cheapest_within_deadline": one(self.cheapest),
                "fastest_within_budget": one(self.fastest), "candidates": [one(c) for c in self.candidates]}
