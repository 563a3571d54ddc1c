"""What the explorer shows for one setting of its controls, computed by the batched cost model.

``compute(Controls(...))`` loads the model and cluster, applies the resource controls as cluster
overrides (answers/overrides.py: the same validation as ``--set``), searches every strategy
(design_space/search.py), and returns a ``View``: the fastest strategies, the chosen one's breakdown and
memory by part, the best strategy per MP x DP split (the bathtub, with why a split does not fit)
and what doubling each resource buys (answers/whatif.py). Nothing is precomputed: every call evaluates the
whole space again, which takes a few tens of milliseconds for 30 K strategies.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from comet_dse.answers.errorband import band_of_cluster
from comet_dse.answers.estimate import estimate
from comet_dse.answers.overrides import apply_overrides
from comet_dse.answers.whatif import Best, candidates, default_resources, resource_value, scaled_best
from comet_dse.base.errors import InputError
from comet_dse.base.units import format_bytes
from comet_dse.base.vocabulary import breakdown_labels, resource as described
from comet_dse.design_space.search import strategy_at
from comet_dse.design_space.space import SearchSpace, enumerate_strategies, with_cluster_defaults
from comet_dse.design_space.table import evaluate_columns, reason_counts
from comet_dse.hardware.efficiency import efficiency_summary
from comet_dse.hardware.spec import Cluster, Topology
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.text import compact_text
from comet_dse.whole_run import economics
from comet_dse.workload.families import family_of

GiB = 2.0**30
TOP = 10                        # strategies listed
NEW_TIER_BANDWIDTH = 64e9       # bytes/s the expansion control offers for a cluster without a tier (CXL 2.0 x16)
TOPOLOGIES = tuple(t.value for t in Topology)


@dataclass(frozen=True)
class Resource:
    """One resource control: its key (an override name), label, display unit, SI value of one unit and
    what follows the unit in the control's caption (what it is counted per, which value is shown)."""

    key: str
    label: str
    unit: str
    si: float
    note: str = ""

    @property
    def caption(self) -> str:
        """The control's caption, e.g. 'Network nvlink bandwidth (GB/s per device, per direction)'."""
        label = self.label[:1].upper() + self.label[1:]
        return label if self.unit == "topology" else f"{label} ({' '.join(filter(None, (self.unit, self.note)))})"


def control(name: str, hint: str = "") -> Resource:
    """The control of a resource, named, labelled and united by the vocabulary; ``hint`` ends its caption."""
    r = described(name)
    note = "; ".join(filter(None, (r.per + (f", {r.shown}" if r.shown else ""), hint)))
    return Resource(name, r.label, r.unit, r.scale, note)


# Resource controls every cluster has; expansion and network controls are added per cluster (controls_for).
RESOURCES = (
    control("peak_flops"),
    control("hbm_capacity"),
    control("hbm_bandwidth"),
    control("sram_capacity"),
    control("expansion_capacity", "0: none"),
    control("expansion_bandwidth"),
)


@dataclass(frozen=True)
class Controls:
    """The page's controls. ``resources``: control key -> value in display units (absent or None: the
    preset's); network controls are keyed ``network.<dim>.bandwidth`` (GB/s per device, per direction;
    ``network.<dim>.link_bandwidth``, GB/s per link, is also taken) and ``network.<dim>.topology`` (a name)."""

    model: str = "megatron-1t"
    cluster: str = "tpu-v4"
    devices: int = 4096
    global_batch: int = 2048
    resources: dict = field(default_factory=dict)
    rank: int = 1
    tokens: float | None = None      # a token budget: the chosen strategy's time to train, energy and cost
    # The strategy controls (STRATEGY_CONTROLS) as (knob, choice) pairs: which values of these knobs the
    # search tries. A knob left out takes its first choice; "default" is a search's default (flash attention
    # where the cluster has a fused-attention rate; every recomputation mode and ZeRO stage); a knob's value,
    # or several joined by commas, restricts the search to them.
    strategy: tuple = ()
    tp_across_nodes: bool = False    # TP beyond the scale-up domain (design_space.space.with_cluster_defaults)


@dataclass
class View:
    """Everything the page draws (plain values; SI units)."""

    title: str
    evaluated: int
    feasible: int
    seconds: float
    top: list                   # dicts: rank, strategy, step_time_s, tokens_per_second, mfu, memory_bytes
    chosen: dict                # strategy, rank, feasible, note, step_time_s, breakdown_s, memory_bytes,
                                # labels (time part -> its label for this strategy, vocabulary.breakdown_labels),
                                # training (with a token budget: Estimate.training, whole_run/economics.py; else None),
                                # error_band (errorband.band_for's text for its accelerator and precision)
    capacity_bytes: float       # what holds state per device (HBM, plus SRAM where it holds state)
    expansion_bytes: float      # expansion tier capacity (0: none)
    splits: list                # dicts: mp, dp, fits, step_time_s, strategy, why, memory_parts (part -> bytes)
    doubling: list              # dicts: resource, speedup, step_time_s, note, added_usd
    excluded: dict = field(default_factory=dict)   # rule text -> strategies it excluded
    price_usd: float = math.nan     # the cluster's purchase price as it is (economics.rates; NaN: unknown)
    unit: str = "tokens"            # what the model trains on: its workload family's unit (samples for DLRM)
    layout_note: str = ""           # a scale-up domain used in part, said out loud (e.g. NVL72 racks of 64)


@functools.lru_cache(maxsize=16)
def _model(ref: str):
    return load_model(ref)


@functools.lru_cache(maxsize=16)
def _cluster(ref: str) -> Cluster:
    return load_cluster(ref)


# The strategy controls: knob -> (its caption, the choices the page offers; the first is the default). The
# knobs are declared in strategy/declared.py; this names only which of them the page offers. Precision offers the
# dtypes and both 16-bit and fp8 at once; a cluster without a dtype's rate rejects it with its reason.
STRATEGY_CONTROLS = {
    "dtype": ("Precision", ("bf16", "fp8", "bf16,fp8", "fp16")),
    "flash_attention": ("Flash attention (default: where the cluster has a rate)", ("default", "on", "off")),
    "recompute": ("Recomputation (default: every mode)", ("default", "none", "selective", "full")),
    "zero": ("ZeRO stage (default: every stage)", ("default", "0", "1", "2", "3")),
    "ep_overlap": ("Expert all-to-all beside compute (MoE; default: off)", ("default", "on", "off")),
    "ep_fp8_dispatch": ("fp8 expert dispatch (MoE, with fp8; default: off)", ("default", "on", "off")),
    "activation_offload": ("Activations offloaded to host memory (share; default: none)",
                           ("default", "0.25", "0.5", "1")),
    "fp8_fused_cast": ("fp8 cast inside the matmuls, no kept weight copy (XLA; with fp8; default: off)",
                       ("default", "on", "off")),
}


def strategy_space(controls: Controls, cluster: Cluster) -> SearchSpace:
    """The search space of the strategy controls, with the defaults a search takes on ``cluster``
    (design_space.space.with_cluster_defaults): the explorer searches what ``comet-dse search`` would."""
    values, given = {}, dict(controls.strategy)
    for knob, (_, choices) in STRATEGY_CONTROLS.items():
        chosen = str(given.get(knob) or choices[0]).strip()
        if chosen not in choices:
            raise InputError(knob.replace("_", " "), f"must be one of {', '.join(choices)}, got {chosen!r}")
        if chosen != "default":
            values[knob] = tuple(chosen.split(","))
    return with_cluster_defaults(SearchSpace(values), cluster, controls.devices, bool(controls.tp_across_nodes))


@functools.lru_cache(maxsize=8)
def _strategies(model_ref: str, devices: int, global_batch: int, knobs: tuple = (), max_tp: int | None = None):
    """Every strategy of a space (``knobs``: its values as sorted (knob, values) pairs; ``max_tp``)."""
    space = SearchSpace(dict(knobs), max_tp=max_tp)
    return enumerate_strategies(_model(model_ref), devices, global_batch, space)


def _space_key(space: SearchSpace) -> tuple:
    """A SearchSpace's values as a hashable key for ``_strategies`` (choices by name)."""
    return tuple(sorted((k, tuple(str(getattr(v, "value", v)) if not isinstance(v, bool) else v for v in vals))
                        for k, vals in space.values.items()))


def controls_for(cluster_ref: str) -> list:
    """Every resource control of a cluster preset, with its present value: [(Resource, value)] where the
    value is in display units, and per network dimension its bandwidth (per device, per direction, as
    whatif and presets show it) and its topology (unit 'topology')."""
    cluster = _cluster(cluster_ref)
    out = [(r, preset_value(cluster, r.key)) for r in RESOURCES]
    for dim in cluster.network:
        bandwidth = control(f"network.{dim.name}.bandwidth")
        out.append((bandwidth, float(f"{dim.bandwidth / bandwidth.si:.6g}")))
        topology = f"network.{dim.name}.topology"
        out.append((Resource(topology, described(topology).label, "topology", 1.0), dim.topology.value))
    return out


def preset_value(cluster: Cluster, key: str):
    """The cluster's value of a resource control, in its display unit (rounded for showing); a cluster
    without an expansion tier shows 0 GiB at 64 GB/s."""
    resource = next(r for r in RESOURCES if r.key == key)
    si = resource_value(cluster, key)
    if si is None:
        si = 0.0 if key == "expansion_capacity" else NEW_TIER_BANDWIDTH
    return float(f"{si / resource.si:.6g}")


def overrides_for(cluster: Cluster, values: dict) -> tuple:
    """(settings, expansion) that turn the preset ``cluster`` into what the controls say: only the
    controls that differ from the preset, as ``--set`` would take them."""
    settings, expansion = [], None
    units = {r.key: r for r in RESOURCES}
    for key, value in values.items():
        if value is None or value == "":
            continue
        if key.endswith(".topology"):
            dim = next((d for d in cluster.network if f"network.{d.name}.topology" == key), None)
            if dim is not None and value != dim.topology.value:
                settings.append((key, str(value)))
            continue
        number = _number(key, value)
        if key.startswith("network.") and key.endswith((".bandwidth", ".link_bandwidth")):
            attr, unit = key.rsplit(".", 1)[1], described(key)
            dim = next((d for d in cluster.network if f"network.{d.name}.{attr}" == key), None)
            if dim is not None and not math.isclose(number * unit.scale, getattr(dim, attr), rel_tol=1e-6):
                settings.append((key, f"{number}{unit.unit}"))
            continue
        if key not in units or math.isclose(number, preset_value(cluster, key), rel_tol=1e-6):
            continue
        if key == "peak_flops":
            settings.append((key, f"x{number * 1e12 / resource_value(cluster, key)!r}"))
        elif key.startswith("expansion_") and cluster.accelerator.expansion is None:
            expansion = _new_tier(values)
        else:
            settings.append((key, f"{number!r}{units[key].unit}"))
    return settings, expansion


def _number(key: str, value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(key, f"must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise InputError(key, f"must be a finite number of at least 0, got {value!r}")
    return number


def _new_tier(values: dict) -> str | None:
    """An expansion tier for a cluster without one, from the two expansion controls (None at 0 GiB)."""
    capacity = _number("expansion_capacity", values.get("expansion_capacity") or 0)
    bandwidth = _number("expansion_bandwidth", values.get("expansion_bandwidth") or NEW_TIER_BANDWIDTH / 1e9)
    return f"{capacity}GiB@{bandwidth}GB/s" if capacity > 0 else None


def compute(controls: Controls) -> View:
    """Search every strategy for the controls and gather what the page shows."""
    started = time.perf_counter()
    model = _model(controls.model)
    base = _cluster(controls.cluster)
    settings, expansion = overrides_for(base, controls.resources)
    out_of_range(controls.resources)
    cluster = apply_overrides(base, settings, expansion, where="cluster") if settings or expansion else base
    cluster.dim_sizes(controls.devices)
    space = strategy_space(controls, cluster)
    st = _strategies(controls.model, controls.devices, controls.global_batch, _space_key(space), space.max_tp)
    cols = evaluate_columns(model, cluster, controls.devices, st)
    family = family_of(model)
    ok = np.flatnonzero(cols["feasible"])
    ranked = ok[np.argsort(cols["step_time_s"][ok], kind="stable")]
    chosen = _chosen(model, cluster, controls, cols, ranked)
    masks = cols["infeasible_mask"][~cols["feasible"]]
    view = View(
        title=f"{model.name} on {controls.devices:,} x {cluster.name}, global batch {controls.global_batch:,}",
        evaluated=len(st), feasible=len(ranked), seconds=0.0, top=_top(cols, ranked, family), chosen=chosen,
        capacity_bytes=cluster.accelerator.state_capacity,
        expansion_bytes=cluster.accelerator.expansion.capacity if cluster.accelerator.expansion else 0.0,
        splits=_splits(cols, cluster, family),
        doubling=_doubling(model, cluster, controls.devices, st, cols, ranked),
        excluded={family.rule_text[k]: v for k, v in reason_counts(masks, family.rules).items()},
        price_usd=float(economics.rates(cluster, controls.devices).cluster_price_usd), unit=family.unit,
        layout_note=partial_domains(cluster, controls.devices))
    view.seconds = time.perf_counter() - started
    return view


def out_of_range(values: dict) -> None:
    """Refuse a resource control's value outside what a device can have, in the control's own unit (the
    bounds of a cluster file's field, base/bounds.py, as a study axis checks them): one error, one unit
    system, before the SI check of the override would name raw bytes."""
    from comet_dse.design_space.study import AXIS_BOUNDS

    for r in RESOURCES:
        value, bound = values.get(r.key), AXIS_BOUNDS.get(r.key)
        if value in (None, "") or bound is None:
            continue
        number = _number(r.key, value)
        low, high = bound.low / r.si, bound.high / r.si
        if not low <= number <= high:
            shown_low = "0" if bound.low <= 1.0 else f"{low:,.6g}"        # 1 byte: the bound only refuses 0
            raise InputError(r.key, f"{number:,.6g} {r.unit} is outside what a device can have: {shown_low} .. "
                             f"{high:,.6g} {r.unit} ({bound.why})")


def partial_domains(cluster: Cluster, devices: int) -> str:
    """'' where ``devices`` fill the cluster's scale-up domains (its innermost network dimension) whole; else a
    line that says how much of each is used: 128 GPUs on NVL72 racks run as 2 racks of 64 of their 72
    (Cluster.dim_sizes, as NVIDIA's GB200 benchmarks do)."""
    inner, sizes = cluster.network[0], cluster.dim_sizes(devices)
    if inner.size is None or sizes[0] >= inner.size or inner.size <= cluster.devices_per_node:
        return ""
    domains = devices // sizes[0]
    return (f"{domains:,} {inner.name} domain{'s' if domains != 1 else ''} used in part: {sizes[0]:,} of the "
            f"{inner.size:,} devices of {'each' if domains != 1 else 'it'} (whole nodes; the rest idle)")


def _memory_bit(family) -> int:
    """The bit of a result table's infeasible_mask that the family's memory rule sets."""
    return 1 << family.rules.index("memory")


def _top(cols: dict, ranked: np.ndarray, family) -> list:
    rows = []
    for i, row in enumerate(ranked[:TOP]):
        st = strategy_at(cols, int(row))
        rows.append({"rank": i + 1, "strategy": compact_text(st.to_dict(), family.strategy_knobs),
                     "mp": int(st.tp * st.pp), "dp": int(st.dp),
                     "step_time_s": float(cols["step_time_s"][row]),
                     "tokens_per_second": float(cols["tokens_per_second"][row]), "mfu": float(cols["mfu"][row]),
                     "memory_bytes": float(cols["memory_per_device_bytes"][row])})
    return rows


def _chosen(model, cluster: Cluster, controls: Controls, cols: dict, ranked: np.ndarray) -> dict:
    """The strategy whose breakdown and memory are drawn: rank ``controls.rank`` of those that fit, or,
    when none fits, the fastest that breaks no rule but memory (drawn as 'does not fit')."""
    family = family_of(model)
    if len(ranked):
        rank = min(max(1, int(controls.rank)), len(ranked))
        row, note = int(ranked[rank - 1]), ""
    else:
        runnable = np.flatnonzero((cols["infeasible_mask"] & ~_memory_bit(family)) == 0)
        if not len(runnable):
            return {"strategy": None, "rank": None, "feasible": False, "note": "no strategy is valid",
                    "step_time_s": None, "breakdown_s": {}, "memory_bytes": {}, "training": None}
        rank, row = None, int(runnable[np.argmin(cols["memory_per_device_bytes"][runnable])])
        note = "nothing fits: the strategy that needs the least memory is shown"
    est = estimate(model, cluster, controls.devices, strategy_at(cols, row), tokens=controls.tokens)
    band = band_of_cluster(cluster, est.inputs["strategy"].get("dtype", "bf16"), bool(model.moe), kind=model.kind)
    efficiency = efficiency_summary(cluster.accelerator, cluster.efficiency_setting,
                                    est.inputs["strategy"].get("dtype", "bf16"), model.moe)
    return {"strategy": compact_text(est.inputs["strategy"], family.strategy_knobs), "rank": rank,
            "feasible": est.feasible,
            "error_band": band["text"], "efficiency": "Tensor rate: " + efficiency["text"],
            "note": note or "; ".join(est.reasons), "step_time_s": est.step_time_s,
            "breakdown_s": dict(est.breakdown_s), "memory_bytes": dict(est.memory_bytes),
            "labels": breakdown_labels(est.inputs["strategy"], model.tied_embeddings),
            "training": economics.with_ranges(est.to_dict()["training"], band)}


def _splits(cols: dict, cluster: Cluster, family) -> list:
    """Per MP = TP x PP (its DP = devices / (MP x CP)): the fastest strategy that fits, or, where none
    does, the fastest that breaks no rule but memory (drawn at that time, as the COMET paper draws such
    splits) and why it does not fit. Memory by part is that of the split's fastest strategy that fits,
    else of its leanest."""
    mp_all = cols["tp"] * cols["pp"]
    runnable = (cols["infeasible_mask"] & ~_memory_bit(family)) == 0
    times, memory = cols["step_time_s"], cols["memory_per_device_bytes"]
    parts = [k[len("memory_"):-len("_bytes")] for k in cols if k.startswith("memory_") and k.endswith("_bytes")
             and k != "memory_per_device_bytes"]
    acc = cluster.accelerator
    out = []
    for mp in np.unique(mp_all):
        here = mp_all == mp
        fits, run = np.flatnonzero(here & cols["feasible"]), np.flatnonzero(here & runnable)
        if len(fits):
            row = shown = int(fits[np.argmin(times[fits])])
            why = "fits"
        elif len(run):
            row, shown = int(run[np.argmin(times[run])]), int(run[np.argmin(memory[run])])
            why = (f"does not fit: needs at least {format_bytes(memory[shown])} per device, "
                   f"{acc.state_tiers} holds {format_bytes(acc.state_capacity)}")
        else:
            row = shown = None
            counts = reason_counts(cols["infeasible_mask"][here], family.rules)
            why = "invalid: " + "; ".join(family.rule_text[k] for k in sorted(counts, key=counts.get, reverse=True)[:2])
        out.append({"mp": int(mp), "dp": int(cols["dp"][np.flatnonzero(here)[0]]), "fits": bool(len(fits)),
                    "step_time_s": float(times[row]) if row is not None else None, "why": why,
                    "strategy": compact_text(strategy_at(cols, row).to_dict(), family.strategy_knobs)
                    if row is not None else None,
                    "memory_parts": {p: float(cols[f"memory_{p}_bytes"][shown]) for p in parts}
                    if shown is not None else {}})
    return out


def _doubling(model, cluster: Cluster, devices: int, st, cols: dict, ranked: np.ndarray) -> list:
    """What doubling each resource (whatif.default_resources) buys: the best strategy's speedup."""
    if len(ranked):
        row = int(ranked[0])
        baseline = Best(float(cols["step_time_s"][row]), float(cols["tokens_per_second"][row]), None, None,
                        len(st), len(ranked))
    else:
        baseline = Best(None, None, None, None, len(st), 0, "nothing fits")
    out = []
    for resource in default_resources(cluster, model):
        cell = scaled_best(model, cluster, devices, candidates(st, cols, resource), baseline, resource, 2.0)
        note = cell.note or ("fits only with it doubled" if cell.speedup is None and cell.step_time_s else "")
        out.append({"resource": resource, "speedup": cell.speedup, "step_time_s": cell.step_time_s, "note": note,
                    "added_usd": cell.added_usd})
    return out


def designs(view: View) -> list:
    """The cluster designs the page evaluates (as it is, and each resource doubled) that fit and whose purchase
    price is known: dicts label, step_time_s, value (USD), on_front. A doubled design's price is the cluster's
    plus what the resource's per-unit price adds; without a per-unit price for it, its price is unknown and
    the design is left out. on_front: no other design is both as cheap or cheaper and faster (the Pareto
    front of step time against price)."""
    base = view.price_usd
    out = []
    if math.isfinite(base) and view.top:
        out.append({"label": "as it is", "step_time_s": view.top[0]["step_time_s"], "value": base})
    for row in view.doubling:
        if math.isfinite(base) and row["step_time_s"] and row["added_usd"] is not None:
            out.append({"label": f"{described(row['resource']).label} x2", "step_time_s": row["step_time_s"],
                        "value": base + row["added_usd"]})
    for d in out:
        d["on_front"] = not any(o is not d and o["value"] <= d["value"] and o["step_time_s"] < d["step_time_s"]
                                for o in out)
    return out
