"""Cluster specs from mappings (YAML presets or user files).

Plausibility bounds reject impossible magnitudes (e.g. 80 TB of HBM per chip, a peak of 1e-300 FLOP/s)
with a message naming the field. They are rows of the one table of bounds (bounds.BOUNDS, with the
reason for each): the top of each is set from the fastest or largest real part, about 10x beyond it,
so that what-if studies stay possible and no real device (a wafer-scale engine, a Dojo training tile)
is ever rejected; the bottom of each rate keeps step times finite. Study axes, ``--set`` and the
explorer's controls check the values they set against the same rows.
"""
from __future__ import annotations

import math
from pathlib import Path

from comet_dse.base.bounds import BOUNDS, shown
from comet_dse.base.errors import InputError
from comet_dse.base.fingerprint import fingerprint
from comet_dse.base.written import sha256_hex
from comet_dse.base.loading import Fields
from comet_dse.base.units import KIND_BANDWIDTH, KIND_BYTES, KIND_COUNT, KIND_FLOPS, KIND_TIME
from comet_dse.hardware.efficiency import PHYSICAL, efficiency_of
from comet_dse.hardware.economics_block import Economics, anchored, economics_from
from comet_dse.hardware.spec import DTYPES, Accelerator, Cluster, MemoryTier, NetworkDim, Topology
from comet_dse.hardware.slices import Slices, slices_from

MAX_TILE = BOUNDS["matmul_tile"].high     # the largest tile side a cluster file may give
# Which row of bounds.BOUNDS a tier's capacity is checked against.
TIER_CAPACITY = {"sram": "sram_capacity", "hbm": "hbm_capacity", "expansion": "expansion_capacity",
                 "host": "host_memory_capacity"}


def tier_from(fields: Fields, name: str, with_latency: bool = False, may_hold_state: bool = False) -> MemoryTier:
    """A memory tier ``name`` (sram, hbm, expansion or host: its capacity is checked against that row of
    bounds.BOUNDS, ``TIER_CAPACITY``); ``may_hold_state``: it takes `holds_state` (on-chip SRAM counted
    as capacity). The expansion tier also takes `compute`, the FLOP/s on operands read from it in place
    (MemoryTier.compute; absent: no roof beyond the device's own)."""
    tier = MemoryTier(
        name=name,
        capacity=fields.quantity("capacity", KIND_BYTES, bound=TIER_CAPACITY[name]),
        bandwidth=fields.quantity("bandwidth", KIND_BANDWIDTH, bound="memory_bandwidth"),
        efficiency=fields.fraction("efficiency", 1.0),
        latency=fields.quantity("latency", KIND_TIME, 0.0, bound="latency") if with_latency else 0.0,
        holds_state=fields.boolean("holds_state", False) if may_hold_state else False,
        compute=fields.quantity("compute", KIND_FLOPS, None, bound="peak_flops") if name == "expansion" else None,
        row_reads=fields.boolean("row_reads", True) if name == "host" else True,
    )
    fields.reject_unknown(("source",))
    return tier


def accelerator_from(fields: Fields) -> Accelerator:
    peaks = fields.sub("peak_flops")
    peak_flops = {}
    for dtype in DTYPES:
        if peaks.has(dtype):
            peak_flops[dtype] = peaks.quantity(dtype, KIND_FLOPS, bound="peak_flops")
    peaks.reject_unknown(("source",))
    if not peak_flops:
        raise InputError(peaks.prefix, f"needs at least one of {', '.join(DTYPES)}")
    memory = fields.sub("memory")
    expansion = tier_from(memory.sub("expansion"), "expansion", True) if memory.has("expansion") else None
    host = tier_from(memory.sub("host"), "host") if memory.has("host") else None
    tile = fields.raw("matmul_tile")
    if not (isinstance(tile, list) and len(tile) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= MAX_TILE for x in tile)):
        raise InputError(fields.name("matmul_tile"), f"must be three integers [m, n, k] in [1, {MAX_TILE}], "
                         f"got {tile if len(repr(tile)) < 80 else 'huge values'}")
    overhead = fields.raw("matmul_pipeline_overhead")
    cap = BOUNDS["matmul_pipeline_overhead"]
    if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or not cap.low <= overhead <= cap.high:
        raise InputError(fields.name("matmul_pipeline_overhead"),
                         f"must be a number of iterations in [{cap.low}, {cap.high}], got {overhead!r}")
    accelerator = Accelerator(
        name=fields.name_text("name"),
        peak_flops=peak_flops,
        matmul_efficiency=_matmul_efficiency(fields, peak_flops)[0],
        matmul_efficiency_by_dtype=_matmul_efficiency(fields, peak_flops)[1],
        compute_units=fields.integer("compute_units"),
        matmul_tile=tuple(tile),
        matmul_pipeline_overhead=float(overhead),
        sram=tier_from(memory.sub("sram"), "sram", may_hold_state=True),
        hbm=tier_from(memory.sub("hbm"), "hbm"),
        expansion=expansion,
        host=host,
        vector_flops=fields.quantity("vector_flops", KIND_FLOPS, bound="vector_flops"),
        kernel_overhead=fields.quantity("kernel_overhead", KIND_TIME, 0.0, bound="latency"),
        attention_efficiency=_attention_efficiency(fields),
        comm_units=_comm_units(fields),
        tensor_sustained=_tensor_sustained(fields, peak_flops),
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


def _comm_units(fields: Fields) -> int:
    """`comm_units: 16`: compute units a communication kernel holds, 0 (the default) to compute_units."""
    units = fields.integer("compute_units")
    return fields.integer("comm_units", 0, minimum=0, maximum=units)


def _tensor_sustained(fields: Fields, peak_flops: dict) -> dict:
    """`tensor_sustained: 0.9` (every dtype) or `{bf16: 0.9, fp8: 0.85}` -> {dtype: fraction}; {} when absent."""
    if not fields.has("tensor_sustained"):
        return {}
    if not isinstance(fields.raw("tensor_sustained"), dict):
        value = fields.fraction("tensor_sustained")
        return {dtype: value for dtype in peak_flops}
    per = fields.sub("tensor_sustained")
    out = {dtype: per.fraction(dtype) for dtype in DTYPES if per.has(dtype)}
    per.reject_unknown(("source",))
    missing = sorted(set(out) - set(peak_flops))
    if missing:
        raise InputError(per.name(missing[0]), f"has no peak_flops entry; the device has {', '.join(sorted(peak_flops))}")
    return out


def _attention_efficiency(fields: Fields) -> dict:
    """`attention_efficiency: {fa2: {forward: 0.35, backward: 0.33}, ...}` -> {kernel: (forward, backward)}."""
    from comet_dse.strategy.choices import AttentionKernel

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
    if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                             or not 1 <= size <= BOUNDS["devices"].high):
        raise InputError(fields.name("size"), f"must be {BOUNDS['devices'].integer_text()} or null "
                         f"(outermost only), got {shown(size)}")
    if size is None and not outermost:
        raise InputError(fields.name("size"), "only the outermost network dimension may be unbounded (null)")
    dim = NetworkDim(
        name=fields.name_text("name"),
        size=size,
        topology=fields.choice("topology", Topology),
        link_bandwidth=fields.quantity("link_bandwidth", KIND_BANDWIDTH, bound="link_bandwidth"),
        links_per_device=fields.integer("links_per_device", 1),
        latency=fields.quantity("latency", KIND_TIME, 0.0, bound="latency"),
        efficiency=fields.fraction("efficiency", 1.0),
    )
    fields.reject_unknown(("source",))
    return dim


def refuse_repeated_names(network: tuple, field: str) -> None:
    """An InputError naming ``field`` when two network dimensions share a name: a setting names a dimension
    (--set network.<dim>.bandwidth, a study axis, a per-unit price), and one name for two dimensions was
    accepted and scaled both."""
    seen = set()
    for i, dim in enumerate(network):
        if dim.name in seen:
            raise InputError(f"{field}[{i}].name", f"{dim.name!r} names an earlier dimension too; give each network "
                             "dimension its own name")
        seen.add(dim.name)


def cluster_from(data: dict, prefix: str = "cluster", folder: Path | None = None) -> Cluster:
    """Build a Cluster from a mapping shaped like presets/clusters/*.yaml; ``folder``: where its file is (a
    calibrated file's runs are looked up there)."""
    fields = Fields(data, prefix)
    dims_raw = fields.raw("network")
    if not isinstance(dims_raw, list) or not dims_raw:
        raise InputError(fields.name("network"), "must be a non-empty list of dimensions, innermost first")
    network = tuple(
        network_dim_from(Fields(d, f"{fields.name('network')}[{i}]"), i == len(dims_raw) - 1)
        for i, d in enumerate(dims_raw)
    )
    refuse_repeated_names(network, fields.name("network"))
    cluster = Cluster(
        name=fields.name_text("name"),
        accelerator=accelerator_from(fields.sub("accelerator")),
        devices_per_node=fields.integer("devices_per_node"),
        network=network,
        max_devices=fields.integer("max_devices", None, bound="devices"),
        device_price_usd=fields.quantity("device_price_usd", KIND_COUNT, None, bound="device_price_usd"),
        device_power_w=fields.quantity("device_power_w", KIND_COUNT, None, bound="device_power_w"),
        economics=economics_from(fields.sub("economics"), tuple(d.name for d in network))
        if fields.has("economics") else Economics(),
        source=fields.text("source", ""),
        description=fields.text("description", ""),
        step_overhead=fields.quantity("step_overhead", KIND_TIME, 0.0, bound="overhead"),
        microbatch_overhead=fields.quantity("microbatch_overhead", KIND_TIME, 0.0, bound="overhead"),
        reserved_memory=fields.quantity("reserved_memory", KIND_BYTES, 0.0, bound="reserved_memory"),
        fragmentation=fields.quantity("fragmentation", KIND_COUNT, 0.0, bound="fragmentation"),
        workspace_memory=fields.quantity("workspace_memory", KIND_BYTES, 0.0, bound="reserved_memory"),
        calibration=_calibration(fields, data, folder),
        slices=_slices(fields, network) if fields.has("slices") else None,
    )
    cluster = with_efficiency(cluster, fields.raw("training_efficiency", PHYSICAL), fields.name("training_efficiency"))
    fields.reject_unknown()
    return anchored(cluster)


def _slices(fields: Fields, network: tuple) -> Slices:
    """The file's ``slices:`` block (hardware/slices.py), cut from its bounded (torus) dimensions."""
    caps = tuple(d.size for d in network if d.size is not None)
    if not caps:
        raise InputError(fields.name("slices"), "slices are cut from bounded network dimensions; this network "
                         "has none")
    return slices_from(fields.raw("slices"), caps, fields.name("slices"))


def with_efficiency(cluster: Cluster, setting, where: str = "training_efficiency") -> Cluster:
    """``cluster`` at the training efficiency ``setting`` names (hardware/efficiency.py: "public-runs", the
    shipped one; "physical", the burn-test reading; or an efficiency file's path)."""
    import dataclasses as dc

    try:
        applied = efficiency_of(setting, cluster.accelerator.name)
    except InputError as exc:
        raise InputError(where if exc.field == "training_efficiency" else exc.field, exc.message) from None
    return dc.replace(cluster, accelerator=dc.replace(cluster.accelerator, training_efficiency=applied),
                      efficiency_setting=str(setting))


def physical_reading(cluster: Cluster) -> Cluster:
    """``cluster`` without a fitted training efficiency: every tensor rate at its physical tensor_sustained."""
    return with_efficiency(cluster, PHYSICAL)



# The error summaries a `calibration:` block may record (calibrate.calibrated_data).
CALIBRATION_ERRORS = ("error_before", "error_in_sample", "error_cross_validated", "error_held_out")


FINGERPRINT = "calibration.fingerprint"   # where a calibrated file keeps its seal (answers/calibrate.py)


def calibration_mismatch(data: dict, folder: Path | None) -> str | None:
    """Why a calibrated file's calibration no longer describes it, or None when it does.

    calibrate seals the file with ``calibration.fingerprint``, the sha256 of everything else in it
    (base/fingerprint.py): the fitted values, the resources they were fitted with, the base, the runs' sha256
    and the errors. Any edit breaks it. Where the file's folder is known, its runs file must still be there
    and still have the sha256 the fit recorded.
    """
    cal = data.get("calibration") or {}
    seal = cal.get("fingerprint")
    if seal is None:
        return "it carries no fingerprint (written before calibrate sealed its files, or edited)"
    if seal != fingerprint(data, (FINGERPRINT,)):
        return "the file was edited after its fit (its fingerprint differs)"
    if folder is not None:
        runs = folder / str(cal.get("runs_file"))
        if not runs.is_file():
            return f"its runs file {cal.get('runs_file')} is not beside it"
        if sha256_hex(runs) != cal.get("runs_sha256"):
            return f"its runs file {cal.get('runs_file')} changed since the fit (sha256)"
    return None


def _calibration(fields: Fields, data: dict | None = None, folder: Path | None = None):
    """The provenance block a calibrated cluster file carries (calibrate.calibrated_data writes it), kept as
    read once checked: the runs counted, the runs file named, each error summary two |errors| in the
    ``relative_error`` row of bounds.BOUNDS with the mean at most the max, ``fitted`` values finite numbers.
    It was never checked: a bad value was a traceback in the error band, or 'max -100 %'."""
    raw = fields.raw("calibration", None)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError(fields.name("calibration"), "must be a mapping (written by comet-dse calibrate)")
    cal = Fields(raw, fields.name("calibration"))
    cal.integer("runs")
    for key in ("base", "runs_file", "cross_validation"):
        if cal.has(key) and not isinstance(cal.raw(key), str):
            raise InputError(cal.name(key), f"must be text, got {shown(cal.raw(key))}")
    cal.text("runs_file")
    digest = cal.raw("runs_sha256", None)
    if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                   and all(c in "0123456789abcdef" for c in digest)):
        raise InputError(cal.name("runs_sha256"), f"must be 64 hexadecimal digits, got {shown(digest)}")
    for key in CALIBRATION_ERRORS:
        if cal.has(key):
            _error_summary(cal.sub(key))
    if cal.has("fitted"):
        fitted = cal.sub("fitted")
        for name in fitted.data:
            _fitted_value(fitted.sub(str(name)) if isinstance(name, str) else fitted.sub(name))
    seal = cal.raw("fingerprint", None)
    if seal is not None and not (isinstance(seal, str) and len(seal) == 64 and all(c in "0123456789abcdef" for c in seal)):
        raise InputError(cal.name("fingerprint"), f"must be 64 hexadecimal digits, got {shown(seal)}")
    left = cal.raw("left_at_preset", [])
    if not isinstance(left, list) or not all(isinstance(n, str) for n in left):
        raise InputError(cal.name("left_at_preset"), f"must be a list of parameter names, got {shown(left)}")
    cal.reject_unknown()
    mismatch = calibration_mismatch(data, folder) if data is not None else None
    return {**raw, "stale": mismatch} if mismatch else raw


def _error_summary(block: Fields) -> None:
    """One error summary of a calibration block: {mean_abs_error, max_abs_error}, each in the
    ``relative_error`` bounds, mean <= max."""
    mean = block.quantity("mean_abs_error", KIND_COUNT, bound="relative_error")
    worst = block.quantity("max_abs_error", KIND_COUNT, bound="relative_error")
    if mean > worst:
        raise InputError(block.name("mean_abs_error"), f"{mean:g} exceeds max_abs_error {worst:g}: a mean |error| "
                         "is at most the largest")
    block.reject_unknown()


def _fitted_value(entry: Fields) -> None:
    """One fitted parameter: its value and preset finite numbers, sigma a number or null, a unit."""
    for key in ("value", "preset"):
        value = entry.raw(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(entry.name(key), f"must be a finite number, got {shown(value)}")
    sigma = entry.raw("sigma", None)
    if sigma is not None and (isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not sigma >= 0):
        raise InputError(entry.name("sigma"), f"must be a number of at least 0 or null, got {shown(sigma)}")
    entry.text("unit", "")
    entry.reject_unknown()
