"""Everything one micro-batch costs on one device, before the pipeline schedule.

Per layer (dense and, for MoE models, MoE), the embedding and the head: kernel
times by phase and the exposed communication that happens inside the layer —
TP collectives, expert all-to-alls (EP) and the context-parallel K/V exchange (CP).
Work is a dict of arrays with the keys of ``WORK_KEYS`` (seconds per
micro-batch). These terms depend on only a few strategy fields, so sweeps
compute them once per distinct combination (``deduplicated``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost import collectives as coll
from comet_dse.cost.compute import Device, KernelTime, elementwise_time, gemm_time
from comet_dse.cost.distinct import gathered, grouped
from comet_dse.cost.layer import FLOPS_SOFTCAP, FP32, NORM_BWD_ELEMENTS, LayerCost, LayerShape, layer_cost
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.declared import MICROBATCH_KNOBS
from comet_dse.strategy.choices import AttentionKernel, CpAlgorithm, CrossEntropy, Recompute
from comet_dse.strategy.arrays import StrategyArrays

DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
ACTIVATION_BYTES = 2.0          # activations stay 16-bit, also in fp8 training (Transformer Engine)
FP8_SCALE_BYTES = FP32 / 128.0  # fp8 values carry one fp32 scale per 128 (DeepSeek-V3 Sec. 3.3.2)
WORK_KEYS = ("fwd_math", "fwd_mem", "bwd_math", "bwd_mem", "rec_math", "rec_mem", "tp", "ep", "cp")
# The part of tp + ep + cp exposed during backward and recomputation: already in
# those keys, so never summed again; it widens the window the data-parallel
# reduction hides behind (cost/step.py).
BACKWARD_COMM = "bwd_comm"
STAGE_KEYS = WORK_KEYS + (BACKWARD_COMM,)
# Bytes per logit the loss holds at its peak, by --cross-entropy (docs/model.md, "Loss"): Megatron-LM's in-place
# softmax beside the 16-bit logits; Megatron-Core's fused loss (an fp32 copy and fp32 exponentials beside them);
# PyTorch's cross_entropy on fp32-cast logits (log-softmax output, nll and log-softmax gradients); the same under
# PyTorch's loss_parallel (four fp32 tensors in its backward).
LOGIT_BYTES = {CrossEntropy.IN_PLACE: FP32 + ACTIVATION_BYTES, CrossEntropy.FUSED: 2.0 * FP32 + ACTIVATION_BYTES,
               CrossEntropy.FP32_CAST: 3.0 * FP32, CrossEntropy.LOSS_PARALLEL: 4.0 * FP32}


def device_of(cluster: Cluster, st: StrategyArrays) -> Device:
    """Cost-model view of the accelerator for the dtypes and attention kernels of ``st``.

    A kernel the accelerator has no attention_efficiency for is NaN (the
    attention_kernel validity rule); an accelerator without any runs every
    kernel at matmul_efficiency.
    """
    acc = cluster.accelerator
    peaks = acc.peak_flops
    bf16 = peaks.get("bf16", peaks.get("fp16", np.nan))
    sixteen = st.dtype_table({"bf16": bf16, "fp16": peaks.get("fp16", bf16), "fp8": bf16})
    attn_fwd, attn_bwd = attention_efficiencies(cluster, st)
    sustained = st.dtype_table({d: acc.sustained(d) for d in peaks})
    return Device(
        peak=st.dtype_table(acc.peak_flops), matmul_eff=st.dtype_table(acc.matmul_efficiencies()),
        matmul_eff16=acc.matmul_efficiency, units=acc.compute_units,
        tile_m=acc.matmul_tile[0], tile_n=acc.matmul_tile[1], tile_k=acc.matmul_tile[2],
        pipeline_overhead=acc.matmul_pipeline_overhead,
        sram_cap=acc.sram.capacity, sram_bw=acc.sram.achievable_bandwidth,
        hbm_bw=acc.hbm.achievable_bandwidth, vector=acc.vector_flops, overhead=acc.kernel_overhead,
        peak16=sixteen, attn_fwd=attn_fwd, attn_bwd=attn_bwd,
        sustained=sustained, sustained16=acc.sustained("bf16" if "bf16" in peaks else "fp16"),
        comm_share=acc.comm_units / acc.compute_units,
    )


def attention_efficiencies(cluster: Cluster, st: StrategyArrays) -> tuple:
    """(forward, backward) efficiency of each point's attention kernel (the accelerator's
    attention_efficiency; NaN for a kernel it has none for; matmul_efficiency for every kernel when it
    has none at all)."""
    acc = cluster.accelerator
    rates = acc.attention_efficiency or {k.value: (acc.matmul_efficiency,) * 2 for k in AttentionKernel}
    per_kernel = [rates.get(k.value, (np.nan, np.nan)) for k in AttentionKernel]
    return (st.select(st.attention_kernel, [r[0] for r in per_kernel]),
            st.select(st.attention_kernel, [r[1] for r in per_kernel]))


@dataclass(frozen=True)
class Context:
    """What every term needs: the device, the network dimensions, each group's span, the layer shape."""

    dev: Device
    dims: tuple
    spans: dict        # group name (tp, cp, pp, dp, ep, edp) -> spans per dimension
    shape: LayerShape
    strides: dict      # group name -> device-number stride (StrategyArrays.strides)


def network_dims(cluster: Cluster, devices: int) -> tuple:
    """The cluster's network dimensions as the cost model sees them, sized for ``devices``."""
    return tuple(coll.Dim.of(d, n) for d, n in zip(cluster.network, cluster.dim_sizes(devices)))


def context_of(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays) -> Context:
    """Device view, network dimensions for ``devices``, and the spans of every parallel group.

    Groups: TP (size tp), CP (cp), PP (pp), DP (dp), EP (ep consecutive DP
    ranks) and expert-DP (dp/ep, stepping over EP groups); strides from
    ``StrategyArrays.strides`` (placement).
    """
    dims = network_dims(cluster, devices)
    shape = LayerShape(b=st.micro_batch, s=model.seq_len, t=st.tp, sp=st.sequence_parallel,
                       flash=st.flash_attention, e=ACTIVATION_BYTES, gemm_e=st.dtype_table(DTYPE_BYTES),
                       cp=st.cp, ep=st.ep, imbalance=st.moe_imbalance, dispatcher=st.moe_dispatcher)
    stride = st.strides()
    sizes = {"tp": st.tp, "cp": st.cp, "pp": st.pp, "dp": st.dp, "ep": st.ep, "edp": st.dp / st.ep}
    spans = {g: coll.spans(dims, stride[g], sizes[g]) for g in sizes}
    return Context(dev=device_of(cluster, st), dims=dims, spans=spans, shape=shape, strides=stride)


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
    cp_bwd = np.where(st.cp > 1, np.where(all_gather, gather, np.maximum(2.0 * ring - 2.5 * core, 0.0)), 0.0)
    ring_hides = (st.cp > 1) & ~all_gather
    ep_pass = expert_exchange_time(model, layer, ctx, st) if layer.moe else 0.0
    ep_fwd = np.where(st.ep_overlap, _behind_the_rest(ep_pass, layer.forward.total, tp_pass - tp_fwd,
                                                      np.where(ring_hides, ring - cp_fwd, 0.0)), ep_pass)
    ep_bwd = np.where(st.ep_overlap, _behind_the_rest(ep_pass, layer.backward.total, tp_back - tp_bwd,
                                                      np.where(ring_hides, 2.0 * ring - cp_bwd, 0.0)), ep_pass)
    # the compute beside each hidden transfer runs on the units the communication kernels leave free
    u = ctx.dev.comm_share
    slow_f = contention(u, TP_OVERLAP_SM_SHARE * (tp_pass - tp_fwd) + np.where(ring_hides, ring - cp_fwd, 0.0)
                        + (ep_pass - ep_fwd))
    slow_b = contention(u, TP_OVERLAP_SM_SHARE * (tp_back - tp_bwd) + np.where(ring_hides, 2.0 * ring - cp_bwd, 0.0)
                        + (ep_pass - ep_bwd))
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


def node_copy_fraction(model: Transformer, ep_spans: list):
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
    moe = model.moe
    if moe is None or not moe.group_limited:
        return 1.0
    n = np.select(coll.outermost(ep_spans), ep_spans, default=1.0)
    reach = np.maximum(np.minimum(n, moe.groups_per_token * np.maximum(1.0, n / moe.expert_groups)), 1.0)
    return reach * (1.0 - (1.0 - 1.0 / reach) ** moe.top_k) / moe.top_k


def expert_exchange_time(model: Transformer, layer: LayerCost, ctx: Context, st: StrategyArrays):
    """Dispatch plus combine all-to-all of one pass through a MoE layer [s].

    Each moves the layer's a2a_bytes per device (16-bit token copies), scaled
    on the outer dimension by ``node_copy_fraction``. With ep_fp8_dispatch the
    dispatch (and in backward the gradient sent to the down projection) is
    fp8 plus its scales: a2a_bytes * (1 + 4/128) / e; combines stay 16-bit.
    """
    fraction = node_copy_fraction(model, ctx.spans["ep"])
    fp8 = (1.0 + FP8_SCALE_BYTES) / ctx.shape.e
    dispatch = layer.a2a_bytes * np.where(st.ep_fp8_dispatch, fp8, 1.0)
    return (coll.all_to_all_time(dispatch, ctx.dims, ctx.spans["ep"], outer_scale=fraction)
            + coll.all_to_all_time(layer.a2a_bytes, ctx.dims, ctx.spans["ep"], outer_scale=fraction))


def embedding_and_head(model: Transformer, ctx: Context):
    """Work of the embedding (first stage) and final norm + LM head + loss (last stage), per micro-batch.

    Embedding: row gather + position add + dropout over b*s*h, vocabulary-parallel
    with an all-reduce (reduce-scatter with SP) of b*s*h*e across TP.
    Head: final norm, GEMM [b*s, h] x [h, V/t] (16-bit also in fp8 training), vocabulary-parallel cross
    entropy in fp32 over b*s*V/t logits as Megatron-LM computes it, one pass
    per operation: forward casts the 16-bit logits to fp32 (read e, write 4),
    takes the row maximum (read 4), subtracts it (read 4, write 4),
    exponentiates (8), sums (4) and divides by the sum (8), keeping the
    softmax for backward: e + 36 bytes per logit; backward scales the softmax
    by the loss gradient (8) and casts it to 16 bits (read 4, write e): 12 + e.
    Final logit soft-capping (Gemma 2): one fused element-wise pass c tanh(z/c)
    over the logits before the loss, 2e bytes per logit forward and 3e backward.
    """
    shape, dev, dims, tp_spans = ctx.shape, ctx.dev, ctx.dims, ctx.spans["tp"]
    tok, h, e, t = shape.tokens, model.hidden, shape.e, shape.t
    emb_f = elementwise_time(shape.norm_tokens * h, 4 * e + 1, 3, dev)
    emb_b = elementwise_time(shape.norm_tokens * h, 3 * e, 1, dev)
    emb_comm = np.where(shape.sp, 0.5, 1.0) * coll.all_reduce_time(tok * h * e, dims, tp_spans)
    zero = KernelTime(np.zeros_like(emb_f.math), np.zeros_like(emb_f.math))
    emb = work(emb_f, emb_b, zero, tp=emb_comm)

    norm_f = elementwise_time(shape.norm_tokens * h, 2 * e, 8, dev)
    norm_b = elementwise_time(shape.norm_tokens * h, NORM_BWD_ELEMENTS * e, 16, dev)
    vocab = model.vocab / t
    dev16 = dev.sixteen_bit()   # the output layer is not an fp8 (Transformer Engine) module: 16-bit GEMMs
    gemm_f = gemm_time(1, tok, vocab, h, e, dev16)
    gemm_b = gemm_time(1, tok, h, vocab, e, dev16) + gemm_time(1, h, vocab, tok, e, dev16)
    loss_f = elementwise_time(tok * vocab, e + 9 * FP32, 5, dev)
    loss_b = elementwise_time(tok * vocab, 3 * FP32 + e, 2, dev)
    if model.final_logit_softcap:     # c tanh(z / c) on the 16-bit logits, one fused pass (docs/model.md)
        loss_f = loss_f + elementwise_time(tok * vocab, 2 * e, FLOPS_SOFTCAP, dev)
        loss_b = loss_b + elementwise_time(tok * vocab, 3 * e, 2 * FLOPS_SOFTCAP, dev)
    # Input of the column-parallel head: gathered (SP) or all-reduced in backward (no SP).
    head_input_bwd = np.where(shape.sp, coll.all_gather_time(tok * h * e, dims, tp_spans),
                              coll.all_reduce_time(tok * h * e, dims, tp_spans))
    head_input = head_input_bwd + np.where(shape.sp, coll.all_gather_time(tok * h * e, dims, tp_spans), 0.0)
    loss_comm = 3.0 * coll.all_reduce_time(tok * FP32, dims, tp_spans)
    head = work(norm_f + gemm_f + loss_f, norm_b + gemm_b + loss_b, zero, tp=head_input + loss_comm,
                bwd_comm=head_input_bwd)
    return emb, head


def microbatch_terms(model: Transformer, ctx: Context, st: StrategyArrays) -> dict:
    """Everything that depends only on the micro-batch shape, the TP/EP/CP groups and dtype, flat by name.

    Keys: dense.<work>, emb.<work>, head.<work>, moe.<work> (MoE models only),
    <kind>.total (``work_total``), the activation terms of the memory (``activation_terms``: dense.kept,
    dense.working, moe.kept, moe.working, logits, buffers), and regather (the TP
    all-gather after a pipeline receive). ``prefixed`` reads moe.* as dense.*
    for a dense model.
    """
    dense_w, dense = layer_work(model, ctx, st, moe_layer=False)
    emb, head = embedding_and_head(model, ctx)
    shape = ctx.shape
    tokens_h = shape.tokens * model.hidden * shape.e
    terms = {"regather": np.where(shape.sp | (shape.t == 1), 0.0,
                                  coll.all_gather_time(tokens_h, ctx.dims, ctx.spans["tp"]))}
    layers, works = [("dense.", dense)], [("dense.", dense_w), ("emb.", emb), ("head.", head)]
    if model.moe:   # a dense model's MoE layer would be a copy of the dense one: not stored
        moe_w, moe = layer_work(model, ctx, st, moe_layer=True)
        layers.append(("moe.", moe))
        works.append(("moe.", moe_w))
    terms.update(activation_terms(model, st, layers))
    for prefix, w in works:
        terms.update({prefix + k: v for k, v in w.items()})
        terms[prefix + "total"] = work_total(w)
    return {k: np.broadcast_to(v, st.tp.shape) for k, v in terms.items()}


def activation_terms(model: Transformer, st: StrategyArrays, layers: list) -> dict:
    """The activation bytes of one micro-batch on one device that depend only on the micro-batch knobs, which
    cost/step.py (_memory) combines per candidate stage [bytes].

    Per layer kind (``layers``: [(prefix, LayerCost)]): "<kind>kept", the bytes a layer keeps from its forward
    until its backward under the point's recomputation (full: its input; selective: all but the attention
    core's; none: all it saves), and "<kind>working", the transient bytes of recomputing one layer (full: the
    rest of what it saves; selective: the attention core's; none: 0). "logits": the head's b s/c V/t logits
    at the bytes the loss keeps per logit (LOGIT_BYTES, by cross_entropy), plus 2 with final logit
    soft-capping (kept for backward). "buffers": the two TP message buffers, 2 x the bytes of one message,
    where t > 1.
    """
    t = st.tp
    full, selective = st.uses(Recompute.FULL), st.uses(Recompute.SELECTIVE)
    out = {}
    for kind, layer in layers:
        saved, core, layer_input = layer.saved_bytes, layer.attention_core_bytes, layer.input_bytes
        out[kind + "kept"] = np.where(full, layer_input, np.where(selective, saved - core, saved))
        out[kind + "working"] = np.where(full, saved - layer_input, np.where(selective, core, 0.0))
    capped = ACTIVATION_BYTES if model.final_logit_softcap else 0.0    # soft-capped logits kept for backward
    per_logit = st.select(st.cross_entropy, [LOGIT_BYTES[kind] for kind in CrossEntropy]) + capped
    out["logits"] = st.micro_batch * model.seq_len / st.cp * model.vocab / t * per_logit
    out["buffers"] = np.where(t > 1, 2.0 * layers[0][1].tp_message_bytes, 0.0)
    return out


def prefixed(terms: dict, prefix: str) -> dict:
    """The work dict stored under ``prefix`` (the STAGE_KEYS and its "total", ``work_total``); moe.* falls back
    to dense.*."""
    if prefix + WORK_KEYS[0] not in terms:
        prefix = "dense."
    return {k: terms[prefix + k] for k in STAGE_KEYS + ("total",)}



def deduplicated(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays, strides: dict,
                 context=None) -> dict:
    """microbatch_terms, computed once per distinct combination of the fields it depends on (cost/distinct.py).

    Those fields are the knobs declared ``microbatch=True`` on Strategy
    (``MICROBATCH_KNOBS``) and the TP and DP strides of the placement
    (``strides``, StrategyArrays.strides; they fix the spans of the TP, CP and
    EP groups). A sweep of millions of points has a few hundred distinct
    micro-batch shapes. ``context``: StrategyArrays -> Context (default ``context_of``).
    """
    at_groups, rows = deduplicated_grouped(model, cluster, devices, st, strides, context)
    return at_groups if rows is None else gathered(at_groups, rows[1])


def deduplicated_grouped(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays, strides: dict,
                         context=None) -> tuple:
    """(microbatch_terms of one point per distinct micro-batch shape, (first, inverse)), or (every point's
    terms, None) where the batch is not grouped (``deduplicated`` without the gathering; cost/distinct.py: grouped)."""
    context = context or (lambda sub: context_of(model, cluster, devices, sub))
    columns = [getattr(st, f) for f in MICROBATCH_KNOBS] + [strides["tp"], strides["dp"]]
    return grouped(st, columns, lambda sub: microbatch_terms(model, context(sub), sub))
