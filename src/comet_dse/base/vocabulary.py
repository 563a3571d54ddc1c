"""The names of what comet-dse reports, defined once: the parts of a step's time and of a device's memory,
the cluster resources a what-if or ``--set`` changes, and the fixed words of the strategy legend.

Every output that labels these quantities (the terminal text, JSON, figures, the explorer and the report)
reads them from here, so one quantity has one name and one unit everywhere (docs/vocabulary.md).

Network bandwidth has one convention in every output: bytes/s **per device, per direction** (a network
dimension's link bandwidth x its links per device). The per-link figure is shown only where it is named
so (``network.<dim>.link_bandwidth``, an input kept for cluster files and older commands).

This module is on the bottom floor: it imports nothing of comet_dse, and knows nothing of models,
clusters or strategies beyond the plain values passed in.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """One part of a step's time or of a device's memory: its key (as in ``breakdown_s`` / ``memory_bytes``
    and the ``time_<key>_s`` / ``memory_<key>_bytes`` columns), label, colour in figures and meaning."""

    key: str
    label: str
    color: str
    meaning: str


# The parts of a step's time, in the order of cost/step.py's breakdown (they add up to the step time).
TIME_PARTS = (
    Part("compute", "compute-bound kernels", "#4C72B0",
         "kernels limited by the device's FLOP/s (GEMMs, attention), in forward, backward and recomputation"),
    Part("memory", "memory-bound kernels", "#64B5CD",
         "kernels limited by HBM bandwidth (norms, activation functions, element-wise work)"),
    Part("tp_communication", "tensor-parallel comm (exposed)", "#DD8452",
         "TP all-reduces / all-gathers / reduce-scatters inside each layer not hidden behind compute"),
    Part("cp_communication", "context-parallel K/V exchange (exposed)", "#8172B3",
         "K and V passed between context-parallel ranks, as far as attention does not hide it"),
    Part("ep_communication", "expert all-to-all (exposed)", "#937860",
         "tokens sent to their experts and back (MoE), as far as not overlapped"),
    Part("embedding_communication", "embedding exchange (exposed)", "#A6761D",
         "a recommendation model's row indices sent to the devices that hold their rows, its pooled embeddings "
         "sent to the devices that own each sample and their gradients sent back (all-to-all, or reduce-scatter "
         "and all-gather row-wise), as far as not overlapped"),
    Part("pp_communication", "pipeline send/recv (exposed)", "#DA8BC3",
         "activations and their gradients sent between pipeline stages, as far as not overlapped"),
    Part("pipeline_bubble", "pipeline bubble (idle)", "#C7C7C7",
         "time the critical stage waits while the pipeline fills and drains: (pp - 1) / v micro-batch slots"),
    Part("dp_communication", "data-parallel comm (exposed)", "#55A868",
         "the gradient reduction over the data-parallel (and context-parallel) ranks and ZeRO's weight "
         "gathers, as far as not hidden; plus, with tied embeddings and pp > 1, the embedding gradient "
         "all-reduce between the first and last stage (always exposed)"),
    Part("optimizer", "optimizer step", "#8C8C8C", "the Adam update of this device's share of the weights"),
    Part("offload", "offload traffic (exposed)", "#CCB974",
         "reads and writes of state spilled to the expansion memory tier, of activations offloaded to host memory "
         "and of a recommendation model's rows in host memory, as far as not overlapped"),
    Part("overhead", "fixed framework overhead", "#B0B0B0",
         "seconds per step and per micro-batch the framework adds (0 unless calibrated)"),
)
TIME_PART = {p.key: p for p in TIME_PARTS}

# The parts of a device's memory (the busiest pipeline stage), in the order of cost/step.py.
MEMORY_PARTS = (
    Part("weights", "weights", "#4C72B0", "the stage's weights held by this device (16-bit, plus an fp8 copy in fp8)"),
    Part("gradients", "gradients", "#DD8452", "weight gradients held by this device (fp32 or 16-bit)"),
    Part("optimizer", "optimizer state", "#8172B3", "fp32 master weights and Adam moments held by this device"),
    Part("activations", "activations", "#55A868", "activations kept for backward by the micro-batches in flight"),
    Part("buffers", "communication buffers", "#C7C7C7", "tensor-parallel message buffers"),
    Part("reserved", "reserved (runtime and allocator)", "#8C564B",
         "memory the job cannot use for its tensors: what the driver keeps, the runtime context, the "
         "collective library's buffers (the cluster's reserved_memory), the GEMM libraries' workspaces "
         "(workspace_memory) and the allocator's fragmentation (its fragmentation x the rest)"),
)
MEMORY_PART = {p.key: p for p in MEMORY_PARTS}

BREAKDOWN_LABELS = {p.key: p.label for p in TIME_PARTS}
MEMORY_LABELS = {p.key: p.label for p in MEMORY_PARTS}

TIED_ONLY = "tied-embedding all-reduce (exposed)"
WITH_TIED = "data-parallel comm (exposed, incl. tied embeddings)"


def time_label(key: str) -> str:
    """The label of a time part (the key itself for one the vocabulary does not know)."""
    return TIME_PART[key].label if key in TIME_PART else key


def memory_label(key: str) -> str:
    """The label of a memory part (the key itself for one the vocabulary does not know)."""
    return MEMORY_PART[key].label if key in MEMORY_PART else key


def dp_communication_label(dp: int, cp: int, pp: int, tied_embeddings: bool) -> str:
    """What the ``dp_communication`` part holds for one strategy, as its label.

    The part is the gradient reduction over the dp x cp ranks (nothing when dp x cp = 1) plus, when the
    model ties its embeddings and pp > 1, the embedding gradient all-reduce between the first and last
    stage (cost/layout.py, cost/step.py). With dp x cp = 1 it is only that all-reduce.
    """
    grads = dp * cp > 1
    tied = bool(tied_embeddings) and pp > 1
    if tied and not grads:
        return TIED_ONLY
    if tied:
        return WITH_TIED
    return TIME_PART["dp_communication"].label


def breakdown_labels(strategy: dict | None = None, tied_embeddings: bool | None = None) -> dict:
    """Time part key -> label for one strategy (knob name -> value; its dp, cp and pp are read) and model
    (whether it ties its embeddings); without them the general labels."""
    labels = dict(BREAKDOWN_LABELS)
    if strategy is not None and tied_embeddings is not None:
        labels["dp_communication"] = dp_communication_label(
            int(strategy.get("dp", 1)), int(strategy.get("cp", 1)), int(strategy.get("pp", 1)), tied_embeddings)
    return labels


PER_DEVICE = "per device"
PER_DEVICE_DIRECTION = "per device, per direction"
PER_LINK_DIRECTION = "per link, per direction"
BANDWIDTH_CONVENTION = ("Network bandwidth is per device, per direction: a dimension's link bandwidth x its "
                        "links per device.")


@dataclass(frozen=True)
class Resource:
    """A cluster resource a what-if, the explorer or ``--set`` changes: its name (as ``--set`` takes it;
    ``<dim>`` stands for a network dimension's name), label, SI unit, display unit and the SI value of
    one display unit, what one value is counted per, its meaning and, for a resource that sets several
    values, which one is shown as its value ('bf16', 'innermost')."""

    name: str
    label: str
    si_unit: str
    unit: str
    scale: float
    per: str
    meaning: str
    shown: str = ""

    @property
    def unit_text(self) -> str:
        """The display unit with what it is counted per, e.g. 'GB/s per device, per direction'."""
        return f"{self.unit} {self.per}".strip() if self.unit else self.per

    def text(self, value) -> str:
        """``value`` (SI units, or a name) in the display unit, e.g. 4.5e11 -> '450 GB/s'; which value it
        is follows in parentheses for a resource of several values, e.g. '989 TFLOP/s (bf16)'."""
        if value is None:
            return "-"
        if isinstance(value, str):
            return value
        number = value / self.scale
        text = (f"{number:.4g} {self.unit}" if abs(number) < 1e4 else f"{number:,.0f} {self.unit}").rstrip()
        return f"{text} ({self.shown})" if self.shown else text


GiB, MiB = 2.0**30, 2.0**20
RESOURCES = (
    Resource("peak_flops", "peak compute, every dtype", "FLOP/s", "TFLOP/s", 1e12, PER_DEVICE,
             "dense FLOP/s of every dtype, scaled together", "bf16"),
    Resource("peak_flops.<dtype>", "peak compute, <dtype>", "FLOP/s", "TFLOP/s", 1e12, PER_DEVICE,
             "dense FLOP/s of one dtype"),
    Resource("hbm_capacity", "HBM capacity", "B", "GiB", GiB, PER_DEVICE, "bytes of HBM"),
    Resource("hbm_bandwidth", "HBM bandwidth", "B/s", "TB/s", 1e12, PER_DEVICE, "datasheet HBM bytes/s"),
    Resource("sram_capacity", "on-chip SRAM capacity", "B", "MiB", MiB, PER_DEVICE, "bytes of on-chip SRAM"),
    Resource("sram_bandwidth", "on-chip SRAM bandwidth", "B/s", "TB/s", 1e12, PER_DEVICE, "on-chip SRAM bytes/s"),
    Resource("expansion_capacity", "expansion tier capacity", "B", "GiB", GiB, PER_DEVICE,
             "bytes of the CXL-like expansion memory tier"),
    Resource("expansion_bandwidth", "expansion tier bandwidth", "B/s", "GB/s", 1e9, PER_DEVICE,
             "bytes/s to and from the expansion tier"),
    Resource("expansion_latency", "expansion tier latency", "s", "us", 1e-6, "per access",
             "seconds per transfer phase to the expansion tier"),
    Resource("expansion_compute", "compute on expansion-tier operands", "FLOP/s", "TFLOP/s", 1e12, PER_DEVICE,
             "FLOP/s on operands read from the expansion tier in place (a remote-memory roofline's compute roof; "
             "used with expansion_roofline)"),
    Resource("host_memory_capacity", "host memory capacity", "B", "GiB", GiB, PER_DEVICE,
             "bytes of the host's memory a device keeps embedding rows in (recommendation models)"),
    Resource("host_memory_bandwidth", "host memory link bandwidth", "B/s", "GB/s", 1e9, PER_DEVICE,
             "bytes/s a device reads its host memory at, per direction (PCIe, NVLink-C2C)"),
    Resource("reserved_memory", "reserved memory", "B", "GiB", GiB, PER_DEVICE,
             "device memory a job cannot use for its tensors: driver, runtime context, collective buffers"),
    Resource("workspace_memory", "GEMM workspaces", "B", "MiB", 2.0**20, PER_DEVICE,
             "the GEMM libraries' workspaces the framework allocates among its tensors (cuBLAS, Transformer Engine)"),
    Resource("fragmentation", "allocator fragmentation", "1", "", 1.0, "fraction of the footprint",
             "memory the allocator holds but cannot hand out, as a fraction of the rest of the footprint"),
    Resource("device_price_usd", "device price", "USD", "USD", 1.0, PER_DEVICE, "what one device costs"),
    Resource("device_power_w", "device power", "W", "W", 1.0, PER_DEVICE, "what one device draws"),
    Resource("network_bandwidth", "network bandwidth, every dimension", "B/s", "GB/s", 1e9,
             PER_DEVICE_DIRECTION, "every network dimension's bandwidth, scaled together", "innermost"),
    Resource("network_latency", "network latency, every dimension", "s", "us", 1e-6,
             "per message step", "every network dimension's latency, scaled together", "innermost"),
    Resource("network.<dim>.bandwidth", "network <dim> bandwidth", "B/s", "GB/s", 1e9, PER_DEVICE_DIRECTION,
             "bytes/s one device sends (and receives) in this dimension: link bandwidth x links per device"),
    Resource("network.<dim>.link_bandwidth", "network <dim> link bandwidth", "B/s", "GB/s", 1e9,
             PER_LINK_DIRECTION, "bytes/s of one link (a cluster file's field); prefer network.<dim>.bandwidth"),
    Resource("network.<dim>.latency", "network <dim> latency", "s", "us", 1e-6, "per message step",
             "seconds per step of a collective in this dimension"),
    Resource("network.<dim>.efficiency", "network <dim> efficiency", "1", "", 1.0, "fraction of peak",
             "fraction of the bandwidth a collective library reaches"),
    Resource("network.<dim>.topology", "network <dim> topology", "", "", 1.0, "",
             "how the devices of this dimension are wired"),
    # power and price (docs/economics.md): what a token budget costs in days, megawatt-hours and dollars
    Resource("rent", "rent", "USD/s", "USD/h", 1 / 3600, "per device", "what renting one device costs"),
    Resource("idle_power", "idle draw", "W", "W", 1.0, PER_DEVICE,
             "a device's draw while idle (pipeline bubble, fixed overhead)"),
    Resource("memory_power", "memory-bound draw", "W", "W", 1.0, PER_DEVICE,
             "a device's draw while memory-bound kernels and the optimizer step run"),
    Resource("network_power", "communication draw", "W", "W", 1.0, PER_DEVICE,
             "a device's draw while exposed communication runs"),
    Resource("node_power", "node overhead power", "W", "W", 1.0, "per node",
             "a node's draw besides its devices: CPUs, NICs, switches inside it, fans"),
    Resource("switch_power", "switch power share", "W", "W", 1.0, PER_DEVICE,
             "a device's share of the network switches outside the nodes"),
    Resource("pue", "power usage effectiveness", "1", "", 1.0, "of the data centre",
             "facility energy / IT energy (cooling, power conversion)"),
    Resource("energy_price", "energy price", "USD/J", "USD/kWh", 1 / 3.6e6, "", "what a kilowatt-hour costs"),
    Resource("lifetime", "device lifetime", "s", "years", 365.25 * 86400, "",
             "the years a device's purchase price is spread over"),
    Resource("cost_basis", "cost basis", "", "", 1.0, "", "rent (pay per device-hour) or own (buy and pay energy)"),
    Resource("mtbf", "MTBF per device", "s", "h", 3600.0, PER_DEVICE,
             "mean time between failures of one device, its share of node, network and software failures included"),
    Resource("restart_time", "restart time", "s", "min", 60.0, "per failure",
             "from a failure to training again (detect, reschedule, re-initialise), re-loading aside"),
    Resource("checkpoint_interval", "checkpoint interval", "s", "min", 60.0, "",
             "productive time between checkpoints (default: Young's optimum)"),
    Resource("storage_bandwidth", "checkpoint storage bandwidth", "B/s", "MB/s", 1e6, PER_DEVICE,
             "what one device's share of a checkpoint is written and read back at"),
    Resource("host_bandwidth", "host copy bandwidth", "B/s", "GB/s", 1e9, PER_DEVICE,
             "device-to-host copy of an async checkpoint"),
    Resource("checkpoint_bytes", "checkpoint bytes per parameter", "B", "B", 1.0, "per parameter",
             "bytes a checkpoint holds per parameter (weights, master weights, optimizer moments)"),
    Resource("checkpoint", "checkpoint mode", "", "", 1.0, "",
             "sync (training waits for the write) or async (only for the copy to host memory)"),
    Resource("goodput", "goodput", "", "", 1.0, "", "on: failures, restarts and checkpoints counted; off: a perfect run"),
    Resource("unit_price.<resource>", "price per <resource>", "USD per SI unit", "USD per display unit", 1.0,
             PER_DEVICE, "what one more unit of the resource adds to a device's price"),
    Resource("unit_power.<resource>", "power per <resource>", "W per SI unit", "W per display unit", 1.0,
             PER_DEVICE, "what one more unit of the resource adds to a device's draw"),
)
_PATTERNS = {r.name: r for r in RESOURCES}


def resource(name: str) -> Resource:
    """The Resource of a ``--set`` name, its ``<dim>`` or ``<dtype>`` filled in (e.g.
    ``network.nvlink.bandwidth`` -> label 'network nvlink bandwidth'); KeyError for an unknown name."""
    if name in _PATTERNS:
        return _PATTERNS[name]
    head, _, rest = name.partition(".")
    if head in ("unit_price", "unit_power") and rest:
        base, money = resource(rest), "USD" if head == "unit_price" else "W"
        unit = f"{money}/{base.unit}" if "/" not in base.unit else f"{money}/({base.unit})"
        label = f"{'price' if money == 'USD' else 'power'} per {base.unit} of {base.label}"
        return Resource(name, label, f"{money}/{base.si_unit}", unit, 1 / base.scale, PER_DEVICE,
                        f"what one more {base.unit} of {base.label} adds to a device's "
                        f"{'price' if money == 'USD' else 'draw'}")
    if head == "peak_flops" and rest:
        pattern, fill, mark = "peak_flops.<dtype>", rest, "<dtype>"
    elif head == "network" and rest.count(".") == 1:
        dim, attr = rest.split(".")
        pattern, fill, mark = f"network.<dim>.{attr}", dim, "<dim>"
    else:
        raise KeyError(name)
    base = _PATTERNS[pattern]
    return Resource(name, base.label.replace(mark, fill), base.si_unit, base.unit, base.scale, base.per,
                    base.meaning, base.shown)


STRATEGY_LEGEND_TITLE = "Strategy codes"
NUMBER_MARK = "N"          # stands for the number after a degree's code: tpN, mbN


def legend_line(entries) -> str:
    """One line of (code, meaning) pairs, e.g. 'Strategy codes: tpN = tensor-parallel degree; sp = ...'."""
    return f"{STRATEGY_LEGEND_TITLE}: " + "; ".join(f"{code} = {meaning}" for code, meaning in entries)


@dataclass(frozen=True)
class Quantity:
    """A quantity of training on a token budget (whole_run/economics.py): its key (a JSON key and a result column,
    in SI units), label, SI unit, the unit it is shown in, and its meaning."""

    key: str
    label: str
    si_unit: str
    unit: str
    meaning: str


TRAINING = (
    Quantity("tokens", "token budget", "tokens", "tokens (k, M, G, T, P)", "tokens to train on"),
    Quantity("productive_time_s", "time in steps", "s", "days", "the token budget / tokens per second: every "
             "step trains"),
    Quantity("goodput", "goodput", "1", "%", "time in steps / time to train: what failures, restarts and "
             "checkpoints leave (whole_run/goodput.py)"),
    Quantity("time_to_train_s", "time to train", "s", "days", "time in steps / goodput"),
    Quantity("device_time_s", "device-hours", "s", "device-hours", "devices x time to train"),
    Quantity("average_power_w", "average power", "W", "kW or MW", "the cluster's average draw at the wall, "
             "PUE included: per device, the draw of each state times the step's fraction in it"),
    Quantity("energy_j", "energy", "J", "kWh or MWh", "the step's draw over the steps and the work redone, the "
             "idle draw over checkpoint stalls and restarts"),
    Quantity("training_cost_usd", "cost", "USD", "USD", "renting or owning, by the cluster's cost basis"),
    Quantity("training_cost_rent_usd", "cost, renting", "USD", "USD",
             "device-hours x the rent per device-hour (plus per-unit price changes over the lifetime)"),
    Quantity("training_cost_own_usd", "cost, owning", "USD", "USD",
             "devices x price x time to train / lifetime + energy x energy price"),
    Quantity("speedup_per_musd", "speed-up per added $1M", "1/USD", "per $1M",
             "(speedup - 1) per million USD the scaled resource adds to the cluster's price (whatif)"),
    Quantity("speedup_per_kw", "speed-up per added kW", "1/W", "per kW",
             "(speedup - 1) per kW the scaled resource adds to the cluster's draw while it is busy, PUE included (whatif)"),
)
TRAINING_QUANTITY = {q.key: q for q in TRAINING}


def training_label(key: str) -> str:
    """The label of a training quantity (the key itself for one the vocabulary does not know)."""
    return TRAINING_QUANTITY[key].label if key in TRAINING_QUANTITY else key


@dataclass(frozen=True)
class Front:
    """A Pareto front of a sweep's ranking (design_space/rank.py): time against one resource, both lower
    better. key: its key in the ranking (and JSON); column: the result column it ranks by without a token
    budget (None: no such front without one); budget_column: the column with a budget; label: what it is
    against, in text (the terminal's tables); plot_label, unit and scale: a figure's axis (the report's
    `pareto` figure), the value shown being the column / scale."""

    key: str
    column: str | None
    budget_column: str
    label: str
    plot_label: str
    unit: str
    scale: float

    def column_for(self, token_budget) -> str | None:
        """The column this front ranks by with a token budget (a true value) or without one."""
        return self.budget_column if token_budget else self.column

    @property
    def axis_label(self) -> str:
        """A figure's axis title, e.g. 'cluster price (USD M)'."""
        return f"{self.plot_label} ({self.unit})"


# Time is step time without a budget, time to train with one. pareto_cost is the cluster's purchase price at
# each design (per-unit prices follow the scaled resources); with a budget also what training costs and the
# energy it takes. In the order of the ranking's keys.
FRONTS = (
    Front("pareto_cost", "cost_usd", "cost_usd", "cluster price", "cluster price", "USD M", 1e6),
    Front("pareto_power", "power_w", "power_w", "rated power", "rated power", "kW", 1e3),
    Front("pareto_training_cost", None, "training_cost_usd", training_label("training_cost_usd"),
          "cost of training", "USD M", 1e6),
    Front("pareto_energy", None, "energy_j", training_label("energy_j"), "energy", "MWh", 3.6e9),
)
FRONT = {f.key: f for f in FRONTS}


# The error band of an estimate (answers/errorband.py; docs/validation.md, "Error band"): the range of the signed
# step-time errors, (predicted - measured) / measured, of the published runs on the same accelerator in the
# same precision; "not validated" where none backs it. Terminal text, JSON key and the explorer use these.
ERROR_BAND_LABEL = "Error band"
ERROR_BAND_KEY = "error_band"
ERROR_BAND_MEANING = ("signed step-time error (predicted - measured) / measured of the published runs on the same "
                      "accelerator in the same precision (16-bit or fp8); 'not validated' where none backs it")
