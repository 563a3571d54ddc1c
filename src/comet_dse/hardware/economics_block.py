"""What a cluster draws and costs beyond its devices' datasheet power and price: the inputs of time-to-train,
energy and cost (docs/economics.md).

A cluster file's ``economics:`` block (every field optional; SI units inside, units at the boundary):

    economics:
      rent: 2 USD/h              # per device-hour (USD per device-second inside)
      idle_power: 70 W           # a device's draw while idle (pipeline bubble, fixed overhead)
      memory_power: 420 W        # ... while memory-bound kernels run (the optimizer step too)
      network_power: 280 W       # ... while exposed communication runs
      node_power: 4.6 kW         # per node besides its devices: CPUs, NICs, NVSwitches, fans
      switch_power: 80 W         # per device: its share of the switches outside the nodes
      pue: 1.2                   # power usage effectiveness of the data centre
      energy_price: 0.08 USD/kWh
      lifetime: 5 years          # the purchase price is spread over it
      cost_basis: rent           # rent | own; default: rent where a rent is given
      mtbf: 50677 h              # goodput (whole_run/goodput.py): mean time between failures per device
      restart_time: 10 min       # ... from a failure to training again, re-load aside
      checkpoint_interval: 1 h   # ... default: Young's optimum sqrt(2 x checkpoint stall x job MTBF)
      storage_bandwidth: 122 MB/s   # ... checkpoint write and read bandwidth per device
      host_bandwidth: 31.5 GB/s     # ... device-to-host copy per device (async checkpoints)
      checkpoint_bytes: 14       # ... bytes per parameter a checkpoint holds
      checkpoint: sync           # sync | async
      goodput: on                # on | off (off: every step trains, a perfect run)
      unit_price: {hbm_capacity: 15 USD/GiB}      # price follows the design
      unit_power: {hbm_bandwidth: 31 W/(TB/s)}    # power follows the design

A field left out is unknown (None), never 0; whole_run/economics.py says what each unknown leaves unknown. The
compute-bound draw is the cluster's ``device_power_w`` (the datasheet TDP).

Per-unit prices and powers make price and power follow a design: the cluster's ``device_price_usd`` and
draws hold for the resources as the file gives them (``reference``, recorded when the file is read); a
design with more of a resource costs ``unit_price x (value - reference)`` more per device, and draws
``unit_power x (value - reference)`` more in the state the resource serves (``STATE``). This module is on
the floor of the cluster (2): it reads and checks the inputs; whole_run/economics.py (floor 5) computes with
them (docs/architecture.md).
"""
from __future__ import annotations

import dataclasses as dc
from dataclasses import dataclass, field

from comet_dse.base.bounds import BOUNDS
from comet_dse.base.errors import InputError
from comet_dse.base.loading import Fields
from comet_dse.base.units import (
    KIND_BANDWIDTH, KIND_BYTES, KIND_COUNT, KIND_DURATION, KIND_ENERGY_PRICE, KIND_FLOPS, KIND_POWER, KIND_RENT,
    parse_per_unit, parse_quantity,
)

# Field (as a cluster file, ``--set`` and a study axis name it) -> (unit kind, row of bounds.BOUNDS, attribute).
FIELDS = {
    "rent": (KIND_RENT, "rent", "rent_usd_per_s"),
    "idle_power": (KIND_POWER, "state_power_w", "idle_power_w"),
    "memory_power": (KIND_POWER, "state_power_w", "memory_power_w"),
    "network_power": (KIND_POWER, "state_power_w", "network_power_w"),
    "node_power": (KIND_POWER, "node_power_w", "node_power_w"),
    "switch_power": (KIND_POWER, "state_power_w", "switch_power_w"),
    "pue": (KIND_COUNT, "pue", "pue"),
    "energy_price": (KIND_ENERGY_PRICE, "energy_price", "energy_price_usd_per_j"),
    "lifetime": (KIND_DURATION, "lifetime", "lifetime_s"),
    # goodput (whole_run/goodput.py, docs/economics.md "Goodput")
    "mtbf": (KIND_DURATION, "mtbf", "mtbf_s"),
    "restart_time": (KIND_DURATION, "restart_time", "restart_s"),
    "checkpoint_interval": (KIND_DURATION, "checkpoint_interval", "checkpoint_interval_s"),
    "storage_bandwidth": (KIND_BANDWIDTH, "storage_bandwidth", "storage_bandwidth"),
    "host_bandwidth": (KIND_BANDWIDTH, "storage_bandwidth", "host_bandwidth"),
    "checkpoint_bytes": (KIND_COUNT, "checkpoint_bytes", "checkpoint_bytes_per_parameter"),
}
COST_BASES = ("rent", "own")
CHECKPOINT_MODES = ("sync", "async")   # how a checkpoint is written (whole_run/goodput.py: sync stalls training)
SWITCHES = ("on", "off")
# The settings that take a name, not a number -> the names they take.
CHOICES = {"cost_basis": COST_BASES, "checkpoint": CHECKPOINT_MODES, "goodput": SWITCHES}
# The resources a price or power per unit may be given for -> their unit kind; and network.<dim>.bandwidth
# (per device, per direction) for every network dimension.
PRICED = {"peak_flops": KIND_FLOPS, "hbm_capacity": KIND_BYTES, "hbm_bandwidth": KIND_BANDWIDTH,
          "sram_capacity": KIND_BYTES, "sram_bandwidth": KIND_BANDWIDTH, "expansion_capacity": KIND_BYTES,
          "expansion_bandwidth": KIND_BANDWIDTH}
STATES = ("compute", "memory", "network", "idle")


def state_of(resource: str) -> str:
    """The draw a resource's per-unit power adds to: compute (peak FLOP/s), memory (a memory tier's
    bandwidth), network (a network dimension's bandwidth) or 'all' (a capacity: powered all the time)."""
    if resource == "peak_flops":
        return "compute"
    if resource.endswith("_capacity"):
        return "all"
    return "network" if resource.startswith("network.") else "memory"


@dataclass(frozen=True)
class Economics:
    """Power and price inputs of a cluster beyond ``device_price_usd`` and ``device_power_w``; SI units
    (W, USD, seconds, USD per joule, USD per device-second); None: unknown. ``unit_price`` /
    ``unit_power``: resource -> USD / W per SI unit; ``reference``: resource -> the value the cluster's price
    and draws hold for (recorded when a cluster file is read, ``anchored``)."""

    rent_usd_per_s: float | None = None
    idle_power_w: float | None = None
    memory_power_w: float | None = None
    network_power_w: float | None = None
    node_power_w: float | None = None
    switch_power_w: float | None = None
    pue: float | None = None
    energy_price_usd_per_j: float | None = None
    lifetime_s: float | None = None
    cost_basis: str | None = None
    mtbf_s: float | None = None                 # goodput (whole_run/goodput.py); None: its default
    restart_s: float | None = None
    checkpoint_interval_s: float | None = None  # None: Young's optimum
    storage_bandwidth: float | None = None
    host_bandwidth: float | None = None
    checkpoint_bytes_per_parameter: float | None = None
    checkpoint: str | None = None
    goodput: str | None = None
    unit_price: dict = field(default_factory=dict)
    unit_power: dict = field(default_factory=dict)
    reference: dict = field(default_factory=dict)


def amount(cluster, resource: str) -> float:
    """How much of a priced resource one device of ``cluster`` has, in SI units: peak_flops the bf16 rate
    (else the largest), a memory tier's capacity or bandwidth (0 without an expansion tier), a network
    dimension's bandwidth per device, per direction."""
    acc = cluster.accelerator
    if resource == "peak_flops":
        return acc.peak_flops.get("bf16", max(acc.peak_flops.values()))
    if resource in PRICED:
        tier_name, attr = resource.split("_", 1)
        tier = getattr(acc, tier_name)
        return float(getattr(tier, attr)) if tier is not None else 0.0
    _, dim, _ = resource.split(".")
    return float(next(d for d in cluster.network if d.name == dim).bandwidth)


def anchored(cluster):
    """``cluster`` with its economics' ``reference`` recorded: the present amount of every resource that has
    a per-unit price or power. A cluster file's reader calls it once; a changed cluster keeps it."""
    econ = cluster.economics
    names = sorted(set(econ.unit_price) | set(econ.unit_power))
    reference = {name: amount(cluster, name) for name in names}
    return dc.replace(cluster, economics=dc.replace(econ, reference=reference))


def resource_names(cluster) -> list:
    """Every resource a per-unit price or power may be given for on ``cluster``."""
    return list(PRICED) + [f"network.{d.name}.bandwidth" for d in cluster.network]


def unit_kind(resource: str) -> str:
    """The unit kind of a priced resource (a network dimension's bandwidth: bytes/s)."""
    return PRICED.get(resource, KIND_BANDWIDTH)


def parse_setting(name: str, value, where: str):
    """The SI value of one economics setting as ``--set``, a study axis or a cluster file gives it
    (``rent``, ``pue``, ``unit_price.hbm_capacity``, ...), checked against its row of bounds.BOUNDS;
    ``cost_basis``, ``checkpoint`` and ``goodput`` a name (CHOICES). InputError naming ``where`` otherwise."""
    if name in CHOICES:
        text = _choice_text(value)
        if text not in CHOICES[name]:
            raise InputError(where, f"must be one of {', '.join(CHOICES[name])}, got {value!r}")
        return text
    if name.startswith(("unit_price.", "unit_power.")):
        head, resource = name.split(".", 1)
        number = parse_per_unit(value, "USD" if head == "unit_price" else "W", unit_kind(resource), where)
        return BOUNDS[head].check(where, number, repr(value))
    kind, bound, _ = FIELDS[name]
    if name in _EXAMPLE and _bare(value):
        raise InputError(where, f"needs a unit, like {_EXAMPLE[name]}, got {value!r} (a bare number would be read in "
                         f"SI units, {_SI_UNIT[name]})")
    number = parse_quantity(value, kind, where)
    return BOUNDS[bound].check(where, number, repr(value))


_EXAMPLE = {"rent": "'2 USD/h'", "energy_price": "'0.08 USD/kWh'", "lifetime": "'5 years'", "mtbf": "'50000 h'",
            "restart_time": "'10 min'", "checkpoint_interval": "'1 h'", "storage_bandwidth": "'122 MB/s'",
            "host_bandwidth": "'31.5 GB/s'"}
_SI_UNIT = {"rent": "USD per device-second", "energy_price": "USD per joule", "lifetime": "seconds",
            "mtbf": "seconds", "restart_time": "seconds", "checkpoint_interval": "seconds",
            "storage_bandwidth": "bytes per second", "host_bandwidth": "bytes per second"}


def _choice_text(value) -> str:
    """A named setting's value as text; YAML reads a bare on/off as a bool."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _bare(value) -> bool:
    """Whether ``value`` is a number without a unit (a YAML number, or text that is only a number)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    try:
        float(str(value).strip())
    except ValueError:
        return False
    return True


def is_setting(name: str) -> bool:
    """Whether ``name`` is an economics setting (``rent``, ``unit_price.<resource>``, ...)."""
    return name in FIELDS or name in CHOICES or name.startswith(("unit_price.", "unit_power."))


def current(cluster, name: str):
    """The cluster's present value of an economics setting (None: unknown)."""
    econ = cluster.economics
    if name in CHOICES:
        return getattr(econ, name)
    if name.startswith(("unit_price.", "unit_power.")):
        head, resource = name.split(".", 1)
        return getattr(econ, head).get(resource)
    return getattr(econ, FIELDS[name][2])


def with_setting(cluster, name: str, value):
    """``cluster`` with one economics setting set to ``value`` (SI, already checked). A per-unit figure for
    a resource the cluster had none for is anchored at the resource's present amount."""
    econ = cluster.economics
    if name in CHOICES:
        return dc.replace(cluster, economics=dc.replace(econ, **{name: value}))
    if name.startswith(("unit_price.", "unit_power.")):
        head, resource = name.split(".", 1)
        figures = {**getattr(econ, head), resource: value}
        reference = {**econ.reference}
        reference.setdefault(resource, amount(cluster, resource))
        return dc.replace(cluster, economics=dc.replace(econ, **{head: figures, "reference": reference}))
    return dc.replace(cluster, economics=dc.replace(econ, **{FIELDS[name][2]: value}))


def economics_from(fields: Fields, network_names: tuple) -> Economics:
    """The ``economics:`` block of a cluster file (hardware.load.cluster_from); every field optional."""
    values = {}
    for name, (_, _, attr) in FIELDS.items():
        if fields.has(name):
            values[attr] = parse_setting(name, fields.raw(name), fields.name(name))
    for name in CHOICES:
        if fields.has(name):
            values[name] = parse_setting(name, fields.raw(name), fields.name(name))
    known = list(PRICED) + [f"network.{n}.bandwidth" for n in network_names]
    for head in ("unit_price", "unit_power"):
        if not fields.has(head):
            continue
        block = fields.sub(head)
        figures = {}
        for resource in block.data:
            if resource == "source":
                continue
            if str(resource) not in known:
                raise InputError(block.name(str(resource)), f"not a resource with a per-unit figure; known: {', '.join(known)}")
            figures[str(resource)] = parse_setting(f"{head}.{resource}", block.raw(resource), block.name(str(resource)))
        block.reject_unknown(("source",))
        values[head] = figures
    fields.reject_unknown(("source",))
    return Economics(**values)
