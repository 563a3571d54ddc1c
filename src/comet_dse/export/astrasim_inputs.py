"""ASTRA-sim inputs for a comet-dse cluster: the 2.0 network, system, memory and communicator-group files, and
the 1.0 files of the COMET authors' fork (their workload, system and network formats).

ASTRA-sim 2.0 (github astra-sim/astra-sim at 518bd51, 2026-03-26; analytical backend
astra-sim/astra-network-analytical): the network file is YAML with one entry per dimension of more than
one NPU (NetworkParser.cpp refuses npus_count <= 1): topology Ring, Switch or FullyConnected,
npus_count, bandwidth in GB/s read as 2^30 bytes/s (NetworkFunction.cpp: bw_GBps_to_Bpns), latency in
ns. The system file is JSON (Sys::initialize_sys; examples/system/native_collectives): scheduling
policy, chunking, one collective implementation per dimension, peak-perf in TFLOP/s (10^12) and
local-mem-bw in GB/s (10^9) for its roofline mode. Communicator groups: JSON, group id (from 1) -> its
NPUs (Workload::initialize_comm_groups), named by each collective node's pg_name.

The 1.0 fork (dkadiyala3/comet-astrasim; formats as ../shared/comet-astrasim/inputs): the workload text
HYBRID_TRANSFORMER_FWD_IN_BCKWD (see ``workload_v1``), a key: value system file and a Hierarchical
network JSON (link bandwidth in GiB/s, latency in ns).
"""
from __future__ import annotations

from comet_dse.base import jsonout
from comet_dse.cost import astrasim
from comet_dse.hardware.spec import Cluster, Topology
from comet_dse.model.spec import Transformer

GIB = 2.0**30
TOPOLOGY_V2 = {Topology.SWITCH: "Switch", Topology.RING: "Ring", Topology.TORUS: "Ring", Topology.MESH: "Ring",
               Topology.FULLY_CONNECTED: "FullyConnected"}
COLLECTIVE_V2 = {"FullyConnected": "direct"}     # every other topology: "ring", as comet-dse's reduce-scatter


def used_dims(cluster: Cluster, devices: int) -> list:
    """(NetworkDim, size) of the dimensions a job of ``devices`` spans (size > 1), innermost first."""
    return [(d, n) for d, n in zip(cluster.network, cluster.dim_sizes(devices)) if n > 1]


# Links a message crosses between two NPUs of a dimension in ASTRA-sim's analytical backend, each costing the
# dimension's latency (compute_hops_count: a switch 2, src -> switch -> dest; fully connected 1; a ring the
# hops between them, 1 for neighbours). comet-dse's latency is per message step, so it is split over them.
HOPS_PER_STEP = {"Switch": 2, "Ring": 1, "FullyConnected": 1}


def network_v2(cluster: Cluster, devices: int) -> str:
    """ASTRA-sim 2.0 analytical network YAML: per dimension comet-dse's per-device bandwidth
    (links x link bandwidth x efficiency, NetworkDim.device_bandwidth) in GiB/s and its latency per message
    step in ns, per link crossed (``HOPS_PER_STEP``)."""
    dims = used_dims(cluster, devices) or [(cluster.network[0], 1)]
    names = [TOPOLOGY_V2[d.topology] for d, _ in dims]
    topo = ", ".join(names)
    count = ", ".join(str(n) for _, n in dims)
    bw = ", ".join(f"{d.device_bandwidth / GIB:.6f}" for d, _ in dims)
    lat = ", ".join(f"{d.latency * 1e9 / HOPS_PER_STEP[name]:.3f}" for (d, _), name in zip(dims, names))
    return (f"# {cluster.name}, {devices} NPUs (written by comet-dse export; docs/export.md)\n"
            f"topology: [ {topo} ]\nnpus_count: [ {count} ]\n"
            f"bandwidth: [ {bw} ]  # GB/s as ASTRA-sim reads it: 2^30 bytes/s\nlatency: [ {lat} ]  # ns\n")


def system_v2(cluster: Cluster, devices: int, dtype: str) -> str:
    """ASTRA-sim 2.0 system JSON: whole messages (one split, one chunk in flight), ring collectives (direct on
    fully connected dimensions), and the accelerator's peak for ``dtype`` and achievable HBM bandwidth for
    the roofline mode, which is off (the traces' durations are replayed)."""
    acc = cluster.accelerator
    names = [TOPOLOGY_V2[d.topology] for d, _ in used_dims(cluster, devices)] or ["Ring"]
    impl = [COLLECTIVE_V2.get(n, "ring") for n in names]
    config = {
        "scheduling-policy": "LIFO",
        "endpoint-delay": 0,
        "active-chunks-per-dimension": 1,
        "preferred-dataset-splits": 1,
        "all-reduce-implementation": impl,
        "all-gather-implementation": impl,
        "reduce-scatter-implementation": impl,
        "all-to-all-implementation": ["direct"] * len(impl),
        "collective-optimization": "baseline",
        "local-mem-bw": acc.hbm.achievable_bandwidth / 1e9,
        "peak-perf": acc.flops(dtype) / 1e12,
        "roofline-enabled": 0,
        "boost-mode": 0,
    }
    return jsonout.dumps(config, indent=4) + "\n"


REMOTE_MEMORY_V2 = jsonout.dumps({"memory-type": "NO_MEMORY_EXPANSION"}, indent=4) + "\n"


def comm_groups_v2(members: dict) -> str:
    """The communicator-group JSON: {"id": [ranks]}."""
    return jsonout.dumps({str(k): v for k, v in members.items()}, indent=1) + "\n"


# --- ASTRA-sim 1.0, the COMET authors' fork ---------------------------------------------------------------

UPDATE_TIME = 10          # the last column of every row of the authors' workload file
DIMENSION_TYPES = {1: ["Package"], 2: ["Package", "Pod"], 3: ["Package", "Node", "Pod"]}


def _phase(op: astrasim.Operator, peak: float, bandwidth: float) -> tuple:
    """(OPS, MEM_BYTES, CYCLES) of one phase of a row: 2 M K N and 2 (M K + K N + M N) (fp16), or the
    element-wise Layernorm's 5 and 4 per element; CYCLES the fork's roofline in its 1 ns cycles."""
    if op.gemm is None:
        flop, byte = astrasim.LAYERNORM_ELEMENTWISE
        ops, mem = flop * op.elements, byte * op.elements
    else:
        m, k, n = op.gemm
        ops, mem = 2.0 * m * k * n, astrasim.WORD * (m * k + k * n + m * n)
    return round(ops), round(mem), round(astrasim.roofline(op, peak, bandwidth) * 1e9)


def workload_v1(model: Transformer, cluster: Cluster, mp: int, dp: int, global_batch: int,
                layernorm: str = "gemm", blocks: int = 2) -> str:
    """The authors' HYBRID_TRANSFORMER_FWD_IN_BCKWD workload at MP ``mp`` x DP ``dp`` (comet_dse.cost.astrasim.block).

    Header: the type, the MP group, the checkpoints (each block's first row) and checkpoint initiators
    (each block's last row, last first); then the row count; per row: name, -1, then for forward, input
    gradient and weight gradient: OPS, MEM_BYTES, CYCLES, collective (NONE, ALLREDUCE, ALLGATHER) and its
    bytes; last the update time. The fork reads OPS and MEM_BYTES with enable-roofline; CYCLES holds the
    same roofline time for a run without it.
    """
    acc = cluster.accelerator
    peak = acc.peak_flops.get("bf16") or acc.peak_flops.get("fp16")
    bandwidth = acc.hbm.bandwidth
    tokens = global_batch * model.seq_len / dp
    rows, act = astrasim.block(model, mp, tokens, layernorm)
    per = len(rows)
    starts = " ".join(str(b * per) for b in range(blocks))
    ends = " ".join(str(b * per + per - 1) for b in reversed(range(blocks)))
    lines = [f"HYBRID_TRANSFORMER_FWD_IN_BCKWD\tmodel_parallel_NPU_group: {mp} checkpoints: {blocks} {starts} "
             f"checkpoint_initiates: {blocks} {ends}", str(per * blocks)]
    sizes = {"allreduce": act, "allgather": astrasim.concat_gather(model, mp, tokens), "": 0}
    for b in range(1, blocks + 1):
        for op in rows:
            ops, mem, cycles = _phase(op, peak, bandwidth)
            compute = [str(ops), str(mem), str(cycles)]
            cells = [_row_name(op.name, b), "-1"]
            for kind in (op.forward, op.input_grad):
                cells += compute + [kind.upper() or "NONE", str(round(sizes[kind]))]
            wg = ("ALLREDUCE", round(op.weight_bytes)) if op.weight_bytes else ("NONE", 0)
            cells += compute + [wg[0], str(wg[1]), str(UPDATE_TIME)]
            lines.append("\t".join(cells))
    return "\n".join(lines) + "\n"


def _row_name(name: str, block: int) -> str:
    """The file's row names: Q1, Q1K1, XW1+b11 (first MLP GEMM of block 1), XW2+b21, Layernorm1."""
    return {"QK": f"Q{block}K{block}", "MLP1": f"XW1+b1{block}", "MLP2": f"XW2+b2{block}"}.get(name, f"{name}{block}")


def system_v1(cluster: Cluster, dims: int) -> str:
    """The fork's system file with the authors' settings (LIFO, 64 splits, halving-doubling on every
    dimension, localBWAware) and the accelerator's datasheet roofline (bf16 peak in GFLOP/s, HBM in bytes/ns)."""
    acc = cluster.accelerator
    peak = acc.peak_flops.get("bf16") or acc.peak_flops.get("fp16")
    hd = "_".join(["halvingDoubling"] * dims)
    return "\n".join([
        "scheduling-policy: LIFO", "endpoint-delay: 1", "active-chunks-per-dimension: 1",
        f"preferred-dataset-splits: {astrasim.CHUNKS}", "boost-mode: 1", f"all-reduce-implementation: {hd}",
        f"all-gather-implementation: {hd}", f"reduce-scatter-implementation: {hd}",
        f"all-to-all-implementation: {'_'.join(['direct'] * dims)}", "collective-optimization: localBWAware",
        "intra-dimension-scheduling: FIFO", "inter-dimension-scheduling: ascending", "enable-roofline: true",
        f"roofline-bw-in-bytes-per-ns: {acc.hbm.bandwidth / 1e9:g}", "roofline-neg-y-intercept: 0.0",
        f"roofline-peak-perf-in-gigaflops: {peak / 1e9:g}", ""])


V1_TOPOLOGY = {Topology.SWITCH: "Switch", Topology.RING: "Ring", Topology.TORUS: "Ring", Topology.MESH: "Ring",
               Topology.FULLY_CONNECTED: "FullyConnected"}


def network_v1(cluster: Cluster, devices: int) -> str:
    """The fork's Hierarchical network JSON: per dimension its size, links, link latency [ns] and datasheet link
    bandwidth in GiB/s (as the authors' backend reads it; no efficiency)."""
    dims = used_dims(cluster, devices)
    n = len(dims)
    kinds = DIMENSION_TYPES.get(n, ["Package"] + ["Node"] * (n - 2) + ["Pod"])
    config = {
        "topology-name": "Hierarchical",
        "topologies-per-dim": [V1_TOPOLOGY[d.topology] for d, _ in dims],
        "dimension-type": kinds,
        "dimensions-count": n,
        "units-count": [size for _, size in dims],
        "links-count": [d.links_per_device for d, _ in dims],
        "link-latency": [round(d.latency * 1e9) for d, _ in dims],
        "link-bandwidth": [round(d.link_bandwidth / GIB, 6) for d, _ in dims],
        "nic-latency": [0] * n, "router-latency": [0] * n, "hbm-latency": [1] * n, "hbm-bandwidth": [1] * n,
        "hbm-scale": [0] * n,
    }
    return jsonout.dumps(config, indent=2) + "\n"
