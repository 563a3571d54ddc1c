"""Step 3: one layer's work for one micro-batch on one device, with the communication it waits on.

Kernel times by phase (forward, backward, recomputation; math and memory) from the layer's operators
(cost/layer_ops.py), plus the in-layer communication left exposed: TP collectives (pipelined with their GEMMs
where tp_overlap is on), expert all-to-alls (EP; hidden behind another micro-batch with ep_overlap) and the
context-parallel K/V exchange (CP ring or all-gather); and the compute lost to communication kernels that run
beside it (``contention``). Work is a dict of arrays with the keys of ``WORK_KEYS`` [s per micro-batch].
"""
from __future__ import annotations

import numpy as np

from comet_dse.cost import collectives as coll
from comet_dse.cost.kernels import KernelTime
from comet_dse.cost.layer_ops import DISPATCHER_ALLTOALL, LayerCost, layer_cost, moe_block
from comet_dse.cost.shapes import FP32, Context, context_of
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import MoE, Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import CpAlgorithm, Recompute


FP8_SCALE_BYTES = FP32 / 128.0  # fp8 values carry one fp32 scale per 128 (DeepSeek-V3 Sec. 3.3.2)


WORK_KEYS = ("fwd_math", "fwd_mem", "bwd_math", "bwd_mem", "rec_math", "rec_mem", "tp", "ep", "cp")


# The part of tp + ep + cp exposed during backward and recomputation: already in
# those keys, so never summed again; it widens the window the data-parallel
# reduction hides behind (cost/step.py).
BACKWARD_COMM = "bwd_comm"


STAGE_KEYS = WORK_KEYS + (BACKWARD_COMM,)


def work(fwd: KernelTime, bwd: KernelTime, rec: KernelTime, tp=0.0, ep=0.0, cp=0.0, bwd_comm=0.0) -> dict:
    return {"fwd_math": fwd.math, "fwd_mem": fwd.memory, "bwd_math": bwd.math, "bwd_mem": bwd.memory,
            "rec_math": rec.math, "rec_mem": rec.memory, "tp": tp, "ep": ep, "cp": cp, BACKWARD_COMM: bwd_comm}


def work_total(w: dict):
    """Seconds of a work dict per micro-batch: the sum of its WORK_KEYS (communication counted once), added in
    their order."""
    total = w[WORK_KEYS[0]]
    for k in WORK_KEYS[1:]:
        total = total + w[k]
    return total


def layer_work(model: Transformer, ctx: Context, st: StrategyArrays, moe_layer: bool = False):
    """One layer, one micro-batch: kernel times by phase plus exposed in-layer communication.

    TP: 2 all-reduces in forward and 2 in backward (Megatron f/g operators); with
    SP each is an all-gather plus a reduce-scatter of the same volume. A
    parallel-residual layer has fewer (LayerCost.tp_messages, tp_messages_backward). With
    tp_overlap each collective is cut into t chunks pipelined with the GEMMs
    next to it: per pass, exposed = max(T_comm - T_gemm, T_comm / t), the
    first (or last) chunk having nothing to hide behind.
    EP (MoE layers): dispatch and combine all-to-alls in forward and in backward;
    with ep_overlap (DualPipe) only what exceeds the pass's compute left free
    by the TP and CP overlaps is exposed (``_behind_the_rest``).
    CP, ring (default): cp-1 steps passing K and V (forward) and their
    gradients (backward, twice the bytes), overlapped with the attention
    kernels; only the excess is exposed: max(0, steps * t_step - t_attention).
    CP, all-gather (Llama 3, Dubey et al. 2024, Sec. 3.3.2): K and V of the
    whole sequence all-gathered before attention and their gradients
    reduce-scattered after it, both exposed.
    Full recomputation repeats the forward's TP, EP and CP communication.
    Returns (work dict, LayerCost).
    """
    layer: LayerCost = layer_cost(model, ctx.shape, ctx.dev, moe_layer=moe_layer)
    dims, spans = ctx.dims, ctx.spans
    full, selective = st.uses(Recompute.FULL), st.uses(Recompute.SELECTIVE)
    all_gather = st.uses(CpAlgorithm.ALL_GATHER)
    tp_message = coll.all_reduce_time(layer.tp_message_bytes, dims, spans["tp"])
    tp_pass, tp_back = layer.tp_messages * tp_message, layer.tp_messages_backward * tp_message
    tp_fwd = np.where(st.tp_overlap, _pipelined(tp_pass, layer.tp_gemm_forward, st.tp), tp_pass)
    tp_bwd = np.where(st.tp_overlap, _pipelined(tp_back, layer.tp_gemm_backward, st.tp), tp_back)
    ring = (st.cp - 1) * coll.send_recv_time(layer.cp_kv_bytes, dims, spans["cp"])
    core = layer.attention_core.total
    gather = coll.all_gather_time(st.cp * layer.cp_kv_bytes, dims, spans["cp"])
    cp_fwd = np.where(st.cp > 1, np.where(all_gather, gather, np.maximum(ring - core, 0.0)), 0.0)
    core_back = layer.attention_core_backward.total
    cp_bwd = np.where(st.cp > 1, np.where(all_gather, gather, np.maximum(2.0 * ring - core_back, 0.0)), 0.0)
    ring_hides = (st.cp > 1) & ~all_gather
    ep_pass = expert_exchange_time(model.moe, layer.a2a_bytes, ctx, st) if layer.moe else 0.0
    ep_fwd = np.where(st.ep_overlap, _behind_the_rest(ep_pass, layer.forward.total, tp_pass - tp_fwd,
                                                      np.where(ring_hides, ring - cp_fwd, 0.0)), ep_pass)
    ep_bwd = np.where(st.ep_overlap, _behind_the_rest(ep_pass, layer.backward.total, tp_back - tp_bwd,
                                                      np.where(ring_hides, 2.0 * ring - cp_bwd, 0.0)), ep_pass)
    # the compute beside each hidden transfer runs on the units the communication kernels leave free
    u, u_ep = ctx.dev.comm_share, expert_exchange_share(ctx.dev, st)
    slow_f = (contention(u, TP_OVERLAP_SM_SHARE * (tp_pass - tp_fwd) + np.where(ring_hides, ring - cp_fwd, 0.0))
              + contention(u_ep, ep_pass - ep_fwd))
    slow_b = (contention(u, TP_OVERLAP_SM_SHARE * (tp_back - tp_bwd) + np.where(ring_hides, 2.0 * ring - cp_bwd, 0.0))
              + contention(u_ep, ep_pass - ep_bwd))
    forward = KernelTime(layer.forward.math + slow_f, layer.forward.memory)
    backward = KernelTime(layer.backward.math + slow_b, layer.backward.memory)
    rec = KernelTime(np.where(full, forward.math, np.where(selective, layer.attention_core.math, 0.0)),
                     np.where(full, layer.forward.memory, np.where(selective, layer.attention_core.memory, 0.0)))
    again = np.where(full, 1.0, 0.0)
    bwd_comm = again * (tp_fwd + ep_fwd + cp_fwd) + tp_bwd + ep_bwd + cp_bwd
    return work(forward, backward, rec, tp=(1.0 + again) * tp_fwd + tp_bwd,
                ep=(1.0 + again) * ep_fwd + ep_bwd, cp=cp_fwd * (1.0 + again) + cp_bwd, bwd_comm=bwd_comm), layer


# Of the TP collectives Transformer Engine overlaps with GEMMs (userbuffers, --tp-comm-overlap), the
# all-gathers run as ring exchanges on the copy engines and take no SMs, the reduce-scatters (and the
# bulk overlaps of backward) as SM kernels: TE comm_gemm_overlap (use_ce for ring_exchange), NVIDIA's
# MLPerf v3.1 GPT-3 conf/tp_overlap/h100tp4pp8mbs1.yaml (ring_exchange for qkv_fprop, fc1_fprop,
# proj_dgrad, fc2_dgrad; pipeline or bulk with 2-24 SMs for the others). With sequence parallelism each
# pass has as many all-gathers as reduce-scatters, so half the hidden TP transfer time holds SMs.
TP_OVERLAP_SM_SHARE = 0.5


# Streaming multiprocessors DeepEP's dispatch and combine kernels hold while they run: Megatron-Core's
# --moe-deepep-num-sms default (20) under the flex dispatcher, and the 20 of an H800's 132 SMs DeepSeek-V3 gives
# its own all-to-alls (arXiv:2412.19437, Sec. 3.2.2; DeepEP v1's training configuration used up to 24, its v2
# 4-6: deepseek-ai/DeepEP README).
DEEPEP_SMS = 20


def expert_exchange_share(dev, st: StrategyArrays):
    """The share of the compute units a hidden expert exchange holds, per point [-]: NCCL's (comm_share,
    Accelerator.comm_units / compute_units) for the all-to-all dispatcher, DEEPEP_SMS / compute_units for
    DeepEP's kernels (flex, fused) on a device that counts its communication units (comm_units > 0)."""
    deepep = np.minimum(DEEPEP_SMS, dev.units) / dev.units
    own = (st.moe_dispatcher != DISPATCHER_ALLTOALL) & (np.asarray(dev.comm_share) > 0)
    return np.where(own, deepep, dev.comm_share)


def contention(share, hidden):
    """Compute time lost to communication kernels that run beside it [s].

    A transfer of ``hidden`` seconds hidden behind compute holds a share u of the compute units
    (Accelerator.comm_units / compute_units: NCCL runs one thread block per channel, each on its own SM;
    DeepSeek-V3, arXiv:2412.19437 Sec. 3.2.2, gives 20 of an H800's 132 SMs to its all-to-alls), so the
    compute beside it runs at 1 - u for that long. For compute W and a transfer c <= W hidden behind it:
        T = max(c, W + u c),   i.e. u c added to the compute
    (W + u c >= c whenever c <= W, which ``hidden`` guarantees). Monotone: the pass takes
    W + c - (1 - u) h with h = min(c, W) the hidden seconds, which never grows when c shrinks (more
    bandwidth), W shrinks (faster compute; dh/dW <= 1) or u shrinks (more compute units).
    """
    return share * hidden


def layer_phase_times(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays) -> dict:
    """Forward and backward seconds of one dense layer and one micro-batch, per point.

    forward  = forward kernels + the communication exposed in forward;
    backward = backward and recomputation kernels + the communication exposed
               during them (BACKWARD_COMM), as a per-layer profile (Korthikanti
               et al. 2022, Table 4) measures them. Returns {"forward", "backward"} -> arrays [s].
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        w, _ = layer_work(model, context_of(model, cluster, devices, st), st)
    comm = w["tp"] + w["ep"] + w["cp"]
    return {"forward": w["fwd_math"] + w["fwd_mem"] + comm - w[BACKWARD_COMM],
            "backward": w["bwd_math"] + w["bwd_mem"] + w["rec_math"] + w["rec_mem"] + w[BACKWARD_COMM]}


def moe_block_phase_times(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays) -> dict:
    """Forward and backward seconds of one MoE block alone, one micro-batch, per point:

        forward  = router + token permutation + routed (and shared) experts + dispatch and combine
        backward = their backward kernels + the same two all-to-alls

    with the all-to-alls exposed (nothing else runs beside them), as Megatron-LM's MoE layer benchmark
    times a MoELayer with no attention, norm or residual around it
    (data/validation/moe_layer_perf.md). Returns {"forward", "backward"} -> arrays [s].
    """
    ctx = context_of(model, cluster, devices, st)
    with np.errstate(divide="ignore", invalid="ignore"):
        block, a2a = moe_block(model, ctx.shape, ctx.dev)
        exchange = expert_exchange_time(model.moe, a2a, ctx, st)
    return {"forward": block.forward.total + exchange, "backward": block.backward.total + exchange}


def _behind_the_rest(comm, compute, *hidden):
    """Exposed seconds of an overlapped collective whose pass computes ``compute`` seconds, part of which
    already hides other communication (``hidden``: the TP and CP seconds those overlaps hid) [s]:

        exposed = max(0, comm - max(0, compute - sum(hidden)))

    Each second of compute hides one transfer at a time: an expert all-to-all (DualPipe) hides behind what
    the TP chunks and the CP ring left free. Then the pass's compute plus its exposed communication is
    max(compute + TP and CP exposed, TP + CP + EP), which a faster kernel or link never lengthens (charging
    every overlap against the whole pass counted the same window twice, and a faster memory system made
    a step slower).
    """
    free = np.maximum(compute - sum(hidden), 0.0)
    return np.maximum(comm - free, 0.0)


def _pipelined(comm, gemm, chunks):
    """Exposed seconds of a collective cut into ``chunks`` and pipelined with GEMMs of ``gemm`` seconds:
    max(comm - gemm, comm / chunks) = comm - min(gemm, comm (1 - 1/chunks))."""
    return comm - np.minimum(gemm, comm * (1.0 - 1.0 / chunks))


def node_copy_fraction(moe: MoE | None, ep_spans: list):
    """Token copies crossing the EP group's outermost dimension, relative to a flat all-to-all [-].

    A flat all-to-all sends each of a token's top_k copies to its expert's
    device. Group-limited routing (DeepSeek-V3: 8 expert groups, one per node,
    a token's experts in at most 4 of them) is paired with a hierarchical
    exchange: one copy per destination node crosses the outer dimension and
    is forwarded to the expert devices inside it (DeepSeek-V3 Sec. 3.2.2).
    With n members on that dimension and groups spread evenly over them, a
    token can reach r = min(n, M * max(1, n / G)) of them, and its k copies,
    spread evenly over those, hit r (1 - (1 - 1/r)^k) distinct ones:
        fraction = r (1 - (1 - 1/r)^k) / k      (1 without group-limited routing)
    """
    if moe is None or not moe.group_limited:
        return 1.0
    n = np.select(coll.outermost(ep_spans), ep_spans, default=1.0)
    reach = np.maximum(np.minimum(n, moe.groups_per_token * np.maximum(1.0, n / moe.expert_groups)), 1.0)
    return reach * (1.0 - (1.0 - 1.0 / reach) ** moe.top_k) / moe.top_k


def rank_copy_fraction(moe: MoE | None, ep, dispatcher):
    """Token copies a dispatch sends, relative to one per routed expert (top_k per token) [-].

    Megatron-Core's all-to-all dispatcher sends a token once per chosen expert. DeepEP's kernels (the flex
    dispatcher, and DeepSeek's own stack: dispatcher fused) send it once per destination rank that holds any
    of its experts, and the combine sends back one partial sum per rank (DeepEP README: the dispatch layout
    counts tokens per rank, ``is_token_in_rank``). With E experts, L = E/ep on each of the ep ranks, and a
    token's k distinct experts drawn evenly, a rank holds none of them with probability
    C(E - L, k) / C(E, k) = prod_{i<k} (E - L - i) / (E - i), so

        fraction = ep (1 - prod_{i<k} (E - L - i) / (E - i)) / k      (1 for the all-to-all dispatcher)

    e.g. 32 experts on 8 ranks, top-8: 5.64 ranks per token, 0.70; 8 experts on 8 ranks, top-2: 1.
    """
    if moe is None:
        return 1.0
    ep = np.asarray(ep, dtype=float)
    none = np.ones_like(ep)
    local = moe.experts / ep
    for i in range(moe.top_k):
        none = none * np.maximum(moe.experts - local - i, 0.0) / (moe.experts - i)
    return np.where(dispatcher == DISPATCHER_ALLTOALL, 1.0, ep * (1.0 - none) / moe.top_k)


def expert_exchange_bytes(moe: MoE, a2a_bytes, ctx: Context, st: StrategyArrays) -> tuple:
    """(dispatch, combine) bytes one device sends in a MoE layer's all-to-alls of one pass [B].

    Each moves the layer's a2a_bytes per device (16-bit token copies, one per routed expert) times
    ``rank_copy_fraction`` (one per destination rank with DeepEP). With ep_fp8_dispatch the dispatch (and in
    backward the gradient sent to the down projection) is fp8 plus its scales: a2a_bytes * (1 + 4/128) / e;
    combines stay 16-bit.
    """
    sent = a2a_bytes * rank_copy_fraction(moe, st.ep, st.moe_dispatcher)
    fp8 = (1.0 + FP8_SCALE_BYTES) / ctx.shape.e
    return sent * np.where(st.ep_fp8_dispatch, fp8, 1.0), sent


def expert_exchange_time(moe: MoE, a2a_bytes, ctx: Context, st: StrategyArrays):
    """Dispatch plus combine all-to-all of one pass through a MoE layer [s]: the bytes of
    ``expert_exchange_bytes``, across the outer dimension no more than ``node_copy_fraction`` of the copies
    (one per destination node)."""
    ranks = rank_copy_fraction(moe, st.ep, st.moe_dispatcher)
    fraction = np.minimum(node_copy_fraction(moe, ctx.spans["ep"]), ranks) / ranks
    dispatch, combine = expert_exchange_bytes(moe, a2a_bytes, ctx, st)
    return (coll.all_to_all_time(dispatch, ctx.dims, ctx.spans["ep"], outer_scale=fraction)
            + coll.all_to_all_time(combine, ctx.dims, ctx.spans["ep"], outer_scale=fraction))
