"""One training iteration, evaluated for many design points at once (numpy arrays).

This is the single copy of the step-time and memory math: ``estimate`` calls
it with a batch of one, sweeps with millions. Every term is explained in
docs/model.md; the schedule is Megatron-LM's 1F1B with optional
interleaving (Narayanan et al. 2021, Sec. 2.2):

    T_step = (m + (p-1)/v) * (t_stage + t_p2p) + T_dp,exposed + T_optimizer + T_offload + T_overhead

where t_stage is the slowest pipeline stage's forward + backward (+
recompute) time for one micro-batch, including its exposed TP, EP and CP
communication (cost/microbatch.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost import collectives as coll
from comet_dse.cost.distinct import gathered, paired_rows
from comet_dse.cost.layout import DataParallelComm, Layout, layout_grouped
from comet_dse.cost.memory import inflight_layer_microbatches, place, reserved_bytes, warm_up
from comet_dse.cost.params import embedding_slots
from comet_dse.cost.microbatch import (
    ACTIVATION_BYTES,
    BACKWARD_COMM,
    STAGE_KEYS,
    context_of,
    contention,
    deduplicated_grouped,
    network_dims,
    prefixed,
    work_total,
)
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.choices import (
    GradAccumulation, GradBuffer, GradSync, PipelineEngine, PipelineSplit, Recompute, Zero,
)
from comet_dse.strategy.arrays import StrategyArrays


@dataclass
class StepArrays:
    """Results for a batch of design points; every field is an array of the batch length."""

    breakdown: dict          # part -> seconds, parts add up to step_time
    phases: dict             # forward/backward/recompute seconds on the critical stage
    memory: dict             # part -> bytes per device (busiest stage)
    memory_total: np.ndarray
    hbm_bytes: np.ndarray
    expansion_bytes: np.ndarray
    step_time: np.ndarray
    model_flops: np.ndarray
    hardware_flops: np.ndarray
    tokens_per_second: np.ndarray
    mfu: np.ndarray            # model FLOPs / (devices x peak(dtype) x step time)
    hfu: np.ndarray            # the same with hardware FLOPs (recomputation included)
    fits: np.ndarray
    microbatches: np.ndarray
    stage_layers: np.ndarray
    last_stage_memory: np.ndarray   # bytes per device of the last pipeline rank, its reserve included


def _slowest_stage(mixes: list, dense: dict, moe: dict, emb: dict, head: dict) -> dict:
    """Per-micro-batch work of the slowest candidate stage (``mixes``: Layout.mixes, cost/params.py; the work
    dicts with their "total", cost/microbatch.py: prefixed).

    The candidate with the largest total is chosen per point (the first one on
    ties), then its work is assembled once.
    """
    t_dense, t_moe, t_emb, t_head = dense["total"], moe["total"], emb["total"], head["total"]
    finite_moe = bool(np.all(np.isfinite(t_moe)))      # 0 x t_moe is then 0, which adds nothing
    chosen, best = None, None
    for mix in mixes:
        n_dense, n_moe, with_emb, with_head = mix
        total = n_dense * t_dense
        if not (finite_moe and _zero(n_moe)):          # a dense model's candidates hold no MoE layer
            total = total + n_moe * t_moe
        total = total + with_emb * t_emb + with_head * t_head
        if chosen is None:
            chosen, best = [_over_points(x, np.shape(total)) for x in mix], total
        else:
            better = total > best
            chosen = [c if _same(x, c) else np.where(better, x, c) for x, c in zip(mix, chosen)]
            best = np.maximum(best, total)
    n_dense, n_moe, with_emb, with_head = chosen
    if moe is dense:                   # a dense model: one layer kind, one multiply per key
        n_dense, n_moe = n_dense if _zero(n_moe) else n_dense + n_moe, 0.0
    stage = {}
    for k in STAGE_KEYS:             # the embedding's and the head's terms where they are not zero everywhere
        stage[k] = n_dense * dense[k]
        if not _zero(emb[k]):
            stage[k] = stage[k] + with_emb * emb[k]
        if not _zero(head[k]):
            stage[k] = stage[k] + with_head * head[k]
    if moe is not dense:
        stage = {k: stage[k] + n_moe * moe[k] for k in STAGE_KEYS}
    return stage


def evaluate(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays) -> StepArrays:
    """Step time, breakdown and memory for every strategy in ``st`` (same model, cluster, devices).

    The layout terms (cost/layout.py) and the micro-batch terms
    (cost/microbatch.py) are computed once per distinct layout and
    micro-batch shape; this function combines them per point.
    """
    contexts = {}      # one Context per batch it is asked for: the whole batch when neither term groups

    def context(sub: StrategyArrays):
        if id(sub) not in contexts:
            contexts[id(sub)] = (sub, context_of(model, cluster, devices, sub))
        return contexts[id(sub)][1]

    lay_groups, lay_rows = layout_grouped(model, cluster, devices, st, context)
    lay = lay_groups if lay_rows is None else gathered(lay_groups, lay_rows[1])
    p, d, v, b = st.pp, st.dp, st.interleave, st.micro_batch
    s, h = model.seq_len, model.hidden
    e = ACTIVATION_BYTES
    m = st.global_batch / (d * b)
    terms_groups, terms_rows = deduplicated_grouped(model, cluster, devices, st, lay.strides, context)
    work = {k: terms_groups.pop(k) for k in list(terms_groups) if k.split(".")[-1] in STAGE_KEYS + ("total",)}
    terms = terms_groups if terms_rows is None else gathered(terms_groups, terms_rows[1])
    stage = _stage_work(model, lay, (lay_groups, lay_rows), (work, terms_rows))
    stage["bwd_mem"] = stage["bwd_mem"] + np.where(st.uses(GradAccumulation.FUSED), 0.0, lay.accumulate)

    fwd, bwd = _forward_total(stage), _backward_total(stage)

    whole = st.uses(PipelineEngine.DEEPSPEED)   # every TP rank sends the whole activation, nothing to gather
    # communication kernels beside compute slow it (cost/microbatch.py: contention); none where they take no units
    u = cluster.accelerator.comm_units / cluster.accelerator.compute_units
    p2p, p2p_hidden = _pipeline_p2p(st, network_dims(cluster, devices), lay.pp_spans, fwd, bwd,
                                    np.where(whole, 0.0, terms["regather"]),
                                    b * s / st.cp * h * e / np.where(whole, 1.0, st.tp), hidden_too=u > 0)
    if u > 0:        # send/recv beside the next chunk's compute
        stage["fwd_math"] = stage["fwd_math"] + contention(u, p2p_hidden[0])
        stage["bwd_math"] = stage["bwd_math"] + contention(u, p2p_hidden[1])

    stage_mb = work_total(stage)
    bubble = (p - 1) / v * (stage_mb + p2p)

    memory, act_per_mb, last_stage = _memory(model, st, terms, lay, m, cluster)
    acc = cluster.accelerator
    exp_cap = acc.expansion.capacity if acc.expansion else 0.0
    memory_total = _added(memory.values())
    placed = place(memory, acc.state_capacity, exp_cap, memory_total)

    flops = _flops(model, st)
    dp_fwd, dp_bwd = fwd, bwd
    roofline = None
    if acc.expansion is not None and np.any(st.expansion_roofline):
        # a pass that streams spilled data from the tier lasts max(its work, the stream, its work on spilled
        # operands at the tier's compute roof) (the roofline below), and the data-parallel reduction hides
        # behind that whole duration
        remote_f, remote_b = _remote_per_pass(acc, placed, memory, act_per_mb)
        if acc.expansion.compute is not None:
            capped_f, capped_b = _remote_compute_per_pass(acc.expansion.compute, placed, memory,
                                                          _stage_pass_flops(model, st, lay, m, flops))
            remote_f, remote_b = np.maximum(remote_f, capped_f), np.maximum(remote_b, capped_b)
        dp_fwd = np.where(st.expansion_roofline, np.maximum(fwd, remote_f), fwd)
        dp_bwd = np.where(st.expansion_roofline, np.maximum(bwd, remote_b), bwd)
        roofline = (st.expansion_roofline, fwd, bwd, remote_f, remote_b)
    dp_exposed, dp_hidden = _data_parallel(st, dp_fwd, dp_bwd, lay.dp, m, np.maximum(lay.stage_layers, 1.0),
                                           u > 0)
    # fp8 amax all-reduces: every micro-batch of every stage, on the critical path like the stage's work
    dp_exposed = dp_exposed + (m + (p - 1) / v) * lay.amax
    dp_slowdown = contention(u, dp_hidden)
    optimizer = lay.optimizer

    offload = _offload_time(acc, placed, memory, act_per_mb, m,
                            overlap=(st.expansion_overlap, fwd, bwd, optimizer, dp_exposed), roofline=roofline)

    breakdown = {
        "compute": m * (stage["fwd_math"] + stage["bwd_math"] + stage["rec_math"]) + dp_slowdown,
        "memory": m * (stage["fwd_mem"] + stage["bwd_mem"] + stage["rec_mem"]) + lay.weight_cast,
        "tp_communication": m * stage["tp"],
        "cp_communication": m * stage["cp"],
        "ep_communication": m * stage["ep"],
        "pp_communication": m * p2p,
        "pipeline_bubble": bubble,
        "dp_communication": dp_exposed,
        "optimizer": optimizer,
        "offload": offload,
        "overhead": cluster.step_overhead + m * cluster.microbatch_overhead + np.zeros_like(optimizer),
    }
    phases = {
        "forward": m * (stage["fwd_math"] + stage["fwd_mem"]),
        "backward": m * (stage["bwd_math"] + stage["bwd_mem"]),
        "recompute": m * (stage["rec_math"] + stage["rec_mem"]),
    }
    model_flops, hw_flops = flops
    step_time = _added(breakdown.values())
    capacity = devices * st.dtype_table(cluster.accelerator.peak_flops) * step_time
    return StepArrays(
        breakdown=breakdown, phases=phases, memory=memory, memory_total=memory_total,
        hbm_bytes=placed.hbm, expansion_bytes=placed.expansion, step_time=step_time,
        model_flops=model_flops, hardware_flops=hw_flops,
        tokens_per_second=st.global_batch * model.seq_len / step_time,
        mfu=model_flops / capacity, hfu=hw_flops / capacity, fits=placed.fits, microbatches=m,
        stage_layers=lay.stage_layers, last_stage_memory=last_stage,
    )


def _added(values):
    """a + b + c + ... of ``values`` in their order (``sum`` would start with 0 + a, one more full-size pass)."""
    values = iter(values)
    total = next(values)
    for value in values:
        total = total + value
    return total


def _stage_work(model: Transformer, lay: Layout, layouts: tuple, work: tuple) -> dict:
    """``_slowest_stage`` of every point (``lay``: its Layout), from the layouts and the micro-batch work terms
    as grouped (``layouts``: (Layout per group, rows); ``work``: (work dicts per group, rows); rows None where
    not grouped). Its inputs are a layout's stage mixes and a micro-batch shape's work, so where both are
    grouped it is computed once per distinct pair of them and gathered back (cost/distinct.py: paired_rows;
    the same numbers); else per point."""
    (lay_groups, lay_rows), (terms, terms_rows) = layouts, work
    pairs = None
    if lay_rows is not None and terms_rows is not None:
        pairs = paired_rows(lay_rows[1], terms_rows[1], len(lay_rows[0]), len(terms_rows[0]))
    if pairs is None:
        mixes = lay.mixes
        if terms_rows is not None:
            terms = gathered(terms, terms_rows[1])
    else:
        mixes = gathered(lay_groups.mixes, lay_rows[1][pairs[0]])
        terms = gathered(terms, terms_rows[1][pairs[0]])
    dense_w, emb_w, head_w = (prefixed(terms, k) for k in ("dense.", "emb.", "head."))
    moe_w = prefixed(terms, "moe.") if model.moe else dense_w
    stage = _slowest_stage(mixes, dense_w, moe_w, emb_w, head_w)
    return stage if pairs is None else gathered(stage, pairs[1])


def _over_points(value, shape: tuple):
    """``value`` as a float array of ``shape``: itself where it is one (so that a candidate sharing it is seen to
    be the same object), else a read-only broadcast view."""
    value = np.asarray(value, dtype=float)
    return value if value.shape == shape else np.broadcast_to(value, shape)


def _same(a, b) -> bool:
    """True when ``a`` and ``b`` hold the same bits at every point, as seen without reading every point: one
    object, or two broadcast views (cost/distinct.py: gathered) of one value."""
    if a is b:
        return True
    a, b = np.asarray(a), np.asarray(b)
    return (a.ndim == 1 and a.shape == b.shape and a.dtype == b.dtype and a.strides[0] == 0 and b.strides[0] == 0
            and a[:1].tobytes() == b[:1].tobytes())


def _zero(value) -> bool:
    """True for a 0 that holds at every point: a scalar 0, or an array whose points all share one 0 (a read-only
    broadcast view, cost/distinct.py: gathered)."""
    value = np.asarray(value)
    if value.ndim == 0:
        return not value
    if value.size == 0:          # no points: nothing to add (an empty batch, e.g. a whatif variant nothing fits)
        return True
    return value.strides[0] == 0 and not np.any(value[0])


def _forward_total(stage: dict):
    """Forward seconds of the stage per micro-batch: kernels plus the in-layer communication exposed in forward."""
    return stage["fwd_math"] + stage["fwd_mem"] + stage["tp"] + stage["ep"] + stage["cp"] - stage[BACKWARD_COMM]


def _backward_total(stage: dict):
    """Backward (+ recomputation) seconds of the stage per micro-batch, with the communication exposed in them."""
    return stage["bwd_math"] + stage["bwd_mem"] + stage["rec_math"] + stage["rec_mem"] + stage[BACKWARD_COMM]


def _pipeline_p2p(st: StrategyArrays, dims: tuple, pp_spans: list, fwd, bwd, regather, nbytes, hidden_too=True):
    """Exposed pipeline send/recv per micro-batch [s].

    A micro-batch crosses v chunk boundaries in forward and v in backward:
    2v transfers of b s h e / (cp t) bytes (Megatron-LM's scatter-gather
    optimisation: each TP rank sends 1/t of the activation), each followed,
    without sequence parallelism, by a TP all-gather (``regather``); with
    DeepSpeed's pipeline engine b s h e / cp bytes and no all-gather.
    Without pp_overlap all of it is exposed. With pp_overlap (interleaved
    schedule, Megatron-LM --overlap-p2p-communication) a transfer runs while
    the next chunk computes: exposed = v (max(0, t_sr - T_f/v) + max(0, t_sr
    - T_b/v)) + 2 v t_regather, T_f and T_b the stage's forward and backward
    time per micro-batch (Narayanan et al. 2021, Sec. 2.2; docs/model.md).
    Returns (exposed, (hidden in forward, hidden in backward)): the seconds of
    transfer that ran beside forward and backward compute, v min(t_sr, T/v) each
    ((0, 0) unless ``hidden_too``).
    """
    v = st.interleave
    send = coll.send_recv_time(nbytes, dims, pp_spans)
    overlapped = st.pp_overlap & (v > 1) & (st.pp > 1)
    if not np.any(overlapped):        # most batches: every transfer exposed, none beside compute
        hidden = (np.zeros_like(send), np.zeros_like(send)) if hidden_too else (0.0, 0.0)
        return np.where(st.pp > 1, 2.0 * v * send + 2.0 * v * regather, 0.0), hidden
    exposed = v * (np.maximum(send - fwd / v, 0.0) + np.maximum(send - bwd / v, 0.0))
    hidden = ((np.where(overlapped, v * np.minimum(send, fwd / v), 0.0),
               np.where(overlapped, v * np.minimum(send, bwd / v), 0.0)) if hidden_too else (0.0, 0.0))
    return np.where(st.pp > 1, np.where(overlapped, exposed, 2.0 * v * send) + 2.0 * v * regather, 0.0), hidden


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


def _data_parallel(st: StrategyArrays, fwd, bwd, dp: DataParallelComm, m, units, hidden_too=True):
    """Exposed data-parallel communication per step [s].

    The collectives (cost/layout.py, DataParallelComm): the gradient reduction
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
    (cost/microbatch.py: contention).
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
    next forward as the bucketed one does (``_data_parallel``):
        exposed = m B(t, T_b) + max(0, t_ag - T_f c),   t = t_ar if m = 1 else t_rs
    (c: the chunk steps of the window); without it, m u t + t_ag. Hybrid sharding's all-reduce across
    nodes is not modelled here. Second value: the seconds of them that ran beside compute.
    """
    unit = np.where(m > 1, dp.layer_reduce, dp.layer_allreduce)
    gather = np.where(st.zero >= Zero.OPTIMIZER, dp.gather, np.where(m > 1, dp.weights_gather, 0.0))
    hidden = m * _prefetched(unit, bwd, units) + np.maximum(gather - fwd * chunk_steps, 0.0)
    beside = m * _prefetched_hidden(unit, bwd, units) + np.minimum(gather, fwd * chunk_steps)
    return np.where(st.dp_overlap, hidden, m * units * unit + gather), beside


def _memory(model: Transformer, st: StrategyArrays, terms: dict, lay: Layout, m, cluster: Cluster):
    """Bytes per device of the stage that needs the most, by part; that stage's activations per micro-batch; and
    the total of the last pipeline rank (the one Megatron-LM logs memory from), its reserve included.

    Per candidate stage (cost/params.py): model states (cost/layout.py: shared
    weights sharded by ZeRO over dp x cp, expert weights over dp/ep x cp, an fp8
    weight copy in fp8 training) and activations: the in-flight micro-batches of
    its pipeline rank under 1F1B (first stage rank 0, a full middle stage rank 1,
    the last rank p - 1) of its dense and MoE layers, one layer's transient
    recomputation, and on the stage with the head the logits of the one micro-batch
    whose loss it computes (the last rank runs each micro-batch's backward right
    after its forward; with p = 1 the single stage). Per layer, the bytes kept and the
    recomputation's transient bytes, the logits and the TP buffers depend only on the
    micro-batch knobs (cost/microbatch.py: activation_terms). With interleaving, the stage that holds the
    embedding in a layer's slot of its first chunk (pipeline split
    embedding-loss) has one layer fewer there, where the warm-up's extra
    micro-batches sit (cost/memory.py: inflight_layer_microbatches); the stage whose
    last chunk holds the loss in a layer's slot has (S + 1)/v layers in its first
    chunk and the rest spread over the others. The
    candidate with the largest total is reported, with the reserve the cluster
    keeps (cost/memory.py: reserved_bytes) as the part "reserved". With grad_buffer
    layer the gradients are two layers' in flight, plus their DP shard when the step
    has several micro-batches (cost/layout.py: _state_bytes). ZeRO 3 with grad_sync
    step and several micro-batches holds its stage's gradients unsharded, g P (FSDP's
    no_sync accumulation, docs/model.md).
    """
    p = st.pp
    dense_pl, dense_work = terms["dense.kept"], terms["dense.working"]
    moe_pl, moe_work = (terms["moe.kept"], terms["moe.working"]) if model.moe else (dense_pl, dense_work)
    working = np.maximum(dense_work, moe_work) if model.moe else dense_work    # the same for every candidate
    logits, buffers = terms["logits"], terms["buffers"]
    best, best_total, best_act = None, None, None
    any_slot = bool(np.any(st.uses(PipelineSplit.EMBEDDING_LOSS)))
    slot = embedding_slots(st) if any_slot else 0.0
    bounds = warm_up(p, st.interleave, m)      # every rank's warm-up bounds, once for the candidates
    below_last = p - 1.0
    last = len(lay.memory) - 1
    layer_grads = st.uses(GradBuffer.LAYER)
    any_layer_grads = bool(np.any(layer_grads))
    unsharded = st.uses(GradSync.STEP)
    any_unsharded = bool(np.any(unsharded))
    if any_unsharded:         # most batches have none: skip the rest of the test
        unsharded = unsharded & (st.zero >= Zero.PARAMETERS) & (m > 1) & (st.dp * st.cp > 1)
    for index, (states, (_, _, with_emb, with_head)) in enumerate(zip(lay.memory, lay.mixes)):
        n_dense, n_moe = states["n_dense"], states["n_moe"]
        # the pipeline rank the candidate stands for: the first stage, a full middle stage (the earliest,
        # rank 1, warms up longest) or the last; one stage when p = 1
        if index == 0:
            rank = 0.0
        else:
            rank = np.maximum(below_last if index == last else np.minimum(1.0, below_last), 0.0)
        layers = n_dense + n_moe
        if model.moe:          # the stage's mean activation bytes per layer over its dense and MoE layers
            per_layer = (n_dense * dense_pl + n_moe * moe_pl) / np.maximum(layers, 1.0)
        else:
            per_layer = dense_pl * (layers > 0)
        first_chunk = None
        if any_slot and np.any((with_emb + with_head) * slot):
            # the embedding takes a layer's slot of this stage's first chunk, the loss one of its last chunk: the
            # first chunk holds (S + slots)/v - embedding slot layers (cost/memory.py: inflight_layer_microbatches)
            taken, loss = with_emb * slot * (p > 1), with_head * slot * (p > 1)
            first_chunk = np.where(taken + loss > 0, np.maximum((layers + taken + loss) / st.interleave - taken, 0.0),
                                   layers / st.interleave)
        inflight = inflight_layer_microbatches(layers, p, st.interleave, m, first_chunk, rank, bounds)
        gradients = states["gradients"]
        if any_layer_grads:       # most batches have none: skip two full-size where()s per candidate
            gradients = np.where(layer_grads, states["grad_layer"] + np.where(m > 1, states["grad_shard"], 0.0),
                                 gradients)
        if any_unsharded:
            gradients = np.where(unsharded, states["grad_unsharded"], gradients)
        memory = {"weights": states["weights"], "gradients": gradients, "optimizer": states["optimizer"],
                  "activations": inflight * per_layer + working + with_head * logits,
                  "buffers": buffers}
        total = memory["weights"] + gradients + memory["optimizer"] + memory["activations"] + buffers
        act_per_mb = layers * per_layer
        if index == last:
            last_total = total
        if best is None:
            best, best_total, best_act = memory, total, act_per_mb
        else:
            better = total > best_total
            best = {k: best[k] if memory[k] is best[k] else np.where(better, memory[k], best[k]) for k in best}
            best_act = np.where(better, act_per_mb, best_act)
            best_total = np.maximum(total, best_total)
    fixed = (cluster.reserved_memory, cluster.fragmentation, cluster.workspace_memory)
    reserved = reserved_bytes(best_total, *fixed)
    best["reserved"] = reserved if np.shape(reserved) == np.shape(best_total) else reserved + np.zeros_like(best_total)
    return best, best_act, last_total + reserved_bytes(last_total, *fixed)


def _remote_per_pass(acc, placed, memory, act_per_mb) -> tuple:
    """Seconds per micro-batch the forward and the backward pass stream from the expansion tier: (W_x + f_x A)
    / B and (2 W_x + f_x A) / B (``_offload_time``'s terms; W_x the spilled weights and gradients, f_x A the
    spilled share of a micro-batch's activations, B the tier's achievable bandwidth)."""
    bw = acc.expansion.achievable_bandwidth
    act_total = np.maximum(memory["activations"], 1.0)
    act_fraction = np.where(memory["activations"] > 0, placed.spilled_activations / act_total, 0.0)
    spilled_act = act_fraction * act_per_mb
    return (placed.spilled_weights + spilled_act) / bw, (2.0 * placed.spilled_weights + spilled_act) / bw


def _stage_pass_flops(model: Transformer, st: StrategyArrays, lay: Layout, m, flops: tuple) -> tuple:
    """Hardware FLOP one device of the fullest stage runs per micro-batch in forward and in backward (with its
    recomputation): of the step's (F, H) = ``flops`` (``_flops``: model and hardware FLOP; backward is twice
    forward) the shares F/3 and H - F/3, times the device's part of them,
        n_stage / (L tp cp dp m)
    (n_stage the stage's transformer layers of L; a stage's embedding and head taken in proportion to its
    layers)."""
    model_f, hardware_f = flops
    share = np.maximum(lay.stage_layers, 1.0) / (model.layers * st.tp * st.cp * st.dp * m)
    return model_f / 3.0 * share, (hardware_f - model_f / 3.0) * share


def _remote_compute_per_pass(peak, placed, memory, pass_flops) -> tuple:
    """Seconds per micro-batch the forward and the backward pass compute on operands read from the expansion
    tier in place, at the tier's compute roof P_x (MemoryTier.compute; the COMET authors' remote-memory
    roofline, trial/run.log: remote-mem-roofline-peak-perf 10000 GFLOP/s beside remote-mem-roofline-bw):
        forward  s_w F_f / P_x            (its GEMMs read the spilled weights)
        backward max(s_w, f_x) F_b / P_x  (it reads weights and saved activations and writes gradients)
    s_w = W_x / (W + G): the spilled share of the weights and gradients; f_x the spilled share of the
    activations; F_f, F_b the pass's FLOP (``_stage_pass_flops``). Spilled bytes are taken as the same share of
    every layer, and the two kinds on the same layers, so that the fewest operators touch the tier: a lower
    bound of the capped work. The optimizer's work on spilled state is left out: about 16 FLOP per 24 bytes
    streamed (read and write of fp32 master, m, v), under the roof's ridge P_x / B (100 FLOP/B in the
    authors' configs), so the stream ``_offload_time`` charges bounds it."""
    f_fwd, f_bwd = pass_flops
    wg = memory["weights"] + memory["gradients"]
    weights_share = np.where(wg > 0, placed.spilled_weights / np.maximum(wg, 1.0), 0.0)
    act_share = np.where(memory["activations"] > 0,
                         placed.spilled_activations / np.maximum(memory["activations"], 1.0), 0.0)
    return weights_share * f_fwd / peak, np.maximum(weights_share, act_share) * f_bwd / peak


def _offload_time(acc, placed, memory, act_per_mb, m, overlap=None, roofline=None):
    """Traffic to the expansion tier per step that is not hidden behind compute [s].

    Spilled bytes (cost/memory.py: place): O_x of optimizer state, W_x of
    weights and gradients, and the share f_x of each micro-batch's A
    activation bytes. Per step the optimizer state is read and written once
    (2 O_x); per micro-batch the weights are read in forward and again in
    backward and the gradients written in backward (3 W_x: W_x forward, 2 W_x
    backward), the spilled activations written in forward and read in
    backward (f_x A each). B: the tier's achievable bandwidth; one access
    latency per transfer phase (2 per step for the optimizer, 3 per
    micro-batch otherwise).
    Without overlap (default) all of it is exposed:
        T = (2 O_x + m (3 W_x + 2 f_x A)) / B + latencies
    ``overlap`` = (expansion_overlap per point, T_f, T_b, T_opt, T_dp): where
    on, each pass's traffic is prefetched (weights and the activations read
    back) or drained (gradients, activations written) while that pass
    computes, as ZeRO-Infinity's prefetching offload engine and CXL memory
    pooling do, and only the excess is exposed (a roofline per pass):
        E = m [max(0, (W_x + f_x A)/B - T_f) + max(0, (2 W_x + f_x A)/B - T_b)]
            + max(0, 2 O_x / B - T_opt)
    The tier's link is not the network's, so its transfers also proceed while
    the device waits on exposed data-parallel communication T_dp; only what
    is left after that is charged:
        T = max(0, E - T_dp) + latencies
    Without this, the excess over the same compute window would be charged
    twice (once as exposed DP communication, once as exposed tier traffic), and
    a faster device could make the step slower. With it, the overlapped part of
    the step is max(compute, DP, tier) per window: never longer when compute,
    HBM or a link gets faster.
    T_f, T_b: the stage's forward and backward (+ recomputation) seconds per
    micro-batch with their exposed communication; T_opt: the optimizer step;
    T_dp: the step's exposed data-parallel communication.
    ``roofline`` = (expansion_roofline per point, C_f, C_b, R_f, R_b): where on, the tier is costed as
    COMET's remote-memory roofline (dkadiyala3/comet-astrasim, trial/run.log: remote-mem-roofline-bw and
    -peak-perf beside local-mem-roofline-*): an operator takes max(compute, local memory, remote memory,
    compute on remote operands), so each pass's remote time R (its stream (W_x + f_x A)/B, (2 W_x + f_x A)/B,
    or where the tier has a compute roof its work on spilled operands at that roof, whichever is longer:
    ``_remote_compute_per_pass``) hides only behind that pass's own duration C_f, C_b (T_f, T_b: its kernels,
    compute- or memory-bound, and the in-layer communication they wait on), and nothing is prefetched from
    one pass into another or into exposed DP time. (Hiding it behind the compute-bound kernels alone made
    faster compute slow a step: a GEMM that turns memory-bound, or attention that stops hiding a CP ring,
    left that window, issue 32.)
        T = m [max(0, R_f - C_f) + max(0, R_b - C_b)] + max(0, 2 O_x / B - T_opt) + latencies
    (the optimizer, memory-bound, streams its spilled state beside its HBM traffic).
    Sources: Rajbhandari et al. 2021 (ZeRO-Infinity, arXiv:2104.07857,
    Sec. 6: overlap-centric design); docs/model.md.
    """
    if acc.expansion is None:
        return np.zeros_like(placed.hbm)
    bw, lat = acc.expansion.achievable_bandwidth, acc.expansion.latency
    remote_f, remote_b = _remote_per_pass(acc, placed, memory, act_per_mb)
    phases = (np.where(placed.spilled_optimizer > 0, 2.0, 0.0)
              + np.where(placed.expansion > placed.spilled_optimizer, 3.0 * m, 0.0))
    exposed = 2.0 * placed.spilled_optimizer / bw + m * (remote_f + remote_b)
    if overlap is not None:
        on, t_f, t_b, t_opt, t_dp = overlap
        forward = np.maximum(remote_f - t_f, 0.0)
        backward = np.maximum(remote_b - t_b, 0.0)
        optimizer = np.maximum(2.0 * placed.spilled_optimizer / bw - t_opt, 0.0)
        exposed = np.where(on, np.maximum(m * (forward + backward) + optimizer - t_dp, 0.0), exposed)
        if roofline is not None:
            on, c_f, c_b, roof_f, roof_b = roofline
            forward = np.maximum(roof_f - c_f, 0.0)
            backward = np.maximum(roof_b - c_b, 0.0)
            exposed = np.where(on, m * (forward + backward) + optimizer, exposed)
    return exposed + phases * lat


def _attention_matmul_params(model: Transformer) -> float:
    """Weights of one layer's attention projections [-]."""
    return sum(p.n_in * p.n_out for p in model.attention.projections(model.hidden))


def dense_layer_matmul_params(model: Transformer) -> float:
    """Weights every token passes through in one dense layer's matrix multiplies: attention projections and
    the MLP (3 matrices when gated, else 2) [-]."""
    mats = 3 if model.mlp.gated else 2
    return _attention_matmul_params(model) + mats * model.hidden * model.mlp.ffn


def _matmul_params(model: Transformer) -> float:
    """Weights every token passes through in matrix multiplies, summed over the layers [-]: attention
    projections and MLP (MoE layers: the router, top_k routed and the shared experts)."""
    h = model.hidden
    mats = 3 if model.mlp.gated else 2
    moe_layer = dense_layer = dense_layer_matmul_params(model)
    if model.moe:
        moe = model.moe
        moe_layer = (_attention_matmul_params(model) + h * moe.experts
                     + mats * h * (moe.top_k * moe.ffn + moe.shared_ffn))
    return model.dense_layers * dense_layer + model.moe_layers * moe_layer


def _score_flops_per_token(model: Transformer, keys) -> tuple:
    """(scores and attention-over-V, scores alone) FLOP per token of one layer's forward, at ``keys`` keys per
    query: 2 k a (d_qk + d_v) and 2 k a d_qk."""
    att = model.attention
    return 2.0 * keys * att.heads * (att.qk_dim + att.v_dim), 2.0 * keys * att.heads * att.qk_dim


def dense_layer_flops(model: Transformer, tokens, recompute: Recompute) -> tuple:
    """(forward, backward with its recomputation) hardware FLOP of one dense layer over ``tokens`` tokens, the
    per-layer form of ``_flops``: forward 2 P_l + 2 k a (d_qk + d_v) per token (k the causal keys per query),
    backward twice that, full recomputation the forward again, selective the scores 2 k a d_qk."""
    both, scores = _score_flops_per_token(model, model.causal_keys_per_query())
    forward = tokens * (2.0 * dense_layer_matmul_params(model) + both)
    again = {Recompute.FULL: forward, Recompute.SELECTIVE: tokens * scores}
    return forward, 2.0 * forward + again.get(recompute, 0.0)


def model_flops(model: Transformer, global_batch, causal: bool = True):
    """Model FLOPs of one iteration: forward and backward of the work a token needs [FLOP].

        F = B s [6 (P_matmul + V h) + 6 L k a (d_qk + d_v)]
    (Narayanan et al. 2021, Eq. 3, generalised: for GPT d_qk = d_v = d and k = s give its 12 L s a d),
    with k the keys a query attends to. ``causal`` (the default, what MFU uses): k is the causal average
    (Transformer.causal_keys_per_query: s / 2, less with a sliding window), the scores a decoder needs;
    counting the masked half as well would let a kernel that skips it (every flash kernel) report an MFU
    above 1 on long sequences. ``causal=False``: k = s (Transformer.keys_per_query), the convention of
    Megatron-LM's and PaLM's published MFU, used to turn a reported MFU into a step time.
    """
    keys = model.causal_keys_per_query() if causal else model.keys_per_query()
    scores, _ = _score_flops_per_token(model, model.layers * keys)      # forward's 2 L k a (d_qk + d_v)
    return global_batch * model.seq_len * (6.0 * (_matmul_params(model) + model.vocab * model.hidden) + 3.0 * scores)


def step_time_of_mfu(model: Transformer, global_batch, devices, peak, mfu):
    """The step time a published MFU stands for [s]: model FLOPs counted as such reports count them (every
    score, ``model_flops(..., causal=False)``: Megatron-LM's and PaLM's convention) / (devices x peak x MFU),
    peak in FLOP/s of the run's dtype."""
    return model_flops(model, global_batch, causal=False) / (devices * peak * mfu)


def _flops(model: Transformer, st: StrategyArrays):
    """Model and hardware FLOPs per iteration (``model_flops``, causal).

    Hardware FLOPs add the recomputed forward: full 2 * P_layers + 2 * L * k *
    a * (d_qk + d_v), selective 2 * L * k * a * d_qk (the scores), k the causal
    keys per query. A flash kernel's backward recomputes the scores too and is
    not added: HFU counts the algorithm's recomputation, not a kernel's.
    """
    both, scores = _score_flops_per_token(model, model.layers * model.causal_keys_per_query())
    tokens = st.global_batch * model.seq_len
    flops = model_flops(model, st.global_batch)
    extra = np.where(st.uses(Recompute.FULL), 2.0 * _matmul_params(model) + both,
                     np.where(st.uses(Recompute.SELECTIVE), scores, 0.0))
    return flops, flops + tokens * extra
