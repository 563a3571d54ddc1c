"""Cluster specs from mappings (YAML presets or user files).

Plausibility bounds reject impossible magnitudes (e.g. 80 TB of HBM per chip)
with a message naming the field. Each is set from the fastest or largest real
part, about 10x beyond it, so that what-if studies stay possible and no real
device (a wafer-scale engine, a Dojo training tile) is ever rejected:
compute, on-chip SRAM and its bandwidth from Cerebras WSE-3 (125 PFLOP/s,
44 GB SRAM at 21 PB/s, Cerebras CS-3 product brief, 2024); a link from a Dojo
training tile's edge (9 TB/s, Chang et al., Hot Chips 34, 2022); power from a
Cerebras CS-3 system (23 kW).
"""
from __future__ import annotations

from comet_dse.errors import InputError
from comet_dse.hardware.spec import DTYPES, Accelerator, Cluster, MemoryTier, NetworkDim, Topology
from comet_dse.loading import Fields
from comet_dse.units import KIND_BANDWIDTH, KIND_BYTES, KIND_COUNT, KIND_FLOPS, KIND_TIME

TiB = 2.0**40
MAX_FLOPS = 1.25e18       # 1.25 EFLOP/s per device: 10x Cerebras WSE-3 (125 PFLOP/s)
MAX_SRAM = 512 * 2.0**30  # 512 GiB on chip: about 10x WSE-3's 44 GB
MAX_HBM = 4 * TiB         # 4 TiB per device: over 10x the largest HBM stack set (288 GB) or Dojo tile (160 GB)
MAX_EXPANSION = 256 * TiB
MAX_MEM_BW = 2.1e17       # 210 PB/s: 10x WSE-3's 21 PB/s on-chip memory bandwidth
MAX_LINK_BW = 9e13        # 90 TB/s per link: 10x a Dojo training tile's 9 TB/s edge
MAX_LATENCY = 1.0
MAX_TILE = 65536          # a GEMM tile side (real ones are 64 to 256)
MAX_PRICE_USD = 1e8       # per device
MAX_POWER_W = 2.3e5       # per device: 10x a Cerebras CS-3 (23 kW)


def tier_from(fields: Fields, name: str, max_capacity: float, with_latency: bool = False,
              may_hold_state: bool = False) -> MemoryTier:
    """A memory tier; ``may_hold_state``: it takes `holds_state` (on-chip SRAM counted as capacity)."""
    tier = MemoryTier(
        name=name,
        capacity=fields.quantity("capacity", KIND_BYTES, high=max_capacity),
        bandwidth=fields.quantity("bandwidth", KIND_BANDWIDTH, high=MAX_MEM_BW),
        efficiency=fields.fraction("efficiency", 1.0),
        latency=fields.quantity("latency", KIND_TIME, 0.0, high=MAX_LATENCY, allow_zero=True) if with_latency else 0.0,
        holds_state=fields.boolean("holds_state", False) if may_hold_state else False,
    )
    fields.reject_unknown(("source",))
    return tier


def accelerator_from(fields: Fields) -> Accelerator:
    peaks = fields.sub("peak_flops")
    peak_flops = {}
    for dtype in DTYPES:
        if peaks.has(dtype):
            peak_flops[dtype] = peaks.quantity(dtype, KIND_FLOPS, high=MAX_FLOPS)
    peaks.reject_unknown(("source",))
    if not peak_flops:
        raise InputError(peaks.prefix, f"needs at least one of {', '.join(DTYPES)}")
    memory = fields.sub("memory")
    expansion = tier_from(memory.sub("expansion"), "expansion", MAX_EXPANSION, True) if memory.has("expansion") else None
    tile = fields.raw("matmul_tile")
    if not (isinstance(tile, list) and len(tile) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= MAX_TILE for x in tile)):
        raise InputError(fields.name("matmul_tile"), f"must be three integers [m, n, k] in [1, {MAX_TILE}], "
                         f"got {tile if len(repr(tile)) < 80 else 'huge values'}")
    overhead = fields.raw("matmul_pipeline_overhead")
    if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or not 0 <= overhead <= 64:
        raise InputError(fields.name("matmul_pipeline_overhead"), f"must be a number of iterations in [0, 64], got {overhead!r}")
    accelerator = Accelerator(
        name=fields.text("name"),
        peak_flops=peak_flops,
        matmul_efficiency=_matmul_efficiency(fields, peak_flops)[0],
        matmul_efficiency_by_dtype=_matmul_efficiency(fields, peak_flops)[1],
        compute_units=fields.integer("compute_units"),
        matmul_tile=tuple(tile),
        matmul_pipeline_overhead=float(overhead),
        sram=tier_from(memory.sub("sram"), "sram", MAX_SRAM, may_hold_state=True),
        hbm=tier_from(memory.sub("hbm"), "hbm", MAX_HBM),
        expansion=expansion,
        vector_flops=fields.quantity("vector_flops", KIND_FLOPS, high=MAX_FLOPS),
        kernel_overhead=fields.quantity("kernel_overhead", KIND_TIME, 0.0, high=MAX_LATENCY, allow_zero=True),
        attention_efficiency=_attention_efficiency(fields),
    )
    memory.reject_unknown(("source",))
    fields.reject_unknown(("source",))
    return accelerator


def _matmul_efficiency(fields: Fields, peak_flops: dict) -> tuple:
    """`matmul_efficiency: 0.8` or `{bf16: 0.801, fp8: 0.779}` -> (16-bit figure, {dtype: figure})."""
    if not isinstance(fields.raw("matmul_efficiency"), dict):
        return fields.fraction("matmul_efficiency"), {}
    per = fields.sub("matmul_efficiency")
    out = {dtype: per.fraction(dtype) for dtype in DTYPES if per.has(dtype)}
    per.reject_unknown(("source",))
    sixteen = out.get("bf16", out.get("fp16"))
    if sixteen is None:
        raise InputError(per.prefix, "needs a bf16 or fp16 figure (the default for the other dtypes)")
    missing = sorted(set(out) - set(peak_flops))
    if missing:
        raise InputError(per.name(missing[0]), f"has no peak_flops entry; the device has {', '.join(sorted(peak_flops))}")
    return sixteen, out


def _attention_efficiency(fields: Fields) -> dict:
    """`attention_efficiency: {fa2: {forward: 0.35, backward: 0.33}, ...}` -> {kernel: (forward, backward)}."""
    from comet_dse.strategy import AttentionKernel

    if not fields.has("attention_efficiency"):
        return {}
    kernels = fields.sub("attention_efficiency")
    out = {}
    for kernel in AttentionKernel:
        if kernels.has(kernel.value):
            rates = kernels.sub(kernel.value)
            out[kernel.value] = (rates.fraction("forward"), rates.fraction("backward"))
            rates.reject_unknown(("source",))
    kernels.reject_unknown(("source",))
    return out


def network_dim_from(fields: Fields, outermost: bool) -> NetworkDim:
    size = fields.raw("size", None)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise InputError(fields.name("size"), f"must be a positive integer or null (outermost only), got {size!r}")
    if size is None and not outermost:
        raise InputError(fields.name("size"), "only the outermost network dimension may be unbounded (null)")
    dim = NetworkDim(
        name=fields.text("name"),
        size=size,
        topology=fields.choice("topology", Topology),
        link_bandwidth=fields.quantity("link_bandwidth", KIND_BANDWIDTH, high=MAX_LINK_BW),
        links_per_device=fields.integer("links_per_device", 1),
        latency=fields.quantity("latency", KIND_TIME, 0.0, high=MAX_LATENCY, allow_zero=True),
        efficiency=fields.fraction("efficiency", 1.0),
    )
    fields.reject_unknown(("source",))
    return dim


def cluster_from(data: dict, prefix: str = "cluster") -> Cluster:
    """Build a Cluster from a mapping shaped like presets/clusters/*.yaml."""
    fields = Fields(data, prefix)
    dims_raw = fields.raw("network")
    if not isinstance(dims_raw, list) or not dims_raw:
        raise InputError(fields.name("network"), "must be a non-empty list of dimensions, innermost first")
    network = tuple(
        network_dim_from(Fields(d, f"{fields.name('network')}[{i}]"), i == len(dims_raw) - 1)
        for i, d in enumerate(dims_raw)
    )
    cluster = Cluster(
        name=fields.text("name"),
        accelerator=accelerator_from(fields.sub("accelerator")),
        devices_per_node=fields.integer("devices_per_node"),
        network=network,
        max_devices=fields.integer("max_devices", None),
        device_price_usd=fields.quantity("device_price_usd", KIND_COUNT, None, high=MAX_PRICE_USD),
        device_power_w=fields.quantity("device_power_w", KIND_COUNT, None, high=MAX_POWER_W),
        source=fields.text("source", ""),
        description=fields.text("description", ""),
        step_overhead=fields.quantity("step_overhead", KIND_TIME, 0.0, high=MAX_OVERHEAD, allow_zero=True),
        microbatch_overhead=fields.quantity("microbatch_overhead", KIND_TIME, 0.0, high=MAX_OVERHEAD, allow_zero=True),
        calibration=_calibration(fields),
    )
    fields.reject_unknown()
    return cluster


MAX_OVERHEAD = 600.0      # seconds: a fixed per-step or per-micro-batch cost beyond ten minutes is a typo


def _calibration(fields: Fields):
    """The provenance block a calibrated cluster file carries (free-form mapping, kept as read)."""
    raw = fields.raw("calibration", None)
    if raw is not None and not isinstance(raw, dict):
        raise InputError(fields.name("calibration"), "must be a mapping (written by comet-dse calibrate)")
    return raw
