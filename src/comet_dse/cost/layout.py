"""Everything of a training step that depends only on the parallel layout, computed once per distinct layout.

The layout is the knobs declared ``layout=True`` on Strategy
(``LAYOUT_KNOBS``): the parallel degrees and their placement, the pipeline
split, the dtype and gradient precision, the ZeRO stage and its sharding
switches. From them follow the spans of the parallel groups, which layers
each candidate pipeline stage holds, its parameters and model-state bytes,
and the data-parallel, ZeRO-3 and optimizer costs that do not depend on the
micro-batch schedule. cost/step.py combines these per point with the
micro-batch terms (cost/microbatch.py); a sweep has a few hundred distinct
layouts, so this work is done a few hundred times instead of once per point
(cost/distinct.py), with bit-identical results.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost import collectives as coll
from comet_dse.cost.compute import memory_pass_time
from comet_dse.cost.distinct import gathered, grouped
from comet_dse.cost.layer import FP32
from comet_dse.cost.memory import grad_bytes, model_state_bytes
from comet_dse.cost.microbatch import context_of
from comet_dse.cost.params import (
    StageParams, embedding_slots, stage_candidates, stage_layer_counts, stage_mixes, stage_params,
)
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.declared import LAYOUT_KNOBS
from comet_dse.strategy.choices import Dtype, GradBuffer, GradPrecision, GradSync, Zero
from comet_dse.strategy.arrays import StrategyArrays

FP8_WEIGHT_COPY = 1.0   # bytes per parameter: the fp8 copy of the weights kept for the GEMMs (Transformer Engine)


def optimizer_step_bytes(dtype_is_fp16, sixteen_bit_grads=False):
    """Bytes moved per parameter the optimizer updates by a mixed-precision Adam step (Megatron-LM passes).

    Adam itself (fused): read fp32 weight, grad, m, v (16), write weight, m, v (12);
    grad-norm for clipping: read grad (4); copy fp32 weights to the 16-bit
    model (read 4, write 2).
    fp16 adds loss scaling: cast the fp16 grads to fp32 (read 2, write 4) and
    unscale with an inf/nan check (read 4, write 4).
    fp16: 28 + 4 + 6 + 6 + 8 = 52 bytes; bf16/fp8 (fp32 main grads): 28 + 4 + 6 = 38;
    bf16/fp8 with 16-bit gradients (grad_precision 16-bit): Adam and the norm
    touch 2-byte gradients: 38 - 2 x 2 = 34.
    Zeroing the gradient buffer is a separate pass over every gradient the
    device holds (``grad_zeroing_params``), not only the ones it updates.
    """
    return np.where(dtype_is_fp16, 52.0, np.where(sixteen_bit_grads, 34.0, 38.0))


def grad_zeroing_params(params: StageParams, st: StrategyArrays, shards: tuple):
    """Gradients per device the step zeroes before the next one: the whole local buffer below ZeRO 2, the shard
    from ZeRO 2 on [elements].

    Megatron-Core's distributed optimizer (ZeRO 1) reduce-scatters into a full-size gradient buffer and
    zeroes all of it every step (``DistributedDataParallel.zero_grad_buffer``: ``grad_data.zero_()``, one
    memset of g bytes per local parameter), although each rank updates only its shard; with ZeRO 2 and 3 the
    gradients kept are the shard. ``shards``: the DP and expert-DP shard counts (``_shard_size``).
    """
    grads_sharded = st.zero >= Zero.GRADIENTS
    return (params.shared / np.where(grads_sharded, shards[0], 1)
            + params.expert / np.where(grads_sharded, shards[1], 1))


GRAD_NORM_BYTES = FP32   # the squared gradient norm of one device's shard: one fp32 value


def step_scalar_reductions(st: StrategyArrays, ctx, is_fp16):
    """The step's scalar all-reduces before the optimizer may update [s] (latency-bound).

    Gradient clipping (Megatron-LM ``clip_grad_norm_fp32``): every device sums the squares of the gradients
    it holds (the read is in ``optimizer_step_bytes``) and all-reduces that one fp32 value over the devices
    holding different gradients: the TP and PP ranks, and with ZeRO >= 1 (each DP x CP rank holds a shard)
    the DP and CP ranks too. fp16 adds the loss scaler's found-inf check, one more scalar all-reduce over the
    same group (Megatron-LM ``MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan``):
        T = (1 + [fp16]) AR(4 B, tp x pp (x dp x cp with ZeRO >= 1))
    """
    spans = ctx.spans
    sharded = st.zero >= Zero.OPTIMIZER
    shard = [np.where(sharded, d * c, 1.0) for d, c in zip(spans["dp"], spans["cp"])]
    group = _joint(_joint(spans["tp"], spans["pp"]), shard)
    return np.where(is_fp16, 2.0, 1.0) * coll.all_reduce_time(GRAD_NORM_BYTES, ctx.dims, group)


def separate_accumulation_bytes(grad_el_bytes):
    """main_grad += grad per micro-batch: read main (g) + read grad (2) + write main (g) bytes/param."""
    return 2.0 * grad_el_bytes + 2.0


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


@dataclass(frozen=True)
class Layout:
    """The layout terms of a batch of points (arrays over the points; a scalar where equal for all).

    strides: the TP and DP device-number strides (StrategyArrays.strides), part
      of the micro-batch terms' de-duplication key;
    pp_spans: the pipeline group's span per network dimension;
    mixes: (dense layers, MoE layers, holds embedding, holds head) of each
      candidate stage (params.stage_mixes);
    stage_layers: transformer layers of the fullest stage;
    memory: per candidate stage, model-state bytes per device ("weights",
      "gradients", "optimizer") and its "n_dense" and "n_moe" layers;
    accumulate: one separate fp32 gradient accumulation pass [s];
    optimizer: the optimizer step [s];
    dp: the data-parallel collectives (DataParallelComm);
    weight_cast: fp8 training's cast of the stage's weights, once per step [s];
    amax: fp8_amax_reduction's blocking all-reduces of one micro-batch on one stage [s].
    """

    strides: dict
    pp_spans: list
    mixes: list
    stage_layers: object
    memory: list
    accumulate: object
    optimizer: object
    dp: DataParallelComm
    weight_cast: object = 0.0
    amax: object = 0.0


def layout_of(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays, context=None) -> Layout:
    """``layout_terms`` for every point of ``st``, computed once per distinct layout (cost/distinct.py).
    ``context``: StrategyArrays -> Context (default ``context_of``), to share one between callers."""
    at_groups, rows = layout_grouped(model, cluster, devices, st, context)
    return at_groups if rows is None else gathered(at_groups, rows[1])


def layout_grouped(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays, context=None) -> tuple:
    """(the Layout of one point per distinct layout, (first, inverse)), or (every point's Layout, None) where
    the batch is not grouped (cost/distinct.py: grouped)."""
    context = context or (lambda sub: context_of(model, cluster, devices, sub))
    columns = [getattr(st, name) for name in LAYOUT_KNOBS]
    return grouped(st, columns, lambda sub: layout_terms(model, st=sub, ctx=context(sub)))


def layout_terms(model: Transformer, st: StrategyArrays, ctx) -> Layout:
    """The Layout of the points of ``st`` (``ctx``: their Context, cost/microbatch.py: context_of);
    reads only the LAYOUT_KNOBS of ``st``."""
    slots = embedding_slots(st)
    mixes = stage_mixes(model, st.pp, slots)
    candidates = stage_candidates(model, st, mixes)     # their layer counts are the mixes' arrays: gathered once
    params = stage_params(candidates)
    is_fp16 = st.uses(Dtype.FP16)
    sixteen_grads = st.uses(GradPrecision.SIXTEEN_BIT)
    gbytes = grad_bytes(is_fp16 | sixteen_grads)
    accumulate = memory_pass_time(params.total * separate_accumulation_bytes(gbytes), ctx.dev).total
    sharded = st.zero >= Zero.OPTIMIZER
    shards = (_shard_size(st, ctx, "dp"), _shard_size(st, ctx, "edp"))
    opt_params = params.shared / np.where(sharded, shards[0], 1) + params.expert / np.where(sharded, shards[1], 1)
    optimizer = (memory_pass_time(opt_params * optimizer_step_bytes(is_fp16, sixteen_grads), ctx.dev).total
                 + memory_pass_time(grad_zeroing_params(params, st, shards) * gbytes, ctx.dev).total
                 + step_scalar_reductions(st, ctx, is_fp16))
    stage_layers = stage_layer_counts(model.layers, st.pp, slots)[2]
    is_fp8 = st.uses(Dtype.FP8)
    weight_cast = np.where(is_fp8, memory_pass_time(params.total * FP8_WEIGHT_CAST_BYTES, ctx.dev).total, 0.0)
    return Layout(
        strides={"tp": ctx.strides["tp"], "dp": ctx.strides["dp"]}, pp_spans=ctx.spans["pp"],
        mixes=mixes, stage_layers=stage_layers,
        memory=_state_bytes(model, st, candidates, gbytes, shards), accumulate=accumulate, optimizer=optimizer,
        dp=_data_parallel_comm(model, st, ctx, params, gbytes, np.maximum(stage_layers, 1.0)),
        weight_cast=weight_cast, amax=_amax_reduction(model, st, ctx, stage_layers, is_fp8),
    )


# fp8 training casts each 16-bit weight to fp8 and its transpose once per step, on the first micro-batch
# (Transformer Engine's is_first_microbatch weight cache, which Megatron-LM and NeMo pass): read 2, write
# 1 + 1 bytes per parameter (TE fp8_cast_transpose_fused).
FP8_WEIGHT_CAST_BYTES = 4.0
# Delayed-scaling metadata per fp8 GEMM (Transformer Engine FP8TensorMeta): forward keeps an amax for its
# input, weight and output, backward for the output gradient and the input gradient; fp32 each.
AMAX_FORWARD, AMAX_BACKWARD = 3, 2


def _amax_reduction(model: Transformer, st: StrategyArrays, ctx, stage_layers, is_fp8):
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
    group = _joint(_joint(ctx.spans["tp"], ctx.spans["dp"]), ctx.spans["cp"])
    t = (coll.all_reduce_time(FP32 * AMAX_FORWARD * per_chunk, ctx.dims, group)
         + coll.all_reduce_time(FP32 * AMAX_BACKWARD * per_chunk, ctx.dims, group))
    return np.where(st.fp8_amax_reduction & is_fp8, st.interleave * t, 0.0)


def _state_bytes(model: Transformer, st: StrategyArrays, candidates: list, gbytes, shards) -> list:
    """Per candidate stage: weights, gradients and optimizer bytes per device, and its dense and MoE layers.

    Shared weights are sharded by ZeRO over the dp shard, expert weights over
    dp/ep (cost/memory.py: model_state_bytes); fp8 training keeps an fp8 copy
    of the weights (FP8_WEIGHT_COPY bytes per parameter). ZeRO 3 holds the
    current and the prefetched layer gathered; without resharding after
    forward (SHARD_GRAD_OP) every layer stays gathered until its backward.
    For grad_buffer layer (cost/step.py: _memory picks them per point) also
    "grad_layer", the gradients of two layers in flight, g min(2 P_l, P), and
    "grad_shard", the DP shard several micro-batches accumulate in, g P / N
    (P_l: one transformer layer's parameters on the device, P the stage's); and for
    grad_sync step "grad_unsharded", g P, what ZeRO 3 then accumulates. Each only where some point
    uses it, as _memory reads them: every key is gathered back to every point.
    """
    is_fp8 = st.uses(Dtype.FP8)
    layered, unsharded = bool(np.any(st.uses(GradBuffer.LAYER))), bool(np.any(st.uses(GradSync.STEP)))
    layer = model.layer_params() / st.tp
    keep = st.reshard_after_forward
    out = []
    for params, n_dense, n_moe in candidates:
        shared = model_state_bytes(params.shared, shards[0], st.zero, gbytes,
                                   gathered=np.where(keep, 2.0 * layer, params.shared))
        expert = model_state_bytes(params.expert, shards[1], st.zero, gbytes,
                                   gathered=np.where(keep, 0.0, params.expert))
        states = {"weights": shared.weights + expert.weights + np.where(is_fp8, FP8_WEIGHT_COPY * params.total, 0.0),
                  "gradients": shared.gradients + expert.gradients, "optimizer": shared.optimizer + expert.optimizer,
                  "n_dense": n_dense, "n_moe": n_moe}
        if layered:
            states["grad_layer"] = gbytes * np.minimum(2.0 * layer, params.total)
            states["grad_shard"] = gbytes * (params.shared / shards[0] + params.expert / shards[1])
        if unsharded:
            states["grad_unsharded"] = gbytes * params.total
        out.append(states)
    return out


def _joint(a: list, b: list) -> list:
    """Spans of two orthogonal groups taken together (CP and DP reduce gradients jointly)."""
    return [x * y for x, y in zip(a, b)]


def _dp_groups(params: StageParams, spans: dict) -> tuple:
    """(parameters, group spans) whose gradients are reduced together: shared over DP x CP, experts over EDP x CP.
    A group with no parameters at any point (the experts of a dense model) is left out: it sends nothing."""
    groups = ((params.shared, _joint(spans["dp"], spans["cp"])), (params.expert, _joint(spans["edp"], spans["cp"])))
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


def _shard_size(st: StrategyArrays, ctx, group: str):
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


def _data_parallel_comm(model: Transformer, st: StrategyArrays, ctx, params: StageParams, gbytes, units):
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
