"""Step 6, the step's other terms: what the data-parallel group costs, and how much of it is exposed.

The collectives of one step (``data_parallel_comm``: gradient all-reduce or reduce-scatter, weight all-gather,
ZeRO 3's per-layer gathers and reduce-scatters, hybrid sharding's all-reduce across nodes, the tied embedding's
gradient sync, fp8 amax all-reduces), computed once per layout, and the part of them left exposed after
overlap with backward and forward (``exposed_data_parallel``). Sources: Rajbhandari et al. 2020 (ZeRO);
Zhao et al. 2023 (PyTorch FSDP); Narayanan et al. 2021; docs/model.md, "Data parallelism".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost import collectives as coll
from comet_dse.cost.pipeline import StageParams
from comet_dse.cost.shapes import FP32, joint_spans
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import GradBuffer, GradSync, Zero


@dataclass(frozen=True)
class DataParallelComm:
    """Data-parallel collectives of one step, before any overlap [s] (arrays over points, or 0.0).

    reduce: the gradient all-reduce (ZeRO 0) or reduce-scatter (ZeRO >= 1);
    gather: the all-gather of the updated 16-bit weights (ZeRO >= 1);
    across: hybrid sharding's all-reduce of the shard's gradients across nodes;
    emb_sync: the tied-embedding gradient all-reduce between first and last stage;
    unit_gather, unit_reduce: ZeRO 3's all-gather of one layer's 16-bit weights
    and reduce-scatter of its gradients; unit_across: with hybrid sharding, the
    all-reduce of that unit's gradient shard across nodes (each 0.0 when no
    point uses ZeRO 3, unit_across also when none uses hybrid sharding);
    layer_reduce, layer_allreduce: grad_buffer layer's reduce-scatter and all-reduce of
    one layer's gradients, and weights_gather the all-gather of the stage's updated 16-bit
    weights whatever the ZeRO stage (each 0.0 when no point reduces layer by layer).
    """

    reduce: object
    gather: object
    across: object
    emb_sync: object
    unit_gather: object
    unit_reduce: object
    unit_across: object
    layer_reduce: object = 0.0
    layer_allreduce: object = 0.0
    weights_gather: object = 0.0


# Delayed-scaling metadata per fp8 GEMM (Transformer Engine FP8TensorMeta): forward keeps an amax for its
# input, weight and output, backward for the output gradient and the input gradient; fp32 each.
AMAX_FORWARD, AMAX_BACKWARD = 3, 2


def amax_reduction(model: Transformer, st: StrategyArrays, ctx, stage_layers, is_fp8):
    """Seconds per micro-batch on one stage of fp8_amax_reduction's blocking all-reduces [s].

    Transformer Engine 1.x reduces the amaxes of all fp8 tensors of an fp8_autocast region at its exit
    (forward) and at the end of its backward, one all-reduce (MAX) each, over the amax reduction group
    (Megatron-Core: the TP x DP x CP ranks), synchronously unless NVTE_ASYNC_AMAX_REDUCTION=1. Megatron and
    NeMo wrap each model chunk's forward in its own region, so each micro-batch runs 2 v of them per stage:
        T = v (AR(4 x 3 G L_c) + AR(4 x 2 G L_c)),   L_c = layers of the stage / v
    G: fp8 GEMMs per layer (the attention projections and the MLP's two: TE LayerNormMLP fuses gate and up).
    They are latency-bound (a few KB on up to thousands of ranks).
    """
    if not np.any(st.fp8_amax_reduction & is_fp8):
        return 0.0
    gemms = len(model.attention.projections(model.hidden)) + 2
    per_chunk = gemms * np.maximum(stage_layers, 1.0) / st.interleave
    group = joint_spans(joint_spans(ctx.spans["tp"], ctx.spans["dp"]), ctx.spans["cp"])
    t = (coll.all_reduce_time(FP32 * AMAX_FORWARD * per_chunk, ctx.dims, group)
         + coll.all_reduce_time(FP32 * AMAX_BACKWARD * per_chunk, ctx.dims, group))
    return np.where(st.fp8_amax_reduction & is_fp8, st.interleave * t, 0.0)


def _dp_groups(params: StageParams, spans: dict) -> tuple:
    """(parameters, group spans) whose gradients are reduced together: shared over DP x CP, experts over EDP x CP.
    A group with no parameters at any point (the experts of a dense model) is left out: it sends nothing."""
    groups = ((params.shared, joint_spans(spans["dp"], spans["cp"])),
              (params.expert, joint_spans(spans["edp"], spans["cp"])))
    return tuple((count, group) for count, group in groups if np.any(count))


def _split_shard(st: StrategyArrays, group: list) -> tuple:
    """(shard spans, replica spans) of a DP group: all of it and nothing, or with hybrid_shard the innermost
    network dimension (inside a node) and the rest (across nodes)."""
    hybrid = st.hybrid_shard
    ones = np.ones_like(np.asarray(group[0], dtype=float))
    if not np.any(hybrid):
        return group, [ones] * len(group)
    shard = [group[0]] + [np.where(hybrid, ones, n) for n in group[1:]]
    replica = [ones] + [np.where(hybrid, n, ones) for n in group[1:]]
    return shard, replica


def shard_size(st: StrategyArrays, ctx, group: str):
    """Devices a ZeRO shard is split over: the group's ranks times the CP ranks (the group its gradients are
    reduce-scattered over, ``_dp_groups``), or with hybrid_shard the members of that group inside a node.

    Context-parallel ranks hold the same weights and reduce their gradients together with the DP ranks,
    so the distributed optimizer shards over DP x CP: Megatron-Core builds its DistributedDataParallel
    and distributed optimizer on the data-parallel group with context parallelism
    (parallel_state.get_data_parallel_group(with_context_parallel=True)), and torchtitan applies FSDP
    over the dp_shard x cp mesh. The shard a rank updates is what the reduce-scatter leaves it.
    """
    size = {"dp": st.dp, "edp": st.dp / st.ep}[group] * st.cp
    inner = ctx.spans[group][0] * ctx.spans["cp"][0]
    return np.where(st.hybrid_shard, np.minimum(inner, size), size)


def data_parallel_comm(model: Transformer, st: StrategyArrays, ctx, params: StageParams, gbytes, units):
    """The data-parallel collectives of one step (DataParallelComm), before overlap [s].

    Gradients of the shared (non-expert) weights are reduced over the DP and CP
    ranks together; expert gradients over the expert-data-parallel group
    (dp/ep ranks) and CP. ZeRO 0: all-reduce of the g P gradient bytes;
    ZeRO 1/2: reduce-scatter of them, then all-gather of the updated 16-bit
    weights (2 P bytes). With hybrid_shard the shard is the DP ranks inside a
    node, and its g P / N_shard gradient bytes are all-reduced across the
    node replicas once per step. Tied embeddings with p > 1 add an
    all-reduce (a send/recv between the two stages) of the V h / t embedding
    gradient. ZeRO 3's per-layer collectives (``units`` equal units per
    stage): t_ag = AG(2 P/u) of the 16-bit weights and t_rs = RS(g P/u) of the
    gradients, and with hybrid sharding t_ar = AR(g P/(u N_shard)) of the unit's
    gradient shard across the node replicas. Ring collectives on the spanned
    dimensions (cost/collectives.py); cost/step.py decides what of them is exposed.
    grad_buffer layer (``units`` equal layers): RS(g P/u) and AR(g P/u) of one layer's gradients and
    AG(2 P) of the updated weights, whatever the ZeRO stage.
    """
    dims, spans = ctx.dims, ctx.spans
    reduce = gather = across = unit_gather = unit_reduce = unit_across = 0.0
    sharded = st.zero >= Zero.OPTIMIZER
    hybrid, zero3 = np.any(st.hybrid_shard), np.any(st.zero >= Zero.PARAMETERS)
    layered = np.any(st.uses(GradBuffer.LAYER))
    layer_reduce = layer_allreduce = weights_gather = 0.0
    for count, group in _dp_groups(params, spans):
        grads, weights = count * gbytes, count * 2.0
        shard, replica = _split_shard(st, group)
        members = np.prod(np.array(np.broadcast_arrays(*shard)), axis=0) if hybrid else 1.0
        if hybrid:      # the shard's gradients are all-reduced across the node replicas once per step
            across = across + np.where(sharded, coll.all_reduce_time(grads / members, dims, replica), 0.0)
        reduce = reduce + np.where(sharded, coll.reduce_scatter_time(grads, dims, shard),
                                   coll.all_reduce_time(grads, dims, group))
        gather = gather + np.where(sharded, coll.all_gather_time(weights, dims, shard), 0.0)
        if zero3:       # the same collectives unit by unit
            unit_gather = unit_gather + coll.all_gather_time(weights / units, dims, shard)
            unit_reduce = unit_reduce + coll.reduce_scatter_time(grads / units, dims, shard)
            if hybrid:
                unit_across = unit_across + coll.all_reduce_time(grads / units / members, dims, replica)
        if layered:     # grad_buffer layer: one layer's gradients per collective, reduced over the whole group
            layer_reduce = layer_reduce + coll.reduce_scatter_time(grads / units, dims, group)
            layer_allreduce = layer_allreduce + coll.all_reduce_time(grads / units, dims, group)
            weights_gather = weights_gather + coll.all_gather_time(weights, dims, group)
    tied = model.tied_embeddings & (st.pp > 1)
    emb_bytes = model.vocab * model.hidden / st.tp * gbytes
    emb_sync = np.where(tied, coll.send_recv_time(emb_bytes, dims, spans["pp"]), 0.0)
    return DataParallelComm(reduce=reduce, gather=gather, across=across, emb_sync=emb_sync,
                            unit_gather=unit_gather, unit_reduce=unit_reduce, unit_across=unit_across,
                            layer_reduce=layer_reduce, layer_allreduce=layer_allreduce,
                            weights_gather=weights_gather)


def _prefetched(per_unit, window, units):
    """Exposed seconds of ``units`` equal collectives of ``per_unit`` seconds each, every one prefetched
    behind one unit's share of ``window`` seconds of compute (prefetch depth 1; the first, or last, has
    nothing to hide behind): per_unit + (u - 1) max(0, per_unit - window / u)."""
    return per_unit + (units - 1.0) * np.maximum(per_unit - window / units, 0.0)


def _prefetched_hidden(per_unit, window, units):
    """The seconds of ``_prefetched``'s collectives that ran beside compute: (u - 1) min(per_unit, window / u)."""
    return (units - 1.0) * np.minimum(per_unit, window / units)


def _sharded_layers(st: StrategyArrays, fwd, bwd, dp: DataParallelComm, units, reduce=True) -> tuple:
    """ZeRO 3 / FSDP, layer by layer: (exposed seconds per micro-batch, extra exposed seconds per step of
    hybrid sharding's all-reduces across nodes).

    The stage's parameters are sharded over the DP group in ``units`` equal
    units (one per layer, as FSDP wraps each transformer block and ZeRO 3
    fetches each module's parameters). Per unit and micro-batch: forward
    all-gathers its 16-bit weights, t_ag (DataParallelComm.unit_gather);
    backward gathers them again when they were freed after forward
    (reshard_after_forward: FSDP FULL_SHARD, ZeRO 3; SHARD_GRAD_OP keeps them)
    and reduce-scatters the gradients, t_rs (unit_reduce); gathers and
    reduce-scatters in one queue on the same links. Each unit's collectives
    are prefetched behind the previous unit's compute (``_prefetched``, B):
        forward  = B(t_ag, T_f) = t_ag + (u - 1) max(0, t_ag - T_f/u)
        backward = B(t_re + t_rs, T_b),   t_re = t_ag if resharded else 0
    With hybrid sharding (FSDP HYBRID_SHARD) each unit's gradient shard is
    also all-reduced across the node replicas (t_ar, unit_across) right
    after its reduce-scatter, in the same queue, once per step: in the last
    micro-batch's backward, which it lengthens by
        across = B(t_re + t_rs + t_ar, T_b) - B(t_re + t_rs, T_b)
    (it shares the backward window with the reduce-scatters instead of
    being hidden a second time behind all of it).
    T_f, T_b: the stage's forward and backward (+ recomputation, whose
    forward reuses the weights backward gathers) time per micro-batch,
    including exposed in-layer communication (it uses other links).
    The third value: the seconds of gathers and reduce-scatters that ran beside
    compute per micro-batch (``_prefetched_hidden``). ``reduce`` False: a
    micro-batch that reduce-scatters nothing (grad_sync step, all but the last).
    Sources: Rajbhandari et al. 2020 (ZeRO, Sec. 7); Zhao et al. 2023
    (PyTorch FSDP, arXiv:2304.11277, Sec. 3.2-3.3, 4.1); docs/model.md.
    """
    queue = np.where(st.reshard_after_forward, dp.unit_gather, 0.0) + (dp.unit_reduce if reduce else 0.0)
    backward = _prefetched(queue, bwd, units)
    across = _prefetched(queue + dp.unit_across, bwd, units) - backward if np.any(dp.unit_across) else 0.0
    hidden = _prefetched_hidden(dp.unit_gather, fwd, units) + _prefetched_hidden(queue, bwd, units)
    return _prefetched(dp.unit_gather, fwd, units) + backward, across, hidden


def exposed_data_parallel(st: StrategyArrays, fwd, bwd, dp: DataParallelComm, m, units, hidden_too=True):
    """Exposed data-parallel communication per step [s].

    The collectives (cost/data_parallel.py, DataParallelComm): the gradient reduction
    (all-reduce with ZeRO 0, reduce-scatter with ZeRO 1/2) and the all-gather
    of the updated weights. With overlap (bucketed, as PyTorch DDP and
    Megatron-LM --overlap-grad-reduce / --overlap-param-gather), the gradient
    reduction hides behind the backward work that follows the moment each
    chunk's gradients are final, and the weight all-gather behind the next
    step's forward work before each chunk's weights are needed:
        window_b = T_b/v ((v-1) p + 1),  window_f = T_f/v ((v-1) p + 1)
    (with v = 1 the last micro-batch's backward, resp. the first one's
    forward; with v virtual chunks the last micro-batch's backward visits
    chunk j about j p chunk-steps before the end of the cool-down, so chunk
    j's reduction has the rest of the cool-down to hide behind). Exposed:
    max(0, reduce - window_b) + max(0, gather - window_f); without overlap
    all of it. Hybrid sharding's all-reduce across nodes hides behind what is
    left of window_b after the reduction: max(0, across - max(0, window_b - reduce)).
    ZeRO 3 works layer by layer every micro-batch instead (``_sharded_layers``;
    with grad_sync step only the last micro-batch reduce-scatters: (m - 1) T_quiet + T_mb, T_quiet = 0 when
    the weights stay gathered after forward),
    and its hybrid all-reduces queue behind each unit's reduce-scatter. So does
    grad_buffer layer below ZeRO 3 (``_layer_by_layer``). The tied-embedding
    gradient sync is always exposed.
    Returns (exposed, hidden): hidden is the seconds of these collectives that
    ran beside compute (0 without overlap, or unless ``hidden_too``), which the
    step charges as compute slowed by the communication kernels
    (cost/microbatch_pass.py: contention).
    """
    chunk_steps = ((st.interleave - 1) * st.pp + 1) / st.interleave
    window = bwd * chunk_steps
    hidden = (np.maximum(dp.reduce - window, 0.0)
              + np.maximum(dp.gather - fwd * chunk_steps, 0.0))
    step_level = np.where(st.dp_overlap, hidden, dp.reduce + dp.gather)
    beside = 0.0
    hybrid = bool(np.any(dp.across) or np.any(dp.unit_across))    # both 0.0 without hybrid sharding (layout.py)
    if hidden_too:
        beside = np.minimum(dp.reduce, window) + np.minimum(dp.gather, fwd * chunk_steps)
        if hybrid:
            beside = beside + np.minimum(dp.across, np.maximum(window - dp.reduce, 0.0))
    zero3 = zero3_across = zero3_beside = 0.0
    if np.any(st.zero >= Zero.PARAMETERS):
        per_microbatch, zero3_across, zero3_hidden = _sharded_layers(st, fwd, bwd, dp, units)
        zero3 = m * per_microbatch
        zero3_beside = m * zero3_hidden
        if np.any(st.uses(GradSync.STEP)):     # one reduce-scatter per step, in the last micro-batch's backward
            quiet, _, quiet_hidden = _sharded_layers(st, fwd, bwd, dp, units, reduce=False)
            # weights kept gathered after forward stay gathered between micro-batches too (FSDP2 under PyTorch's
            # pipeline schedules: set_reshard_after_backward(False) until the last): one gather per step
            quiet = np.where(st.reshard_after_forward, quiet, 0.0)
            quiet_hidden = np.where(st.reshard_after_forward, quiet_hidden, 0.0)
            once = st.uses(GradSync.STEP)
            zero3 = np.where(once, (m - 1.0) * quiet + per_microbatch, zero3)
            zero3_beside = np.where(once, (m - 1.0) * quiet_hidden + zero3_hidden, zero3_beside)
    across_exposed = 0.0
    if hybrid:
        across_exposed = np.where(st.dp_overlap, np.where(st.zero >= Zero.PARAMETERS, zero3_across,
                                                          np.maximum(dp.across - np.maximum(window - dp.reduce, 0.0),
                                                                     0.0)), dp.across)
    if np.any(st.uses(GradBuffer.LAYER)):
        layered, layered_beside = _layer_by_layer(st, fwd, bwd, dp, m, units, chunk_steps)
        step_level = np.where(st.uses(GradBuffer.LAYER), layered, step_level)
        beside = np.where(st.uses(GradBuffer.LAYER), layered_beside, beside)
        across_exposed = np.where(st.uses(GradBuffer.LAYER) & (st.zero < Zero.PARAMETERS), 0.0, across_exposed)
    spread = st.dp * st.cp > 1
    exposed = np.where(spread, np.where(st.zero >= Zero.PARAMETERS, zero3, step_level) + across_exposed, 0.0)
    if hidden_too:
        beside = np.where(spread & st.dp_overlap, np.where(st.zero >= Zero.PARAMETERS, zero3_beside, beside), 0.0)
    return exposed + dp.emb_sync, beside


def _layer_by_layer(st: StrategyArrays, fwd, bwd, dp: DataParallelComm, m, units, chunk_steps):
    """Exposed data-parallel seconds per step of grad_buffer layer below ZeRO 3 (docs/model.md, "Gradient buffer").

    Each of the stage's ``units`` layers has its gradient reduced over DP as soon as backward has produced
    it: an all-reduce t_ar (DataParallelComm.layer_allreduce) when the step is one micro-batch (m = 1), as
    COMET's workload does; otherwise a reduce-scatter t_rs (layer_reduce) every micro-batch into the DP
    shard, and the updated 16-bit weights all-gathered after the step, t_ag (weights_gather; with ZeRO 1/2
    the all-gather they already do, DataParallelComm.gather). With dp_overlap each layer's collective is
    prefetched behind the next layer's backward (``_prefetched``, B) and the all-gather hides behind the
    next forward as the bucketed one does (``exposed_data_parallel``):
        exposed = m B(t, T_b) + max(0, t_ag - T_f c),   t = t_ar if m = 1 else t_rs
    (c: the chunk steps of the window); without it, m u t + t_ag. Hybrid sharding's all-reduce across
    nodes is not modelled here. Second value: the seconds of them that ran beside compute.
    """
    unit = np.where(m > 1, dp.layer_reduce, dp.layer_allreduce)
    gather = np.where(st.zero >= Zero.OPTIMIZER, dp.gather, np.where(m > 1, dp.weights_gather, 0.0))
    hidden = m * _prefetched(unit, bwd, units) + np.maximum(gather - fwd * chunk_steps, 0.0)
    beside = m * _prefetched_hidden(unit, bwd, units) + np.minimum(gather, fwd * chunk_steps)
    return np.where(st.dp_overlap, hidden, m * units * unit + gather), beside
