"""Days, megawatt-hours and dollars: what training on a token budget takes, over arrays of design points.

For a step of ``step_time`` seconds whose parts (``breakdown``, cost/step.py) add up to it, on ``devices``
devices of a cluster, and a budget of ``tokens`` tokens (docs/economics.md has every formula and source):

    productive time [s]    T0 = tokens / tokens_per_second                   (every step trains)
    time to train [s]      T = T0 / goodput                                  (whole_run/goodput.py: failures, restarts,
                                                                             checkpoints)
    device time [s]        D = devices x T                                   (shown in device-hours)
    device draw [W]        P_dev = sum over states s of P_s x f_s            f_s = the step's time in state s
                                                                             / step time (STATE_OF_PART)
    cluster draw [W]       P = PUE x (devices x (P_dev + P_switch) + nodes x P_node)
    energy [J]             E = P x (T0 + work redone) + P_idle x (checkpoint stalls + restarts)
                                                                             (shown in MWh; P_idle: P with every
                                                                             device idle)
    owning [USD]           C_own = devices x price x T / lifetime + E x energy price
    renting [USD]          C_rent = D x (rent + (price - price as given) / lifetime)
    cost [USD]             C = C_rent with the cost basis 'rent' (the default where a rent is known), else C_own

The states of a device are compute-bound kernels (drawing the datasheet TDP, ``device_power_w``),
memory-bound kernels and the optimizer step (``memory_power``), exposed communication and expansion-tier
traffic (``network_power``) and idle (the pipeline bubble, fixed overhead: ``idle_power``). Per-unit prices
and powers (hardware/economics_block.py) make price and draws follow the design. Unknown stays unknown: NaN
inside, null in JSON, "unknown" in text; a node or switch share without a figure is left out of the
energy and named in ``excluded``, never counted as 0 silently.

Floor 4 (docs/architecture.md): it reads a Cluster and arrays; estimate, the design space, whatif, the
API, the explorer and the command line all use it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from comet_dse.base.bounds import BOUNDS
from comet_dse.base.errors import InputError
from comet_dse.base.units import KIND_TOKENS, KWH, YEAR, parse_quantity
from comet_dse.hardware.economics_block import amount, state_of
from comet_dse.hardware.spec import Cluster
from comet_dse.whole_run import goodput

# Defaults where a cluster file gives no figure: editable assumptions with their sources (docs/economics.md),
# each overridable with --set.
DEFAULT_PUE = 1.2                     # between Google's fleet-wide 1.10 (2023 Environmental Report) and the
                                      # Uptime Institute 2023 survey average of 1.58: a modern hyperscale hall
DEFAULT_ENERGY_PRICE = 0.0806 / KWH   # USD per J: US average industrial electricity price 2023, 8.06 cents/kWh
                                      # (EIA, Electric Power Annual 2023)
DEFAULT_LIFETIME = 5 * YEAR           # Amazon shortened its servers' useful life from 6 to 5 years (2025,
                                      # Q4 2024 results); Meta uses 5.5, Microsoft and Alphabet 6
IDLE_FRACTION = 0.10                  # editable assumptions: a device's draw as a fraction of its TDP while
MEMORY_FRACTION = 0.60                # idle, running memory-bound kernels, or communicating, where the cluster
NETWORK_FRACTION = 0.40               # file gives no figure (docs/economics.md: why these)

# The part of a step's time (vocabulary.TIME_PARTS) -> the state of the device during it.
STATE_OF_PART = {
    "compute": "compute", "memory": "memory", "optimizer": "memory",
    "tp_communication": "network", "cp_communication": "network", "ep_communication": "network",
    "pp_communication": "network", "dp_communication": "network", "offload": "network",
    "pipeline_bubble": "idle", "overhead": "idle",
}
COLUMNS = ("productive_time_s", "goodput", "time_to_train_s", "device_time_s", "average_power_w", "energy_j", "training_cost_rent_usd",
           "training_cost_own_usd", "training_cost_usd")


@dataclass(frozen=True)
class Rates:
    """What one design costs and draws per device, per node and per second, before any step is known.
    SI units; NaN: unknown."""

    devices: int
    nodes: int
    device_price_usd: float       # purchase price of one device at this design
    price_delta_usd: float        # of which the per-unit prices add over the price as given (0 without any)
    draws_w: dict                 # state -> a device's draw in it [W]
    added_w: float                # what per-unit powers add to memory and network draws over the design as given
    node_power_w: float           # per node besides its devices
    switch_power_w: float         # per device: its share of the switches outside the nodes
    pue: float
    energy_price_usd_per_j: float
    lifetime_s: float
    rent_usd_per_s: float         # per device-second, as given
    basis: str                    # 'rent' or 'own'
    reliability: goodput.Reliability = goodput.Reliability()   # failures, restarts, checkpoints (whole_run/goodput.py)

    @property
    def excluded(self) -> list:
        """What the energy leaves out for want of a figure: 'node overhead', 'network switches'."""
        return [name for name, value in (("node overhead", self.node_power_w), ("network switches", self.switch_power_w))
                if math.isnan(value)]

    @property
    def rated_power_w(self) -> float:
        """What a data centre provisions for the cluster [W]: PUE x (devices x (TDP + what per-unit powers add to
        the memory and network draws, as if every added part were busy at once + switch share) + nodes x node
        overhead); the parts ``excluded`` names left out, NaN without a device power."""
        device = self.draws_w["compute"] + self.added_w
        return self.pue * (self.devices * (device + _known(self.switch_power_w)) + self.nodes * _known(self.node_power_w))

    @property
    def cluster_price_usd(self) -> float:
        """devices x the device price at this design [USD] (NaN without a price)."""
        return self.devices * self.device_price_usd


def token_budget(value, field: str = "tokens", given: str | None = None) -> float | None:
    """A token budget in tokens: a number (``15e12``) or text with an optional k, M, G, T or P suffix (``"15T"``
    = 1.5e13), in the row ``tokens`` of bounds.BOUNDS; None stays None. The API, ``--tokens`` and the explorer
    read a budget here. An error is an InputError naming ``field``; a value out of range is written as
    ``given`` (default: its repr)."""
    if value is None:
        return None
    number = parse_quantity(value, KIND_TOKENS, field)
    return BOUNDS["tokens"].check(field, number, repr(value) if given is None else given)


def usd_amount(value, field: str = "budget") -> float:
    """An amount of US dollars [USD]: a number, or text with an optional k, M, G suffix and an optional $ or
    USD ("50M", "$5e7", "12M USD"). ``plan --budget`` and the API's ``plan(budget=)`` read it here; an
    InputError naming ``field`` otherwise (the bounds are the caller's: budget_usd)."""
    if isinstance(value, str):
        value = value.strip().lstrip("$").removesuffix("USD").strip()
    return parse_quantity(value, KIND_TOKENS, field)


def _known(x: float) -> float:
    """``x``, or 0 where it is unknown: only for the parts ``Rates.excluded`` names."""
    return 0.0 if math.isnan(x) else x


def _number(x) -> float:
    return float("nan") if x is None else float(x)


def price_delta(cluster: Cluster) -> float:
    """USD one device costs more (or less) than its price as given: sum over resources with a per-unit price
    of unit_price x (amount now - amount as given). 0 without per-unit prices."""
    econ = cluster.economics
    return sum(price * (amount(cluster, r) - econ.reference.get(r, amount(cluster, r)))
               for r, price in econ.unit_price.items())


def device_price(cluster: Cluster) -> float:
    """Purchase price of one device at this design [USD]: device_price_usd + price_delta; NaN when unknown, and
    where the per-unit prices would take it below 0 (a design far smaller than the one priced: the linear
    per-unit model says nothing there)."""
    return _not_negative(_number(cluster.device_price_usd) + price_delta(cluster))


def _unknown_below_zero(cost) -> np.ndarray:
    """``cost`` (USD, an array) with NaN (unknown) where it is below 0: a rent lowered by per-unit prices past
    nothing (a design far smaller than the one priced: -146,367 USD was shown) is no figure at all."""
    cost = np.asarray(cost, dtype=float)
    return np.where(cost < 0, np.nan, cost)


def check_design(cluster: Cluster, field: str) -> None:
    """An InputError naming ``field`` when the per-unit prices and powers take a design's device price past
    the ``device_price_usd`` bound or a draw past the ``device_power_w`` bound (bounds.BOUNDS): a unit price
    times a scaled resource was unbounded (1e12 to 1e20 USD devices). Below 0 stays unknown (NaN), as
    ``device_price`` and ``device_draws`` say."""
    econ = cluster.economics
    if not econ.unit_price and not econ.unit_power:
        return
    price, price_bound = device_price(cluster), BOUNDS["device_price_usd"]
    if price > price_bound.high:
        raise InputError(field, f"the per-unit prices make one device cost {price:.4g} USD at this design, beyond "
                         f"{price_bound.high:g} USD (the device_price_usd bound); check unit_price and its units")
    power_bound = BOUNDS["device_power_w"]
    for state, watts in device_draws(cluster).items():
        if watts > power_bound.high:
            raise InputError(field, f"the per-unit powers make one device draw {watts:.4g} W while {state} at this "
                             f"design, beyond {power_bound.high:g} W (the device_power_w bound); check unit_power")


def _not_negative(x: float) -> float:
    """``x``, or NaN (unknown) where it is negative: a price or a draw below 0 is no figure at all."""
    return x if not x < 0 else float("nan")


def device_draws(cluster: Cluster) -> dict:
    """State -> one device's draw in it [W] at this design. Compute-bound: device_power_w (the datasheet TDP);
    memory-bound, communicating, idle: the cluster's figures, else IDLE/MEMORY/NETWORK_FRACTION x TDP; plus,
    per resource with a per-unit power, unit_power x (amount now - amount as given) in the state it serves
    (every state for a capacity). NaN where the cluster has no figure and no TDP, or where the per-unit powers
    would take a draw below 0."""
    econ = cluster.economics
    tdp = _number(cluster.device_power_w)
    draws = {"compute": tdp,
             "memory": _number(econ.memory_power_w) if econ.memory_power_w is not None else MEMORY_FRACTION * tdp,
             "network": _number(econ.network_power_w) if econ.network_power_w is not None else NETWORK_FRACTION * tdp,
             "idle": _number(econ.idle_power_w) if econ.idle_power_w is not None else IDLE_FRACTION * tdp}
    for r, watts in econ.unit_power.items():
        delta = watts * (amount(cluster, r) - econ.reference.get(r, amount(cluster, r)))
        for state in draws:
            if state_of(r) in (state, "all"):
                draws[state] += delta
    return {state: _not_negative(w) for state, w in draws.items()}


def added_power(cluster: Cluster) -> float:
    """W that per-unit powers add to the memory and network draws of one device over the design as given
    (the compute draw and the capacities' share are in device_draws' compute state already)."""
    econ = cluster.economics
    return sum(watts * (amount(cluster, r) - econ.reference.get(r, amount(cluster, r)))
               for r, watts in econ.unit_power.items() if state_of(r) in ("memory", "network"))


def rates(cluster: Cluster, devices: int) -> Rates:
    """The cost and power figures of ``devices`` devices of ``cluster`` at its present design."""
    econ = cluster.economics
    rent = _number(econ.rent_usd_per_s)
    basis = cost_basis(cluster)
    return Rates(
        devices=devices, nodes=math.ceil(devices / cluster.devices_per_node),
        device_price_usd=device_price(cluster), price_delta_usd=price_delta(cluster),
        draws_w=device_draws(cluster), added_w=added_power(cluster), node_power_w=_number(econ.node_power_w),
        switch_power_w=_number(econ.switch_power_w),
        pue=econ.pue if econ.pue is not None else DEFAULT_PUE,
        energy_price_usd_per_j=(econ.energy_price_usd_per_j if econ.energy_price_usd_per_j is not None
                                else DEFAULT_ENERGY_PRICE),
        lifetime_s=econ.lifetime_s if econ.lifetime_s is not None else DEFAULT_LIFETIME,
        rent_usd_per_s=rent, basis=basis, reliability=reliability(cluster))


def cost_basis(cluster: Cluster) -> str:
    """The cost basis of ``cluster``: its ``cost_basis``, else 'rent' where it has a rent, else 'own'."""
    econ = cluster.economics
    return econ.cost_basis or ("rent" if econ.rent_usd_per_s is not None else "own")


def cost_column(basis: str) -> str:
    """The training column of a cost basis: training_cost_rent_usd or training_cost_own_usd. A table that
    compares clusters shows one basis for all (its first or baseline cluster's), never each its own: a
    cluster without a figure for that basis is unknown there (docs/economics.md)."""
    return f"training_cost_{basis}_usd"


def reliability(cluster: Cluster) -> goodput.Reliability:
    """The goodput settings of ``cluster``'s economics block, whole_run/goodput.py's defaults where it gives none:
    the MTBF of its accelerator's family (goodput.mtbf_of), the async copy at its host link's achievable
    bandwidth where the preset states one (Accelerator.host)."""
    econ, default = cluster.economics, goodput.Reliability()

    def given(value, fallback):
        return fallback if value is None else value

    host = cluster.accelerator.host
    return goodput.Reliability(
        mtbf_s=given(econ.mtbf_s, goodput.mtbf_of(cluster.accelerator.name)[0]),
        restart_s=given(econ.restart_s, default.restart_s),
        interval_s=econ.checkpoint_interval_s,
        storage_bandwidth=given(econ.storage_bandwidth, default.storage_bandwidth),
        checkpoint_bytes_per_parameter=given(econ.checkpoint_bytes_per_parameter,
                                             default.checkpoint_bytes_per_parameter),
        host_bandwidth=given(econ.host_bandwidth, host.achievable_bandwidth if host else default.host_bandwidth),
        checkpoint=given(econ.checkpoint, default.checkpoint), enabled=econ.goodput != "off")


def state_fractions(step_time, breakdown: dict) -> dict:
    """State -> the fraction of the step a device spends in it: the step's parts (seconds, arrays or
    floats) summed by STATE_OF_PART, divided by the step time; idle takes what the others leave."""
    step = np.asarray(step_time, dtype=float)
    out = {s: np.zeros_like(step) for s in ("compute", "memory", "network")}
    for part, seconds in breakdown.items():
        state = STATE_OF_PART.get(part, "idle")
        if state != "idle":
            out[state] = out[state] + np.asarray(seconds, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = {s: v / step for s, v in out.items()}
    out["idle"] = 1.0 - out["compute"] - out["memory"] - out["network"]
    return out


def average_power(r: Rates, step_time, breakdown: dict) -> np.ndarray:
    """The cluster's average draw over a step, at the wall [W]:
    PUE x (devices x (sum_s P_s x f_s + P_switch) + nodes x P_node); the parts ``r.excluded`` names left out."""
    f = state_fractions(step_time, breakdown)
    device = sum(r.draws_w[s] * f[s] for s in ("compute", "memory", "network", "idle"))
    return r.pue * (r.devices * (device + _known(r.switch_power_w)) + r.nodes * _known(r.node_power_w))


def idle_power(r: Rates) -> float:
    """The cluster's draw at the wall with every device idle [W] (checkpoint stalls, restarts):
    PUE x (devices x (P_idle + P_switch) + nodes x P_node); the parts ``r.excluded`` names left out."""
    return r.pue * (r.devices * (r.draws_w["idle"] + _known(r.switch_power_w)) + r.nodes * _known(r.node_power_w))


def training(r: Rates, step_time, tokens_per_second, breakdown: dict, tokens: float, parameters) -> dict:
    """The COLUMNS of training on ``tokens`` tokens, one value per design point (arrays as the inputs;
    SI units: s, W, J, USD; NaN where an input is unknown). ``parameters``: the model's parameters, what a
    checkpoint holds (whole_run/goodput.py)."""
    return training_parts(r, step_time, tokens_per_second, breakdown, tokens, parameters)[0]


def training_parts(r: Rates, step_time, tokens_per_second, breakdown: dict, tokens: float, parameters) -> tuple:
    """(COLUMNS, goodput.run's terms) of training on ``tokens`` tokens: ``training`` and where the time
    beyond the productive time goes."""
    step = np.asarray(step_time, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        productive = tokens / np.asarray(tokens_per_second, dtype=float)
    lost = goodput.run(r.reliability, r.devices, parameters, productive)
    time = lost["wall_s"]
    busy = average_power(r, step, breakdown)
    energy = busy * (productive + lost["lost_work_s"]) + idle_power(r) * (lost["checkpoint_time_s"]
                                                                          + lost["restart_time_s"])
    with np.errstate(divide="ignore", invalid="ignore"):
        power = np.where(time > 0, energy / np.where(time > 0, time, 1.0), busy)
    device_time = r.devices * time
    own = _unknown_below_zero(r.devices * r.device_price_usd * time / r.lifetime_s + energy * r.energy_price_usd_per_j)
    rent = _unknown_below_zero(device_time * (r.rent_usd_per_s + r.price_delta_usd / r.lifetime_s))
    shape = np.broadcast_shapes(step.shape, np.shape(time))
    cols = {"productive_time_s": productive, "goodput": lost["goodput"], "time_to_train_s": time, "device_time_s": device_time, "average_power_w": power, "energy_j": energy,
            "training_cost_rent_usd": rent, "training_cost_own_usd": own,
            "training_cost_usd": rent if r.basis == "rent" else own}
    return ({k: np.broadcast_to(np.asarray(v, dtype=float), shape) for k, v in cols.items()},
            {k: np.broadcast_to(np.asarray(v, dtype=float), shape) for k, v in lost.items()})


def training_of(cluster: Cluster, devices: int, step_time: float, tokens_per_second: float, breakdown: dict,
                tokens: float, parameters: float) -> dict:
    """``training`` of one design point as plain floats, with what was assumed and, under ``goodput_terms``,
    where the time beyond the productive time goes (goodput.run): the JSON block of ``estimate --tokens``
    (Estimate.training)."""
    r = rates(cluster, devices)
    cols, lost = training_parts(r, np.array([step_time]), np.array([tokens_per_second]),
                                {k: np.array([v]) for k, v in breakdown.items()}, tokens, np.array([parameters]))
    out = {"tokens": float(tokens), **{k: float(v[0]) for k, v in cols.items()}}
    out.update(inputs(r))
    out["goodput_terms"] = {**{k: float(v[0]) for k, v in lost.items() if k not in ("goodput", "wall_s")},
                            **reliability_inputs(r.reliability),
                            "mtbf_source": ("as given" if cluster.economics.mtbf_s is not None
                                            else goodput.mtbf_of(cluster.accelerator.name)[1]),
                            "not_counted": list(goodput.NOT_COUNTED)}
    return out


def reliability_inputs(rel: goodput.Reliability) -> dict:
    """The goodput settings a figure was computed with (SI; checkpoint_interval_s None: Young's optimum)."""
    return {"enabled": rel.enabled, "mtbf_per_device_s": rel.mtbf_s, "restart_time_setting_s": rel.restart_s,
            "checkpoint_interval_given_s": rel.interval_s, "storage_bandwidth_per_device": rel.storage_bandwidth,
            "host_bandwidth_per_device": rel.host_bandwidth,
            "checkpoint_bytes_per_parameter": rel.checkpoint_bytes_per_parameter, "checkpoint": rel.checkpoint}


def inputs(r: Rates) -> dict:
    """What a training figure was computed with (SI; NaN unknown): the cost basis, prices, draws, PUE,
    lifetime and what the energy leaves out."""
    return {"cost_basis": r.basis, "device_price_usd": r.device_price_usd, "rent_usd_per_device_s": r.rent_usd_per_s,
            "energy_price_usd_per_j": r.energy_price_usd_per_j, "lifetime_s": r.lifetime_s, "pue": r.pue,
            "device_power_w": dict(r.draws_w), "node_power_w": r.node_power_w, "switch_power_w": r.switch_power_w,
            "nodes": r.nodes, "energy_excludes": r.excluded}


# The training figures (economics.COLUMNS) that grow in proportion to the step time, and so take its band.
RANGED = ("productive_time_s", "time_to_train_s", "device_time_s", "energy_j", "training_cost_rent_usd",
          "training_cost_own_usd", "training_cost_usd")


def band_range(value: float, band: dict) -> list | None:
    """[low, high] of a figure that grows in proportion to the step time, where the measured step time lies
    given the band: the band is of (predicted - measured) / measured = e, so measured = predicted / (1 + e), and
    the figure runs from value / (1 + high) to value / (1 + low). None without a validated band or a value."""
    if not band or band.get("low") is None or band.get("high") is None or value is None or not math.isfinite(value):
        return None
    return [value / (1.0 + band["high"]), value / (1.0 + band["low"])]


def band_mean(band: dict | None) -> float | None:
    """The mean signed error a band's figures are corrected by (``expected``): None without a band's range."""
    return band.get("mean_error") if band and band.get("low") is not None else None


def expected(value, mean_error):
    """The band's expected value of a figure that grows in proportion to the step time: the model's figure
    / (1 + the band's mean signed error e), as measured = predicted / (1 + e) (``band_range``)."""
    return value / (1.0 + mean_error)


def expected_columns(cols: dict, mean_error) -> dict:
    """A result table's training columns (RANGED, where present) as their error band's expected values, each
    divided by 1 + the band's mean signed error (``mean_error``: one per row, NaN or None where a row has no
    band), the model's own kept as ``<column>_modelled``: what ``with_ranges`` does to one estimate's figures,
    for a table (``search --tokens``). ``cols`` is not changed."""
    mean = np.nan_to_num(np.asarray(mean_error, dtype=float), nan=0.0)
    out = dict(cols)
    for k in RANGED:
        if k in cols:
            out[f"{k}_modelled"] = cols[k]
            out[k] = expected(np.asarray(cols[k], dtype=float), mean)
    return out


def with_ranges(training: dict | None, band: dict | None) -> dict | None:
    """``training`` (Estimate.training, training_of) under its error band, for every figure of RANGED (time to
    train, device time, energy and cost): ``<figure>_range`` = band_range of the model's figure, and the
    headline ``<figure>`` the band's expected value, the model's figure / (1 + the band's mean signed error),
    which lies inside the range; the model's own figure kept as ``<figure>_modelled``. Every one of them is
    proportional to the productive time (whole_run/goodput.py: the goodput does not depend on it; energy: the
    same draws over proportionally longer stalls), so both are exact for a step time anywhere in the band.
    Without a band (or one without a mean) the headline stays the model's figure. ``headline``: "expected"
    or "modelled"; ``band_mean_error``: the mean used."""
    if training is None:
        return None
    mean = band_mean(band)
    out = {**training, "headline": "modelled" if mean is None else "expected", "band_mean_error": mean}
    for k in RANGED:
        if k not in training:
            continue
        value = training.get(k)
        out[f"{k}_range"] = band_range(value, band)
        if mean is not None and value is not None and math.isfinite(value):
            out[f"{k}_modelled"] = value
            out[k] = expected(value, mean)
    return out