"""The COMET authors' simulator, re-costed: their workload on a comet-dse cluster, as their ASTRA-sim 1.0 fork costs it.

The COMET paper's runtimes came from a fork of ASTRA-sim 1.0 (github dkadiyala3/comet-astrasim) with an analytical
network backend and a roofline compute model. This module applies that simulator's rules, not comet-dse's cost
model, so that the findings can be read as the authors' tool would give them (the "simulator" readings of
docs/case-studies.md) and compared split by split with the rebuilt simulator's own runs
(data/validation/comet_astrasim.csv, tests/test_astrasim.py). What it takes from where:

- The workload, one row per operator (``block``): the authors' file
  inputs/workload/new_Transformer_HybridParallel_Fwd_In_Bckwd.txt, at MP m and T tokens per replica: Q, K, V
  [T x h] x [h x h/m]; the attention score [16384 x 192] x [192 x 1024] and softmax [16384 x 1024] x [1024 x 192]
  as the file writes them (they do not follow the split); the output projection [T x h/m] x [h/m x h]; the MLP
  [T x h] x [h x f/m] and [T x f/m] x [f/m x h]; Layernorm as the file writes it, a GEMM [2T x h] x [h x h], or
  element-wise as the rebuilt simulator's element-wise column costs it: 5 FLOP and 4 bytes per element of T x h
  (results.csv: at TPU v4 MP256, 262,144 tokens per replica, the element-wise total is 13,689 ms below the GEMM
  one, whose Layernorm phases take 13,818 ms; the 129 ms left are 6 phases of 4 x 262,144 x 24,576 bytes at
  1.2 TB/s, 21.5 ms each: T x h elements, not the 2T x h of the GEMM row). Forward, input-gradient and
  weight-gradient phases have the same shape (as the file). Communication: all-reduces of the T x h activation
  (2 bytes) after the output projection and the second MLP GEMM in forward, after Q and the second MLP GEMM in the
  input gradient, an all-gather from each rank of its T x h/m slice after the output projection's input gradient
  (the file's 50,331,648 bytes at its split, the same at every split of 4,096 devices and 4,194,304 tokens per
  step; the simulator gathers that much from every rank of the group), and a data-parallel
  all-reduce of every weight-gradient (2 bytes per weight). No optimizer step, no embedding (the file has none).
- Compute (the fork's roofline, its system files' ``enable-roofline``): every phase of every operator takes
  max(2 M K N / P, 2 (M K + K N + M N) / B), P the accelerator's datasheet peak (bf16), B its HBM bandwidth; no
  efficiency derating.
- Collectives (the system files: halving-doubling on every dimension, ``localBWAware``, 64 dataset splits, one
  active chunk per dimension; the analytical backend's HierarchicalTopology.cc): the MP group takes the innermost
  dimensions, a dimension split where the group ends inside it (ASTRA-sim's break_dimension), DP the rest. On
  dimension i of n_i devices an all-reduce moves 2 (n_i - 1)/n_i S_i, S_i = S / (n_1 ... n_{i-1}), at
  B_i = links x link bandwidth (a ring's links rounded down to even; a fully connected dimension's per peer),
  full datasheet bandwidth; each of its log2 n_i steps costs a send latency (a ring: the hops to the partner
  2^k positions away, shorter way round; a switch: 2 hops; fully connected: 1) per chunk. An all-gather's size is
  each rank's part (HalvingDoubling.cc: its result is n_i times its input) and it runs from the outermost
  dimension in (Sys::generate_collective reverses the dimensions for it): dimension i moves (n_i - 1) G_i, G_i the
  size times the dimensions already gathered. The 64 chunks stream through the dimensions one at a time per
  dimension, so a collective takes the busiest dimension's work and latency plus one chunk's work on each of the
  others (``collective``):
      t = max_i (W_i + L_i c) + sum_{j != busiest} W_j / c,   c = 64.
- Schedule (Workload::iterate_hybrid_parallel_Transformer_fwd_in_bckwd, ``FWD_IN_BCKWD``): forward, layer by
  layer, each activation all-reduce blocking; backward from the last layer: at a block's last layer (the file's
  checkpoint initiators) the block is re-run forward from its first layer (the checkpoint) up to, not including,
  that layer, with its blocking all-reduces; per layer the input gradient, then its collective issued without
  blocking, the weight gradient, whose data-parallel all-reduce joins one FIFO queue that overlaps what follows,
  and only then the wait for the input-gradient collective (Workload.cc, Input_Gradient then Weight_Gradient
  state: ``issue_input_grad_comm(..., Non_Blocking)``, the weight-gradient compute and
  ``issue_weight_grad_comm``, then ``is_input_grad_comm_finished_blocking``): that collective is exposed only by
  what it takes beyond the layer's weight-gradient compute. The iteration ends when compute and the FIFO are both
  done.

Checked against the rebuilt simulator on datasheet TPU v4 and DGX A100 (../shared/comet-astrasim): total, compute,
exposed data-parallel and exposed model-parallel communication of every split within 1.2 % (tests/test_astrasim.py;
docs/case-studies.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from comet_dse.hardware.spec import Cluster, Topology
from comet_dse.model.spec import Transformer

CHUNKS = 64                   # preferred-dataset-splits of the authors' system files
WORD = 2                      # data-type-size: fp16 operands, activations and gradients (bytes)
SCORE = (16384, 192, 1024)    # the file's Q1K1 GEMM (M, K, N); its softmax is (M, N, K)
CONCAT_GATHER = 50331648      # the file's all-gather after the output projection's input gradient (bytes) at
                              # its MP128 x DP32: 131,072 tokens x 24,576 / 128 x 2 B (``concat_gather``)
LAYERNORM_ELEMENTWISE = (5.0, 4.0)   # FLOP and bytes per element of an element-wise Layernorm
LAYERNORMS = ("gemm", "elementwise")


@dataclass(frozen=True)
class Operator:
    """One row of the workload: its GEMM (M, K, N) in every phase, or an element-wise op; its collectives."""

    name: str
    gemm: tuple | None           # (M, K, N); None: element-wise (``elements``)
    elements: float = 0.0        # element-wise: elements touched
    forward: str = ""            # "allreduce" after forward, or ""
    input_grad: str = ""         # "allreduce", "allgather" or "" after the input gradient
    weight_bytes: float = 0.0    # weight-gradient bytes all-reduced over DP


@dataclass(frozen=True)
class Iteration:
    """One iteration of the workload [s]: the total and where it goes, as the simulator reports them."""

    total: float
    compute: float               # every compute phase, recomputation included
    layernorm: float             # the Layernorm rows' share of compute
    exposed_dp: float            # data-parallel all-reduces left after compute ends
    exposed_mp: float            # model-parallel collectives (all blocking)


def block(model: Transformer, mp: int, tokens: float, layernorm: str = "gemm") -> tuple:
    """(the file's nine rows of one transformer block at MP ``mp`` with ``tokens`` per replica, the bytes of
    one activation all-reduce)."""
    if layernorm not in LAYERNORMS:
        raise ValueError(f"layernorm must be one of {LAYERNORMS}, got {layernorm!r}")
    h, f, t = model.hidden, model.mlp.ffn, tokens
    act = t * h * WORD
    m_s, k_s, n_s = SCORE
    norm = (Operator("Layernorm", (2 * t, h, h)) if layernorm == "gemm"
            else Operator("Layernorm", None, elements=t * h))
    return [
        Operator("Q", (t, h, h / mp), input_grad="allreduce", weight_bytes=h * h / mp * WORD),
        Operator("K", (t, h, h / mp), weight_bytes=h * h / mp * WORD),
        Operator("V", (t, h, h / mp), weight_bytes=h * h / mp * WORD),
        Operator("QK", (m_s, k_s, n_s)),
        Operator("Softmax", (m_s, n_s, k_s)),
        Operator("Concat", (t, h / mp, h), forward="allreduce", input_grad="allgather",
                 weight_bytes=h / mp * h * WORD),
        Operator("MLP1", (t, h, f / mp), weight_bytes=h * f / mp * WORD),
        Operator("MLP2", (t, f / mp, h), forward="allreduce", input_grad="allreduce", weight_bytes=f / mp * h * WORD),
        norm,
    ], act


def concat_gather(model: Transformer, mp: int, tokens: float) -> float:
    """Bytes each rank contributes to the all-gather after the output projection's input gradient: its slice
    of that gradient, T x h / m x 2 B at ``tokens`` T per replica and MP m. The authors' file writes
    50,331,648 (CONCAT_GATHER) at its MP128 x DP32 with 131,072 tokens per replica; T h / m is
    (tokens per step / DP) h / m = tokens per step x h / devices, the same for every split of 4,096 devices
    at 4,194,304 tokens per step, and it scales with tokens per step / devices beyond them (revision of
    2026-12-06: it was the file's constant at every size, docs/case-studies.md)."""
    return tokens * model.hidden / mp * WORD


def roofline(op: Operator, peak: float, bandwidth: float) -> float:
    """Seconds of one phase of ``op``: max(FLOP / peak, bytes / bandwidth)."""
    if op.gemm is None:
        flop, byte = LAYERNORM_ELEMENTWISE
        return max(flop * op.elements / peak, byte * op.elements / bandwidth)
    m, k, n = op.gemm
    return max(2.0 * m * k * n / peak, WORD * (m * k + k * n + m * n) / bandwidth)


@dataclass(frozen=True)
class Dim:
    """One logical dimension of a collective: n devices, B bytes/s per device, the send latency of each step."""

    n: int
    bandwidth: float
    step_latency: tuple          # seconds per send of each halving-doubling step


def _physical(cluster: Cluster, devices: int) -> list:
    """(size, topology, B, link latency) of each network dimension of a job of ``devices`` devices."""
    out = []
    for dim, size in zip(cluster.network, cluster.dim_sizes(devices)):
        links = dim.links_per_device
        if dim.topology in (Topology.RING, Topology.TORUS, Topology.MESH):
            links -= links % 2
        bandwidth = links * dim.link_bandwidth
        if dim.topology is Topology.FULLY_CONNECTED and size > 1:
            bandwidth = max(links // (size - 1), 1) * dim.link_bandwidth
        out.append((int(size), dim.topology, bandwidth, dim.latency))
    return out


def _hops(topology: Topology, distance: int, size: int) -> int:
    if topology in (Topology.RING, Topology.TORUS):
        return min(distance, size - distance)
    if topology is Topology.MESH:
        return distance
    return 2 if topology is Topology.SWITCH else 1


def _logical(part: int, stride: int, physical: tuple) -> Dim:
    """A logical dimension of ``part`` devices ``stride`` apart on one physical dimension."""
    size, topology, bandwidth, latency = physical
    steps = tuple(_hops(topology, stride * 2 ** k, size) * latency for k in range(math.ceil(math.log2(part))))
    return Dim(part, bandwidth, steps)


def groups(cluster: Cluster, devices: int, mp: int) -> tuple:
    """(MP dims, DP dims): the MP group on the innermost dimensions, a dimension split where it ends inside it."""
    mp_dims, dp_dims, left = [], [], mp
    for phys in _physical(cluster, devices):
        size = phys[0]
        if size == 1:
            continue
        if left >= size:
            mp_dims.append(_logical(size, 1, phys))
            left //= size
        elif left > 1:
            mp_dims.append(_logical(left, 1, phys))
            dp_dims.append(_logical(size // left, left, phys))
            left = 1
        else:
            dp_dims.append(_logical(size, 1, phys))
    if left != 1:
        raise ValueError(f"MP {mp} does not fill whole dimensions of {cluster.name} at {devices} devices")
    return mp_dims, dp_dims


def collective(size: float, dims: list, kind: str = "allreduce") -> float:
    """Seconds of a halving-doubling all-reduce of ``size`` bytes, or all-gather of ``size`` bytes from each
    rank, over ``dims``, split into CHUNKS chunks that stream through the dimensions one at a time per dimension.

    All-reduce (reduce-scatter up the dimensions, all-gather back): dimension i moves 2 (n_i - 1)/n_i S_i,
    S_i = size / (n_1 ... n_{i-1}). All-gather (Sys::generate_collective reverses the dimension order for it; the
    fork's HalvingDoubling.cc makes each phase's result n_i times its input): from the outermost dimension in,
    dimension i moves (n_i - 1) G_i, G_i = size x the sizes of the dimensions already gathered. Each dimension
    takes its work plus the send latency of each of its steps per chunk; the busiest dimension sets the pace and
    each other one adds one chunk's work (the pipeline's fill):
        t = max_i (W_i + L_i c) + sum_{j != busiest} W_j / c,   c = CHUNKS."""
    dims = [d for d in dims if d.n > 1]
    if not dims or size <= 0:
        return 0.0
    stages, part = [], float(size)
    if kind == "allreduce":
        for d in dims:
            work = 2.0 * (d.n - 1) / d.n * part / d.bandwidth
            stages.append((work + 2.0 * sum(d.step_latency) * CHUNKS, work))
            part /= d.n
    else:
        for d in reversed(dims):
            work = (d.n - 1) * part / d.bandwidth
            stages.append((work + sum(d.step_latency) * CHUNKS, work))
            part *= d.n
    busiest = max(range(len(stages)), key=lambda i: stages[i][0])
    return stages[busiest][0] + sum(w for i, (_, w) in enumerate(stages) if i != busiest) / CHUNKS


def iteration(model: Transformer, cluster: Cluster, devices: int, mp: int, global_batch: int,
              layernorm: str = "gemm", blocks: int = 2) -> Iteration:
    """One iteration of ``blocks`` blocks of the authors' workload at MP ``mp`` x DP devices/mp."""
    dp = devices // mp
    if mp * dp != devices:
        raise ValueError(f"MP {mp} does not divide {devices} devices")
    acc = cluster.accelerator
    peak = acc.peak_flops.get("bf16") or acc.peak_flops.get("fp16")
    bandwidth = acc.hbm.bandwidth
    tokens = global_batch * model.seq_len / dp
    rows, act = block(model, mp, tokens, layernorm)
    layers = rows * blocks
    mp_dims, dp_dims = groups(cluster, devices, mp)
    comm = {"allreduce": collective(act, mp_dims),
            "allgather": collective(concat_gather(model, mp, tokens), mp_dims, "allgather"),
            "": 0.0}
    times = [roofline(op, peak, bandwidth) for op in layers]
    clock = compute = norm = exposed_mp = 0.0
    queue = 0.0                                  # when the data-parallel FIFO is free

    def run(i: int, phase: str) -> None:
        nonlocal clock, compute, norm, exposed_mp
        clock += times[i]
        compute += times[i]
        norm += times[i] if layers[i].name == "Layernorm" else 0.0
        kind = getattr(layers[i], phase) if phase else ""
        wait = comm[kind] if mp > 1 else 0.0
        clock += wait
        exposed_mp += wait

    for i in range(len(layers)):
        run(i, "forward")
    per = len(rows)
    for i in reversed(range(len(layers))):
        if i % per == per - 1:                   # a checkpoint initiator: re-run its block forward up to it
            for j in range(i - per + 1, i):
                run(j, "forward")
        run(i, "")                               # the input gradient; its collective starts when it ends
        in_flight = comm[layers[i].input_grad] if mp > 1 else 0.0
        run(i, "")                               # the weight gradient, while that collective runs
        if dp > 1 and layers[i].weight_bytes:    # its all-reduce joins the FIFO before the wait below
            queue = max(queue, clock) + collective(layers[i].weight_bytes, dp_dims)
        wait = max(0.0, in_flight - times[i])    # the input-gradient collective left after the weight gradient
        clock += wait
        exposed_mp += wait
    exposed_dp = max(0.0, queue - clock)
    return Iteration(total=clock + exposed_dp, compute=compute, layernorm=norm, exposed_dp=exposed_dp,
                     exposed_mp=exposed_mp)
