"""The machine: accelerator, memory hierarchy, network dimensions, cluster.

All fields are SI base units (bytes, bytes/s, FLOP/s, seconds). Efficiencies
are fractions of a datasheet peak that a public benchmark reaches; each
preset names its benchmark (docs/hardware.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from comet_dse.base.bounds import BOUNDS
from comet_dse.base.errors import InputError
from comet_dse.hardware.slices import Slices, layout as slice_layout
from comet_dse.hardware.efficiency import precision_class
from comet_dse.hardware.economics_block import Economics

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


class Topology(str, Enum):
    """How the devices of one network dimension are wired."""

    SWITCH = "switch"
    """Every device has links into a non-blocking switch (NVSwitch, a fat tree)."""
    RING = "ring"
    """Devices in a ring; a device's links alternate between its two neighbours."""
    TORUS = "torus"
    """One dimension of a torus: a ring with wrap-around, links in both directions."""
    MESH = "mesh"
    """One dimension of a mesh: a line without wrap-around (Dojo's 2D mesh)."""
    FULLY_CONNECTED = "fully_connected"
    """A direct link between every pair of devices (AMD Infinity Fabric, Gaudi)."""


@dataclass(frozen=True)
class MemoryTier:
    """One level of the memory hierarchy of a device.

    capacity: bytes per device; bandwidth: bytes/s per device (datasheet peak);
    efficiency: fraction of bandwidth a streaming kernel reaches (benchmark);
    latency: seconds per access (used for the expansion tier);
    holds_state: on-chip SRAM only: the tier holds model state and activations
    like HBM does (its capacity adds to HBM's, ``Accelerator.state_capacity``),
    as on SRAM-rich designs that keep weights on chip (Dojo, wafer-scale engines).
    compute: expansion tier only: FLOP/s the device reaches on operands that are
    read from the tier in place, the compute roof of a remote-memory roofline
    (the COMET authors' `remote-mem-roofline-peak-perf`; the host CPU's rate
    where the tier is host memory that computes on what it holds); None: no
    roof beyond the device's own. Used where the tier is costed as a roofline
    (``expansion_roofline``, cost/expansion.py: remote_compute_per_pass).
    row_reads: host memory only: the device's kernels read the tier's bytes in
    place, so an embedding row can be gathered from it (a GPU's unified memory
    over PCIe or NVLink-C2C, TorchRec's UVM tables); false where only whole
    buffers are copied by DMA (a TPU's host memory, XLA's host offload), which
    serves offloaded activations but no row lookups.
    """

    name: str
    capacity: float
    bandwidth: float
    efficiency: float = 1.0
    latency: float = 0.0
    holds_state: bool = False
    compute: float | None = None
    row_reads: bool = True

    @property
    def achievable_bandwidth(self) -> float:
        """bytes/s a streaming kernel reaches: bandwidth * efficiency."""
        return self.bandwidth * self.efficiency


@dataclass(frozen=True)
class Accelerator:
    """One device: compute per dtype and its memory tiers.

    peak_flops: dtype -> dense FLOP/s (datasheet).
    matmul_efficiency: fraction of peak the GEMM main loop sustains (a published
      microbenchmark; the shape-dependent losses on top of it are modelled in
      cost/kernels.py from compute_units, matmul_tile and matmul_pipeline_overhead).
      The 16-bit figure; matmul_efficiency_by_dtype: other dtypes' where measured.
    matmul_tile: (m, n, k) of the largest GEMM thread-block tile.
    matmul_pipeline_overhead: main-loop iterations' worth of non-overlapped
      prologue and epilogue per output tile.
    vector_flops: FLOP/s of the non-matrix units (for element-wise work).
    kernel_overhead: seconds of fixed cost per launched kernel.
    attention_efficiency: fused attention kernel -> (forward, backward) fraction
      of the 16-bit peak its long-sequence main loop sustains (published kernel
      benchmarks; cost/kernels.py: attention_rate). Empty: every kernel runs at
      matmul_efficiency.
    comm_units: compute units a collective-communication kernel occupies while it runs (NCCL: one thread
      block per channel, each on its own SM); compute that runs beside hidden communication gets the rest
      (cost/microbatch_pass.py: comm_share). 0: communication takes none (copy engines, or no figure).
    tensor_sustained: dtype -> the fraction of its benchmark rate (matmul_efficiency, attention_efficiency,
      short bursts) a device holds when its tensor units run for minutes at the power limit, as in training;
      1.0 where no public measurement separates the two (docs/hardware.md, "Sustained tensor rate").
      The physical reading.
    host: the host's memory as a tier of this device: its share of the node's DRAM (capacity per device) and the
      link a device reads it over (PCIe, NVLink-C2C; bandwidth per device per direction). Read by the
      recommendation kernel, which keeps embedding rows there that HBM and the expansion tier cannot hold
      (cost/recommendation.py: tiers); None: no host tier known for this device.
    training_efficiency: (precision class, kind) -> efficiency.Applied: the fraction of the benchmark rate
      measured on public training runs of that family, which replaces tensor_sustained for every tensor
      kernel of a step of that precision and kind of model (hardware/efficiency.py); {}: the physical reading.
    """

    name: str
    peak_flops: dict
    matmul_efficiency: float
    compute_units: int
    matmul_tile: tuple
    matmul_pipeline_overhead: float
    sram: MemoryTier
    hbm: MemoryTier
    expansion: MemoryTier | None = None
    host: MemoryTier | None = None
    vector_flops: float = 0.0
    kernel_overhead: float = 0.0
    attention_efficiency: dict = field(default_factory=dict)
    matmul_efficiency_by_dtype: dict = field(default_factory=dict)
    comm_units: int = 0
    tensor_sustained: dict = field(default_factory=dict)
    training_efficiency: dict = field(default_factory=dict)

    def sustained(self, dtype: str, kind: str | None = None) -> float:
        """The sustained fraction of the benchmark tensor rate for ``dtype``: with a ``kind`` of model ("dense"
        or "MoE") the training efficiency of that family where the cluster carries one, else the physical
        tensor_sustained (1.0 where the preset gives none)."""
        applied = self.training_efficiency.get((precision_class(dtype), kind)) if kind else None
        if applied is not None:
            return applied.value
        return self.physical_sustained(dtype)

    def physical_sustained(self, dtype: str) -> float:
        """tensor_sustained for ``dtype``: the burn-test fraction of the benchmark rate (1.0 where none)."""
        return self.tensor_sustained.get(dtype, self.tensor_sustained.get("bf16", 1.0))

    def matmul_efficiencies(self) -> dict:
        """dtype -> GEMM main-loop efficiency: the per-dtype figure where the preset gives one, else matmul_efficiency."""
        return {dtype: self.matmul_efficiency_by_dtype.get(dtype, self.matmul_efficiency) for dtype in self.peak_flops}

    @property
    def state_capacity(self) -> float:
        """Bytes per device that hold model state and activations: HBM, plus on-chip SRAM where it
        holds state (``sram.holds_state``). The SRAM still blocks GEMMs as a cache in kernel times."""
        return self.hbm.capacity + (self.sram.capacity if self.sram.holds_state else 0.0)

    @property
    def state_tiers(self) -> str:
        """What ``state_capacity`` is made of, for messages: 'HBM' or 'HBM and SRAM'."""
        return "HBM and SRAM" if self.sram.holds_state else "HBM"

    def flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype``; an error names the dtypes the device has."""
        if dtype not in self.peak_flops:
            raise InputError("dtype", f"{self.name} has no {dtype} rate; it has {', '.join(sorted(self.peak_flops))}")
        return self.peak_flops[dtype]


@dataclass(frozen=True)
class NetworkDim:
    """One dimension of the network, innermost first.

    size: devices along this dimension (None for the outermost: as many as needed).
    link_bandwidth: bytes/s per link per direction (datasheet).
    links_per_device: links a device has in this dimension.
    latency: seconds per message step (software + wire).
    efficiency: fraction of link bandwidth a collective library reaches (benchmark).
    """

    name: str
    size: int | None
    topology: Topology
    link_bandwidth: float
    links_per_device: int = 1
    latency: float = 0.0
    efficiency: float = 1.0

    @property
    def bandwidth(self) -> float:
        """bytes/s per device per direction (datasheet): link_bandwidth * links, the figure every output shows."""
        return self.link_bandwidth * self.links_per_device

    @property
    def device_bandwidth(self) -> float:
        """bytes/s one device can inject per direction: link_bandwidth * links * efficiency."""
        return self.link_bandwidth * self.links_per_device * self.efficiency


@dataclass(frozen=True)
class Cluster:
    """A cluster of identical devices connected by an ordered list of network dimensions."""

    name: str
    accelerator: Accelerator
    devices_per_node: int
    network: tuple
    max_devices: int | None = None
    device_price_usd: float | None = None
    device_power_w: float | None = None
    economics: Economics = field(default_factory=Economics)   # power, price beyond the two above (economics_block.py)
    source: str = ""
    description: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    step_overhead: float = 0.0         # seconds per step the framework adds (0 in presets; calibration may fit it)
    microbatch_overhead: float = 0.0   # seconds per micro-batch the framework adds (likewise)
    # Device memory a job cannot use for its tensors (docs/hardware.md, "Reserved memory"): a fixed part per
    # device [bytes] (what the driver keeps, the runtime context, the collective library's buffers) and the
    # allocator's fragmentation as a fraction of the rest of the footprint. 0 and 0 unless the cluster says.
    reserved_memory: float = 0.0
    fragmentation: float = 0.0
    # GEMM libraries' workspaces the framework allocates among its tensors [bytes per device] (cuBLAS through
    # PyTorch, Transformer Engine's): part of the reserve, but inside the allocator (torch max_allocated counts it)
    workspace_memory: float = 0.0
    calibration: dict | None = field(default=None, compare=False, hash=False)  # provenance (comet-dse calibrate)
    # The slice shapes a provider offers this torus machine in (hardware/slices.py; TPU pods); None: any count
    slices: Slices | None = None
    # The file's `training_efficiency:` setting (hardware/efficiency.py): "public-runs", "physical" or a path;
    # what it gives is in accelerator.training_efficiency.
    efficiency_setting: str = field(default="physical", compare=False, hash=False)

    def dim_sizes(self, devices: int) -> tuple:
        """Sizes of each network dimension when the cluster holds ``devices`` devices.

        Dimensions fill innermost first; the outermost unbounded one (size None)
        takes what is left. A scale-up domain of several nodes (the innermost dimension, larger than a node:
        GB200 NVL72's 18 trays of 4 GPUs) that the job cannot fill whole is used in equal parts of whole
        nodes, the largest that divides the job: 128 GPUs on NVL72 racks run as 2 x 64, as NVIDIA's GB200
        benchmarks do (16 of a rack's 18 compute trays). Raises InputError when ``devices`` cannot be laid out.
        """
        devices = BOUNDS["devices"].check_integer("devices", devices)
        if self.max_devices is not None and devices > self.max_devices:
            raise InputError("devices", f"{self.name} has at most {self.max_devices} devices, asked for {devices}")
        in_slices = self.slice_layout(devices)
        if in_slices is not None:
            return in_slices + (1,) * (len(self.network) - len(in_slices))
        sizes, left, inner = [], devices, 1
        for dim in self.network:
            cap = left if dim.size is None else dim.size
            used = min(cap, left)
            if left % used and inner == 1 and self.devices_per_node < used:
                used = self._partial_domain(used, left)
            if left % used:
                part = cap - cap % self.devices_per_node - self.devices_per_node     # a domain less one node
                parts = (f", or equal parts of them in whole {self.devices_per_node}-device nodes (e.g. 2 x {part} "
                         f"= {2 * part})" if inner == 1 and 0 < part else "")
                raise InputError(
                    "devices", f"{devices} devices cannot fill {self.name}'s {dim.name} dimension of {cap}; "
                    f"use a multiple of {inner * used}{parts}")
            sizes.append(used)
            left //= used
            inner *= used
        if left != 1:
            total = devices // left
            raise InputError("devices", f"{self.name} holds at most {total} devices in its network, asked for {devices}")
        return tuple(sizes)

    def slice_caps(self) -> tuple:
        """(sizes of the bounded torus dimensions the slices are cut from, how many slices the outer network
        joins: None for any number, 1 where there is no outer network)."""
        caps = tuple(d.size for d in self.network if d.size is not None)
        return caps, (None if self.network[-1].size is None else 1)

    @property
    def rented_in_slices(self) -> bool:
        """Whether the slice shapes apply to this network: a study's `network` axis or an override may have
        replaced the torus they are cut from (other dimensions, other sizes), and then none of them does."""
        return self.slices is not None and bool(self.slices.shapes(self.slice_caps()[0]))

    def slice_layout(self, devices: int) -> tuple | None:
        """The sizes of each network dimension for ``devices`` devices in equal offered slices (hardware/slices.py:
        layout), or None: no slice shapes that apply, or ``devices`` is no whole number of equal slices."""
        if not self.rented_in_slices:
            return None
        caps, outer = self.slice_caps()
        return slice_layout(self.slices, caps, outer, devices)

    def orderable(self, devices: int) -> bool:
        """Whether ``devices`` can be rented as they are: any count dim_sizes lays out, and on a machine rented in
        slices, a whole number of equal offered slices (``plan`` offers no other count)."""
        try:
            self.dim_sizes(devices)
        except InputError:
            return False
        return not self.rented_in_slices or self.slice_layout(devices) is not None

    def _partial_domain(self, cap: int, devices: int) -> int:
        """The largest whole number of nodes' devices, at most ``cap``, that divides ``devices`` (``cap`` when
        none does, which dim_sizes then refuses)."""
        node = self.devices_per_node
        for used in range(cap - cap % node, 0, -node):
            if devices % used == 0:
                return used
        return cap
