"""One training step of a recommendation model (DLRM, DLRM-DCNv2) on a batch of design points: the embedding
lookups and their sharding, the exchange of pooled embeddings, the dense MLPs and interaction, the dense
gradient all-reduce, memory per device over HBM and an expansion tier, and the validity rules
(docs/model.md, "Recommendation models").

Notation: N devices (every one data-parallel for the dense part, dp = N), B samples per step (the global batch),
b = B / N per device; table t has R_t rows of d elements of e_t bytes, looked up L_t times per sample. SI units.
Rows HBM cannot hold live in the expansion tier and the host memory, the coldest first, their lookups split
by a Zipf law of the model's access skew (``place_tables``, ``hot_share``). What is not costed yet, and said so
in docs/model.md: the de-duplication of repeated rows in backward (every lookup updates its row) and a cache
that moves rows between tiers during training (the placement is static). Pipelining a batch's exchanges behind the
previous batch's work (embedding_overlap) and sending them hierarchically (embedding_hierarchical) are knobs,
off by default.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from comet_dse.cost.collectives import (
    all_gather_time, all_reduce_time, all_to_all_time, outermost, reduce_scatter_time, spans,
)
from comet_dse.cost.distinct import once_per_distinct
from comet_dse.cost.kernels import elementwise_time, gemm_time, memory_pass_time, roofline
from comet_dse.cost.memory import reserved_bytes
from comet_dse.cost.shapes import device_of, network_dims
from comet_dse.cost.step import StepArrays
from comet_dse.hardware.spec import Cluster
from comet_dse.model.recommendation import Interaction, Recommendation, STATE_BYTES_PER_ROW
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import EmbeddingSharding

SECTOR = 32.0          # bytes: GPU global memory moves in 32-byte sectors (CUDA C++ Best Practices Guide,
                       # "Coalesced Access to Global Memory"); a random row costs its bytes rounded up to them
ACTIVATION_BYTES = 2.0  # pooled embeddings, their gradients and the dense activations: 16-bit (mixed precision)
INDEX_BYTES = 8.0       # one lookup's row index as the sparse input carries it (int64: TorchRec's KeyedJaggedTensor)
GRADIENT_BYTES = 4.0    # fp32 weight gradients (dense, and the rows' gradients before the fused update)
DENSE_BYTES = 4.0       # fp32 dense weights
RELU_PASSES = (2.0, 3.0)  # element-wise passes per MLP layer output: forward (bias + ReLU: read, write);
                          # backward (read the output and its gradient, write the input gradient)
DENSE_STATE_BYTES = 8.0   # dense optimizer state per parameter: Adam's two fp32 moments (the upper bound)
OPTIMIZER_PASS_BYTES = 16.0  # dense update per parameter: read weight and gradient, read and write the state
                             # (row-wise Adagrad's one accumulator or Adam's two, 4 B each, the upper one taken)
GATHER_EFFICIENCY = 0.82  # fraction of HBM peak an embedding kernel's random row gathers reach: "more than 82 % of
                          # theoretical HBM bandwidth" for both FBGEMM's and a Triton TBE forward on ~10 GB tables of
                          # 128-wide rows on H100 (meta-pytorch/torchrec PR #4688, "XL uniform D128 forward"); the fused
                          # backward is taken at the same rate (its figure at D128 is not public; fwd+bwd at D1024
                          # reaches 74-76 %). A streaming kernel reaches the preset's hbm efficiency (about 0.9).
SHARDINGS = tuple(EmbeddingSharding)

RULES = ("rec_degrees", "batch", "column_split", "dtype", "memory")
RULE_TEXT = {
    "rec_degrees": "a recommendation model runs its dense part data-parallel on every device: tp, pp, cp, ep "
                   "and interleave 1, dp the device count (each device takes global batch / devices samples; "
                   "micro_batch is not read)",
    "batch": "the devices do not divide the global batch",
    "column_split": "column-wise sharding needs the devices to divide the embedding dim",
    "dtype": "the device has no peak rate for this dtype",
    "memory": "does not fit in device memory",
}


def sector_bytes(nbytes):
    """Bytes a random access of ``nbytes`` moves: rounded up to whole 32-byte sectors [B]."""
    return np.ceil(np.asarray(nbytes, dtype=float) / SECTOR) * SECTOR


KEYS = ("lookup", "update", "send", "index", "table_bytes", "state_bytes", "dp_params", "send_mean", "index_mean",
        "pool", "tier_io")


def table_share(model: Recommendation, t, dim: float, rows: float, hit: float, samples: float = 1.0) -> np.ndarray:
    """One device's share of table ``t`` when it holds ``rows`` of its rows and ``dim`` of its columns, serves
    the fraction ``hit`` of its lookups and pools for the fraction ``samples`` of the samples (all of them
    unless the table is replicated: 1/N) (KEYS order; per global sample, or bytes held):
      lookup = hit L_t sector(dim e_t); update = hit L_t (2 sector(dim e_t) + 2 sector(state)) + samples dim x 4 B
      (the fused backward reads and writes each row and its optimizer state, and reads the pooled gradient);
      send = dim x 2 B (its pooled or partially pooled vector of each sample); index = hit L_t x 8 B;
      table_bytes = rows x dim e_t; state_bytes = rows x (per-row + dim x per-element optimizer state);
      tier_io = hit L_t (3 sector(dim e_t) + 2 sector(state)), what a row and its state move wherever they live
      (``lookup`` and ``update`` but the pooled gradient, which is in HBM)."""
    per_row, per_element = STATE_BYTES_PER_ROW[model.embedding_optimizer]
    row = dim * t.bytes_per_element
    state = per_row + per_element * dim
    lookups = hit * t.pooling
    return np.array([lookups * sector_bytes(row),
                     lookups * (2.0 * sector_bytes(row) + (2.0 * sector_bytes(state) if state else 0.0))
                     + samples * dim * GRADIENT_BYTES,
                     dim * ACTIVATION_BYTES, lookups * INDEX_BYTES, rows * row, rows * state, 0.0, 0.0, 0.0, 0.0,
                     lookups * (3.0 * sector_bytes(row) + (2.0 * sector_bytes(state) if state else 0.0))],
                    dtype=float)


def busiest(items: list, devices: int) -> np.ndarray:
    """Place ``items`` (table shares, KEYS arrays) on ``devices`` devices, largest lookup-and-update traffic first,
    each on the device with the least traffic so far (greedy longest-processing-time balancing, as TorchRec's
    and HugeCTR's planners balance by cost); the busiest device's sum, with the tables and optimizer state of the
    device that holds the most of them (memory is decided by that device, time by the busiest) and the mean
    send and index bytes over all devices (what a hierarchical exchange spreads over a node)."""
    load = [np.zeros(len(KEYS)) for _ in range(devices)]
    for item in sorted(items, key=lambda x: -(x[0] + x[1])):
        low = min(range(devices), key=lambda k: load[k][0] + load[k][1])
        load[low] = load[low] + item
    top = max(load, key=lambda x: x[0] + x[1]).copy()
    fullest = max(load, key=lambda x: x[4] + x[5])
    top[4], top[5] = fullest[4], fullest[5]
    top[7], top[8] = sum(x[2] for x in load) / devices, sum(x[3] for x in load) / devices
    return top


DP_TABLE_BYTES = 8e6   # B: a table whose weights and optimizer state fit in 8 MB is replicated by the planned
                       # sharding (NVIDIA's MLPerf DLRM-DCNv2 configs: DP_SHARDING_THRESHOLD=0.008 GB,
                       # training_results_v4.0 .../dlrm_dcnv2/implementations/merlin_hugectr/config_DGXH100_1x8x6912.sh)


def planned_items(model: Recommendation, devices: int) -> tuple:
    """The planned sharding's (items placed on one device each, replicated tables): tables of at most
    DP_TABLE_BYTES replicated (data-parallel); every other table whole on one device, except that a table with
    more lookup-and-update traffic than one device's even share of the rest is split by rows over
    k = min(N, ceil(its traffic / even share)) devices, each holding 1/k of its rows and serving 1/k of its
    lookups (the hottest tables split over several GPUs, as the submissions' planner does: sharding/planner.py)."""
    small, large = [], []
    for t in model.tables:
        whole = table_share(model, t, t.dim, t.rows, 1.0)
        (small if whole[4] + whole[5] <= DP_TABLE_BYTES else large).append((t, whole))
    even = sum(w[0] + w[1] for _, w in large) / devices if large else 0.0
    items = []
    for t, whole in large:
        k = min(devices, max(1, int(np.ceil((whole[0] + whole[1]) / even)))) if even > 0 else 1
        items += [table_share(model, t, t.dim, t.rows / k, 1.0 / k)] * k
    return items, [t for t, _ in small]


def replicated_share(model: Recommendation, tables, n: float) -> np.ndarray:
    """What ``tables`` replicated on every one of ``n`` devices cost a device: their lookups and updates for its
    own samples (1/n of each), no exchange, their elements' gradients all-reduced (``dp_params``)."""
    out = np.zeros(len(KEYS))
    for t in tables:
        local = table_share(model, t, t.dim, t.rows, 1.0 / n, 1.0 / n)
        local[2] = local[3] = 0.0
        local[6] = t.rows * t.dim
        out = out + local
    return out


def node_planned(model: Recommendation, devices: int, per_node: int) -> np.ndarray:
    """The table-row-wise share of the busiest device: the planned placement (``planned_items``) over the
    M = N / k nodes of k devices, the busiest node's tables split by rows over its k devices (1/k of their rows,
    lookups and indices each; every device pools all B samples of them, ``pool``, reduce-scattered inside the
    node; each then sends its B/k samples' pools across the network, ``send``), plus the replicated tables."""
    nodes = max(devices // per_node, 1)
    k = float(devices // nodes)
    items, small = planned_items(model, nodes)
    node = busiest(items, nodes) if items else np.zeros(len(KEYS))
    share = node / k
    share[9] = node[2]                      # partial pools of every sample, reduce-scattered inside the node
    share[2], share[7] = node[2] / k, node[7] / k
    share[6] = 0.0
    return share + replicated_share(model, small, float(devices))


@lru_cache(maxsize=64)
def sharded(model: Recommendation, devices: int, per_node: int = 0) -> dict:
    """Per sharding (EmbeddingSharding code) the busiest device's share (``table_share``'s KEYS, per global
    sample or bytes held; ``dp_params``: elements of the tables it holds replicated, whose gradients are
    all-reduced):
      table-wise: every table whole on one device (``busiest``)
      row-wise: 1/N of every table's rows and lookups
      column-wise: 1/N of every table's columns for every lookup (each device needs every index)
      data-parallel: every table, looked up for the device's own b = B/N samples, no exchange
      planned: ``planned_items`` placed by ``busiest``, plus every replicated table for its own samples
      table-row-wise: ``node_planned`` over nodes of ``per_node`` devices (0: all devices one node)"""
    n = float(devices)
    tables = model.tables
    out = {EmbeddingSharding.TABLE_WISE.code: busiest([table_share(model, t, t.dim, t.rows, 1.0) for t in tables],
                                                      devices)}
    rows = sum(table_share(model, t, t.dim, t.rows / n, 1.0 / n) for t in tables)
    rows[2] = sum(t.dim for t in tables) * ACTIVATION_BYTES          # a partial pool of every table per sample
    columns = sum(table_share(model, t, t.dim / n, t.rows, 1.0) for t in tables)
    for balanced in (rows, columns):                                  # every device alike
        balanced[7], balanced[8] = balanced[2], balanced[3]
    out[EmbeddingSharding.ROW_WISE.code] = rows
    out[EmbeddingSharding.COLUMN_WISE.code] = columns
    out[EmbeddingSharding.DATA_PARALLEL.code] = replicated_share(model, tables, n)
    items, small = planned_items(model, devices)
    plan = busiest(items, devices) if items else np.zeros(len(KEYS))
    out[EmbeddingSharding.PLANNED.code] = plan + replicated_share(model, small, n)
    out[EmbeddingSharding.TABLE_ROW_WISE.code] = node_planned(model, devices, per_node or devices)
    return {code: dict(zip(KEYS, values)) for code, values in out.items()}


def _per_point(st: StrategyArrays, table: dict, key: str):
    """``table[code][key]`` for each point's sharding."""
    return st.select(st.embedding_sharding, [table[s.code][key] for s in SHARDINGS])


def hierarchical_scale(st: StrategyArrays, group: list, n: float, busiest_bytes, mean_bytes):
    """How much of the busiest device's exchange crosses the outermost network dimension, as a share of it
    (collectives.all_to_all_time's ``outer_scale``): 1 for a flat exchange; hierarchical (embedding_hierarchical),
    a node first gathers what its k = N / n_outer devices send to each other node and sends it through all k of
    its interfaces, so each carries (S_busiest + (k - 1) S_mean) / k:
        scale = (1 + (k - 1) S_mean / S_busiest) / k"""
    flags = outermost(group)
    n_outer = np.select(flags, group, 1.0) if any(np.any(f) for f in flags) else np.ones_like(st.tp)
    k = n / n_outer
    ratio = np.where(busiest_bytes > 0, mean_bytes / np.maximum(busiest_bytes, 1e-30), 1.0)
    spread = (1.0 + (k - 1.0) * ratio) / k
    return np.where(st.embedding_hierarchical, spread, 1.0)


def mlp_passes(shapes: list, b, dev) -> tuple:
    """(forward, backward) seconds of MLP layers ``shapes`` [(inputs, outputs)] for ``b`` samples on one device,
    each split as (math, memory): forward the GEMM [b, in] x [in, out]; backward the input and weight gradients,
    two GEMMs of the same FLOPs; their bias and ReLU passes (RELU_PASSES)."""
    e = ACTIVATION_BYTES
    math_f = mem_f = math_b = mem_b = 0.0
    for n_in, n_out in shapes:
        fwd = gemm_time(1.0, b, n_out, n_in, e, dev)
        bwd = gemm_time(1.0, b, n_in, n_out, e, dev) + gemm_time(1.0, n_in, n_out, b, e, dev)
        relu_f = elementwise_time(b * n_out, RELU_PASSES[0] * e, 2.0, dev)
        relu_b = elementwise_time(b * n_out, RELU_PASSES[1] * e, 1.0, dev)
        math_f, mem_f = math_f + fwd.math, mem_f + fwd.memory + relu_f.total
        math_b, mem_b = math_b + bwd.math, mem_b + bwd.memory + relu_b.total
    return (math_f, mem_f), (math_b, mem_b)


def interaction_passes(model: Recommendation, b, dev) -> tuple:
    """(forward, backward) seconds of the interaction for ``b`` samples, each (math, memory): dot, the products
    of [F, d] x [d, F] per sample as one fused kernel at the matrix rate or the bandwidth of its bytes (backward
    twice); DCN-v2, per cross layer two GEMMs [b, n] x [n, r] and
    [b, r] x [r, n] with n = F d and an element-wise pass over [b, n] reading x0, x_l and the product and writing
    x_{l+1} (backward twice). Sources: Naumov et al. 2019 (arXiv:1906.00091) Sec. 2.2; Wang et al. 2021
    (arXiv:2008.13535) Sec. 3."""
    e = ACTIVATION_BYTES
    f, d = model.features, model.dim
    if model.interaction is Interaction.DOT:
        # F x F products of d-long vectors per sample: too small for the GEMM tiles; one fused kernel per pass
        # (HugeCTR's, FBGEMM's) at the matrix rate, or at the bandwidth that reads the F vectors and writes the
        # products, whichever bounds it
        rate = dev.peak * dev.matmul_eff * dev.sustained
        fwd = roofline(2.0 * b * f * f * d, rate, b * (f * d + f * f) * e, dev.hbm_bw, dev.overhead)
        return (fwd.math, fwd.memory), (2.0 * fwd.math, 2.0 * fwd.memory)
    n, r = f * d, model.cross_rank
    layer = gemm_time(1.0, b, r, n, e, dev) + gemm_time(1.0, b, n, r, e, dev)
    cross = elementwise_time(b * n, 4.0 * e, 3.0, dev).total
    k = float(model.cross_layers)
    return (k * layer.math, k * (layer.memory + cross)), (2.0 * k * layer.math, 2.0 * k * (layer.memory + cross))


def dense_per_distinct(model: Recommendation, cluster: Cluster, n: float, st: StrategyArrays) -> tuple:
    """``dense_passes`` for b = global batch / n samples per device, computed once per distinct (global batch,
    dtype), the only fields they depend on (cost/distinct.py: once_per_distinct; a search varies the shardings
    and switches far more)."""
    return once_per_distinct(st, [st.global_batch, st.dtype], lambda sub: dense_passes(
        model, sub.global_batch / n, device_of(cluster, sub, kind=model.kind)))


def dense_passes(model: Recommendation, b, dev) -> tuple:
    """(bottom MLP, whole dense part) each as ((forward math, memory), (backward math, memory)) [s]: the
    bottom MLP alone is what an exchange of pooled embeddings can run beside."""
    shapes = model.mlp_shapes()
    bottom = mlp_passes(shapes[:len(model.bottom_mlp)], b, dev)
    top = mlp_passes(shapes[len(model.bottom_mlp):], b, dev)
    mid = interaction_passes(model, b, dev)
    whole = tuple(tuple(x + y + z for x, y, z in zip(pb, pt, pm)) for pb, pt, pm in zip(bottom, top, mid))
    return bottom, whole


def dense_flops(model: Recommendation) -> float:
    """Model FLOPs of one sample's forward pass: 2 x in x out per MLP layer, the interaction (dot: 2 F^2 d;
    DCN-v2: 4 n r per cross layer). A training step is 3x the forward (backward: input and weight gradients)."""
    f, d = model.features, model.dim
    mlp = sum(2.0 * i * o for i, o in model.mlp_shapes())
    if model.interaction is Interaction.DOT:
        return mlp + 2.0 * f * f * d
    return mlp + model.cross_layers * 4.0 * f * d * model.cross_rank


def harmonic(n, s: float):
    """H(n, s) = sum over k = 1..n of k^-s, as the integral of (x + 1)^-s over [0, n]: n at s = 0, ln(1 + n) at
    s = 1, ((n + 1)^(1 - s) - 1) / (1 - s) otherwise (exact at s = 0; within a few per cent of the sum's share
    of lookups for the row counts of embedding tables)."""
    n = np.asarray(n, dtype=float)
    if abs(s - 1.0) < 1e-9:
        return np.log1p(n)
    return ((n + 1.0) ** (1.0 - s) - 1.0) / (1.0 - s)


def hot_share(model: Recommendation, resident):
    """The share of lookups the hottest fraction ``resident`` of every table's rows serves, under the Zipf law
    of exponent s = ``model.access_skew`` (the k-th most frequent of a table's R rows looked up in proportion to
    k^-s): h_t(c) = H(c R_t, s) / H(R_t, s) per table, averaged over the tables weighted by their lookup bytes
    (L_t sector(row)). s = 0: h = c, every row alike. A static placement that keeps the hottest rows in the
    fastest tier (TorchRec's UVM caching and HugeCTR's hybrid embedding keep hot rows in HBM) serves h(c)."""
    c = np.clip(np.asarray(resident, dtype=float), 0.0, 1.0)
    skew = model.access_skew
    if skew == 0.0:
        return c
    weights = np.array([t.pooling * float(sector_bytes(t.row_bytes)) for t in model.tables])
    weights = weights / weights.sum()
    return sum(w * harmonic(c * t.rows, skew) / harmonic(t.rows, skew) for w, t in zip(weights, model.tables))


def tiers(acc) -> list:
    """The tiers beyond HBM embedding rows may live in, fastest first: [(name, capacity B, bandwidth B/s)] of
    the expansion tier and the host memory where the device has them and reads rows from it in place
    (MemoryTier.row_reads; bandwidth: what a streaming kernel reaches, MemoryTier.achievable_bandwidth)."""
    out = [(name, tier.capacity, tier.achievable_bandwidth) for name, tier in
           (("expansion", acc.expansion), ("host", acc.host)) if tier is not None and tier.row_reads]
    return sorted(out, key=lambda x: -x[2])


@dataclass
class TablePlacement:
    """Where one device's bytes live: ``hbm`` [B], ``tier_bytes`` name -> bytes in the expansion tier and the
    host memory, ``fits``, and ``slowdown`` [s/B]: the extra seconds per byte of row traffic (tier_io) that
    the rows outside HBM cost, sum over tiers k of m_k (1 / bandwidth_k - 1 / HBM bandwidth), m_k the share
    of lookups its rows serve."""

    hbm: np.ndarray
    tier_bytes: dict
    fits: np.ndarray
    slowdown: np.ndarray


def place_tables(model: Recommendation, acc, tables, state, total, hbm_rate) -> TablePlacement:
    """Place one device's footprint: HBM first; what it cannot hold of the embedding tables and their optimizer
    state (a row and its state together, the coldest rows first) goes to the tiers beyond it, fastest first
    (``tiers``); dense weights, gradients, activations and the reserve stay in HBM. With a fraction c_0 of the
    rows in HBM and c_k cumulated through tier k, tier k's rows serve m_k = h(c_k) - h(c_{k-1}) of the lookups
    (``hot_share``). Fits when the tiers hold what HBM cannot. ``tables``, ``state``: the device's table and
    optimizer-state bytes; ``total``: its whole footprint [B]; ``hbm_rate``: the bytes/s rows are gathered at in
    HBM [B/s]."""
    movable = np.maximum(tables + state, 1.0)
    over = np.maximum(total - acc.state_capacity, 0.0)
    remaining = np.where(over <= movable, over, np.inf)          # more than the tables: cannot fit
    resident = np.clip(1.0 - over / movable, 0.0, 1.0)
    served = hot_share(model, resident)
    slowdown = np.zeros_like(np.asarray(total, dtype=float))
    moved = {"expansion": np.zeros_like(slowdown), "host": np.zeros_like(slowdown)}
    for name, capacity, bandwidth in tiers(acc):
        take = moved[name] = np.minimum(remaining, capacity)
        resident = np.clip(resident + moved[name] / movable, 0.0, 1.0)
        now = hot_share(model, resident)
        slowdown = slowdown + (now - served) * (1.0 / bandwidth - 1.0 / hbm_rate)
        served, remaining = now, remaining - take
    fits = remaining <= 0.0
    return TablePlacement(hbm=total - moved["expansion"] - moved["host"], tier_bytes=moved, fits=fits,
                          slowdown=slowdown)


READ = ("global_batch", "embedding_sharding", "embedding_overlap", "embedding_hierarchical", "dtype", "dp_overlap")


def evaluate(model: Recommendation, cluster: Cluster, devices: int, st: StrategyArrays) -> StepArrays:
    """``step_arrays`` of every point of ``st``, computed once per distinct combination of the knobs it reads
    (READ; cost/distinct.py: once_per_distinct): bit-identical, and a search or a what-if repeats few
    combinations many times."""
    return once_per_distinct(st, [getattr(st, name) for name in READ],
                             lambda sub: step_arrays(model, cluster, devices, sub))


def step_arrays(model: Recommendation, cluster: Cluster, devices: int, st: StrategyArrays) -> StepArrays:
    """Step time, breakdown and memory of every point of ``st`` for a recommendation model.

        lookups   = B x lookup(sharding) / (HBM peak x GATHER_EFFICIENCY)
        updates   = B x update(sharding) / (HBM peak x GATHER_EFFICIENCY)
        offload   = B x tier_io(sharding) x slowdown: the rows in the expansion tier and host memory at their
                    bandwidth (``place_tables``)
        inputs    = all-to-all of B x index (the row indices to the devices that hold their rows), exposed
        exchange  = forward: all-to-all of B x send (table- and column-wise), reduce-scatter of B x sum d x 2 B
                    (row-wise), none (data-parallel); backward the same volume back (an all-gather row-wise;
                    data-parallel: the tables' whole fp32 gradients all-reduced)
        dense     = dense_passes for b = B / N samples; its fp32 gradients all-reduced over the N devices,
                    hidden behind the embedding updates and the bottom MLP's backward when dp_overlap is on
        exposed exchange = each direction's exchange minus the bottom MLP's pass it runs beside; with
                    embedding_overlap the whole exchange minus the dense passes and embedding kernels
    The parts and their names: base/vocabulary.py (``embedding_communication`` for the exchange)."""
    acc = cluster.accelerator
    dev = device_of(cluster, st, kind=model.kind)
    n = float(devices)
    big_b = st.global_batch
    b = big_b / n
    per_node = int(cluster.dim_sizes(devices)[0]) if len(cluster.network) > 1 else devices
    table = sharded(model, devices, per_node)
    lookup, update, send, index = (_per_point(st, table, k) for k in ("lookup", "update", "send", "index"))
    send_mean, index_mean = _per_point(st, table, "send_mean"), _per_point(st, table, "index_mean")
    table_bytes, state_bytes = _per_point(st, table, "table_bytes"), _per_point(st, table, "state_bytes")

    dense = model.dense_params()
    bottom, whole = dense_per_distinct(model, cluster, n, st)
    (math_f, mem_f), (math_b, mem_b) = whole
    bottom_fwd, bottom_bwd = sum(bottom[0]), sum(bottom[1])

    # memory by part, before placement: the busiest device's tables and their state; fp32 dense weights,
    # gradients and optimizer state (data-parallel tables: their whole fp32 gradients too); the dense
    # activations of its b samples and the pooled vectors it sends (their gradients come back in place)
    data_parallel = st.uses(EmbeddingSharding.DATA_PARALLEL)
    memory = {
        "weights": table_bytes + dense * DENSE_BYTES,
        "gradients": (dense + _per_point(st, table, "dp_params")) * GRADIENT_BYTES,
        "optimizer": state_bytes + dense * DENSE_STATE_BYTES,
        "activations": b * activation_elements(model) * ACTIVATION_BYTES + big_b * send,
        "buffers": np.zeros_like(big_b),
    }
    footprint = memory["weights"] + memory["gradients"] + memory["optimizer"] + memory["activations"]
    memory["reserved"] = reserved_bytes(footprint, cluster.reserved_memory, cluster.fragmentation,
                                        cluster.workspace_memory)
    total = footprint + memory["reserved"]
    gather_bw = acc.hbm.bandwidth * GATHER_EFFICIENCY
    placed = place_tables(model, acc, table_bytes, state_bytes, total, gather_bw)

    hbm_lookup = big_b * lookup / gather_bw + dev.overhead
    hbm_update = big_b * update / gather_bw + dev.overhead
    tier_extra = big_b * _per_point(st, table, "tier_io") * placed.slowdown

    dims = network_dims(cluster, devices)
    group = spans(dims, 1.0, n)
    row_wise = st.uses(EmbeddingSharding.ROW_WISE)
    a2a = all_to_all_time(big_b * send, dims, group, hierarchical_scale(st, group, n, send, send_mean))
    # table-row-wise: partial pools reduce-scattered (forward) and all-gathered (backward) inside the node first
    pool = _per_point(st, table, "pool")
    node = spans(dims, 1.0, float(per_node))
    a2a = a2a + np.where(pool > 0, reduce_scatter_time(big_b * pool, dims, node), 0.0)
    pooled = big_b * sum(t.dim for t in model.tables) * ACTIVATION_BYTES
    exchange_f = np.where(row_wise, reduce_scatter_time(pooled, dims, group), np.where(data_parallel, 0.0, a2a))
    exchange_b = np.where(row_wise, all_gather_time(pooled, dims, group), np.where(data_parallel, 0.0, a2a))
    # the row indices reach their shards first (an all-to-all each device receives B x index bytes of): exposed
    inputs = np.where(data_parallel, 0.0, all_to_all_time(big_b * index, dims, group,
                                                          hierarchical_scale(st, group, n, index, index_mean)))
    alone = inputs + np.maximum(exchange_f - bottom_fwd, 0.0) + np.maximum(exchange_b - bottom_bwd, 0.0)
    # pipelined: the next batch's exchanges run beside this batch's dense passes and embedding kernels
    beside = math_f + mem_f + math_b + mem_b + hbm_lookup + hbm_update
    exposed_exchange = np.where(st.embedding_overlap,
                                np.maximum(inputs + exchange_f + exchange_b - beside, 0.0), alone)

    dense_reduce = all_reduce_time(dense * GRADIENT_BYTES, dims, group) if devices > 1 else 0.0
    window = hbm_update + bottom_bwd
    dense_exposed = np.where(st.dp_overlap, np.maximum(dense_reduce - window, 0.0), dense_reduce)
    dp_params = _per_point(st, table, "dp_params")
    table_reduce = np.where(dp_params > 0, all_reduce_time(dp_params * GRADIENT_BYTES, dims, group), 0.0) \
        if devices > 1 else np.zeros_like(big_b)
    optimizer = memory_pass_time(dense * OPTIMIZER_PASS_BYTES, dev).total

    breakdown = {
        "compute": math_f + math_b,
        "memory": mem_f + mem_b + hbm_lookup + hbm_update,
        "tp_communication": np.zeros_like(big_b), "cp_communication": np.zeros_like(big_b),
        "ep_communication": np.zeros_like(big_b),
        "embedding_communication": exposed_exchange,
        "pp_communication": np.zeros_like(big_b), "pipeline_bubble": np.zeros_like(big_b),
        "dp_communication": dense_exposed + table_reduce,
        "optimizer": optimizer + np.zeros_like(big_b),
        "offload": tier_extra + np.zeros_like(big_b),
        "overhead": cluster.step_overhead + cluster.microbatch_overhead + np.zeros_like(big_b),
    }
    step_time = sum(breakdown.values())
    flops = dense_flops(model) * 3.0 * big_b
    capacity = n * st.dtype_table(acc.peak_flops) * step_time
    return StepArrays(
        breakdown=breakdown,
        phases={"forward": math_f + mem_f + hbm_lookup, "backward": math_b + mem_b + hbm_update,
                "recompute": np.zeros_like(big_b)},
        memory=memory, memory_total=total, hbm_bytes=placed.hbm, expansion_bytes=placed.tier_bytes["expansion"],
        step_time=step_time, model_flops=flops, hardware_flops=flops, tokens_per_second=big_b / step_time,
        mfu=flops / capacity, hfu=flops / capacity, fits=placed.fits, microbatches=np.ones_like(big_b),
        stage_layers=np.zeros_like(big_b), last_stage_memory=total, host_bytes=placed.tier_bytes["host"],
    )


def activation_elements(model: Recommendation) -> float:
    """Elements per sample kept for backward by the dense part: each MLP layer's input and output, the F
    feature vectors and the interaction's output (with DCN-v2 each cross layer's input and its low-rank
    product)."""
    kept = sum(i + o for i, o in model.mlp_shapes()) + model.features * model.dim + model.interaction_width
    if model.interaction is Interaction.DCN:
        kept += model.cross_layers * (2 * model.features * model.dim + model.cross_rank)
    return float(kept)


def violations(model: Recommendation, cluster: Cluster, devices: int, st: StrategyArrays, step) -> list:
    """[(code, mask, reason(i) -> str)] for every rule of ``RULES``; mask is True where the point breaks it."""
    n = float(devices)
    degrees = (st.tp != 1) | (st.pp != 1) | (st.cp != 1) | (st.ep != 1) | (st.interleave != 1) | (st.dp != n)
    batch = np.mod(st.global_batch, n) != 0
    column = st.uses(EmbeddingSharding.COLUMN_WISE) & (np.mod(model.dim, n) != 0)
    dtype = ~np.isfinite(st.dtype_table(cluster.accelerator.peak_flops))
    memory = ~np.asarray(step.fits, dtype=bool)
    acc = cluster.accelerator
    beyond = " and ".join(f"{name} {cap / 2**30:,.1f} GiB" for name, cap, _ in tiers(acc))

    def memory_reason(i):
        return (f"needs {step.memory_total[i] / 2**30:,.1f} GiB per device (embedding tables "
                f"{step.memory['weights'][i] / 2**30:,.1f} GiB), the device holds {acc.state_capacity / 2**30:,.1f} "
                "GiB" + (f" plus, for tables and their optimizer state, {beyond}" if beyond else ""))

    return [
        ("rec_degrees", degrees, lambda i: f"{RULE_TEXT['rec_degrees']} (tp={st.tp[i]:g}, pp={st.pp[i]:g}, "
                                           f"cp={st.cp[i]:g}, ep={st.ep[i]:g}, dp={st.dp[i]:g})"),
        ("batch", batch, lambda i: f"{devices} devices do not divide the global batch {st.global_batch[i]:g}"),
        ("column_split", column, lambda i: f"column-wise sharding splits the embedding dim {model.dim} over "
                                           f"{devices} devices, which do not divide it"),
        ("dtype", dtype, lambda i: RULE_TEXT["dtype"]),
        ("memory", memory, memory_reason),
    ]
