"""One training iteration, evaluated for many design points at once (numpy arrays).

This is the single copy of the step-time and memory math: ``estimate`` calls
it with a batch of one, sweeps with millions. Every term is explained in
docs/model.md; the schedule is Megatron-LM's 1F1B with optional
interleaving (Narayanan et al. 2021, Sec. 2.2):

    T_step = (m + (p-1)/v) * (t_stage + t_p2p) + T_dp,exposed + T_optimizer + T_offload

where t_stage is the slowest pipeline stage's forward + backward (+
recompute) time for one micro-batch, including its exposed TP collectives.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost import collectives as coll
from comet_dse.cost.compute import Device, KernelTime, elementwise_time, gemm_time, memory_pass_time
from comet_dse.cost.layer import FP32, LayerShape, layer_cost
from comet_dse.cost.memory import grad_bytes, inflight_layer_microbatches, model_state_bytes, place
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy import StrategyArrays

DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
ACTIVATION_BYTES = 2.0          # activations stay 16-bit, also in fp8 training (Transformer Engine)


def optimizer_step_bytes(dtype_is_fp16):
    """Bytes moved per parameter by a mixed-precision Adam step (Megatron-LM passes).

    Adam itself (fused): read fp32 weight, grad, m, v (16), write weight, m, v (12);
    grad-norm for clipping: read grad (4); copy fp32 weights to the 16-bit
    model (read 4, write 2); zero the main gradients (write g).
    fp16 adds loss scaling: cast the fp16 grads to fp32 (read 2, write 4) and
    unscale with an inf/nan check (read 4, write 4).
    fp16: 28 + 4 + 6 + 2 + 6 + 8 = 54 bytes; bf16/fp8 (fp32 main grads): 28 + 4 + 6 + 4 = 42.
    """
    return np.where(dtype_is_fp16, 54.0, 42.0)


def separate_accumulation_bytes(grad_el_bytes):
    """main_grad += grad per micro-batch: read main (g) + read grad (2) + write main (g) bytes/param."""
    return 2.0 * grad_el_bytes + 2.0


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
    fits: np.ndarray
    microbatches: np.ndarray
    stage_layers: np.ndarray


def device_of(cluster: Cluster, st: StrategyArrays) -> Device:
    """Cost-model view of the accelerator for the dtypes of ``st``."""
    acc = cluster.accelerator
    peaks = st.dtype_table(acc.peak_flops)
    return Device(
        peak=peaks, matmul_eff=acc.matmul_efficiency, units=acc.compute_units,
        tile_m=acc.matmul_tile[0], tile_n=acc.matmul_tile[1], tile_k=acc.matmul_tile[2],
        pipeline_overhead=acc.matmul_pipeline_overhead,
        sram_cap=acc.sram.capacity, sram_bw=acc.sram.achievable_bandwidth,
        hbm_bw=acc.hbm.achievable_bandwidth, vector=acc.vector_flops, overhead=acc.kernel_overhead,
    )


def _stage_layers(layers: int, pp):
    """Layers on the first, last and fullest stage when p does not divide L.

    The r = L mod p extra layers go to middle stages first, since the first
    stage also holds the embedding and the last the LM head.
    """
    base = np.floor(layers / pp)
    extra = layers - base * pp
    most = np.where(extra > 0, base + 1, base)
    last = np.where(pp - extra >= 2, base, most)
    first = np.where(pp - extra >= 1, base, most)
    return first, last, most


def _pick(candidates: list, key) -> dict:
    """Element-wise, the candidate dict whose ``key(c)`` is largest."""
    best = dict(candidates[0])
    best_total = key(candidates[0])
    for cand in candidates[1:]:
        total = key(cand)
        better = total > best_total
        best = {k: np.where(better, cand[k], best[k]) for k in best}
        best_total = np.maximum(best_total, total)
    return best


def _work(fwd: KernelTime, bwd: KernelTime, rec: KernelTime, tp_comm) -> dict:
    return {"fwd_math": fwd.math, "fwd_mem": fwd.memory, "bwd_math": bwd.math, "bwd_mem": bwd.memory,
            "rec_math": rec.math, "rec_mem": rec.memory, "tp": tp_comm}


def _scale(work: dict, n) -> dict:
    return {k: v * n for k, v in work.items()}


def _add(a: dict, b: dict) -> dict:
    return {k: a[k] + b[k] for k in a}


def _total(work: dict):
    return sum(work.values())


@dataclass(frozen=True)
class Context:
    """What every term needs: the device, the network dimensions and each group's span."""

    dev: Device
    dims: tuple
    tp_spans: list
    pp_spans: list
    dp_spans: list
    shape: LayerShape


def context_of(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays) -> Context:
    """Device view, network dimensions for ``devices``, and the TP/PP/DP group spans.

    Placement: by default TP innermost (stride 1), then PP (stride tp), then DP
    (stride tp*pp); ``Strategy.placement`` orders the axes otherwise.
    """
    dims = tuple(coll.Dim.of(d, n) for d, n in zip(cluster.network, cluster.dim_sizes(devices)))
    t, p = st.tp, st.pp
    gemm_e = st.dtype_table(DTYPE_BYTES)
    shape = LayerShape(b=st.micro_batch, s=model.seq_len, t=t, sp=st.sequence_parallel,
                       flash=st.flash_attention, e=ACTIVATION_BYTES, gemm_e=gemm_e)
    tp_stride, pp_stride, dp_stride = st.strides()
    return Context(dev=device_of(cluster, st), dims=dims, tp_spans=coll.spans(dims, tp_stride, t),
                   pp_spans=coll.spans(dims, pp_stride, p), dp_spans=coll.spans(dims, dp_stride, st.dp), shape=shape)


def layer_work(model: Transformer, ctx: Context, st: StrategyArrays):
    """One layer, one micro-batch: kernel times by phase plus exposed TP collectives.

    TP collectives per layer: 2 all-reduces in forward and 2 in backward
    (Megatron f/g operators); with SP each becomes an all-gather plus a
    reduce-scatter of the same total volume. Full recomputation repeats the
    forward ones. Returns (work dict, LayerCost, forward TP time).
    """
    layer = layer_cost(model, ctx.shape, ctx.dev)
    tp_pass = layer.tp_messages * coll.all_reduce_time(layer.tp_message_bytes, ctx.dims, ctx.tp_spans)
    rc = st.recompute
    rec = KernelTime(np.where(rc == 2, layer.forward.math, np.where(rc == 1, layer.attention_core.math, 0.0)),
                     np.where(rc == 2, layer.forward.memory, np.where(rc == 1, layer.attention_core.memory, 0.0)))
    work = _work(layer.forward, layer.backward, rec, 2.0 * tp_pass + np.where(rc == 2, tp_pass, 0.0))
    return work, layer, tp_pass


def evaluate(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays) -> StepArrays:
    """Step time, breakdown and memory for every strategy in ``st`` (same model, cluster, devices)."""
    ctx = context_of(model, cluster, devices, st)
    dev, dims, pp_spans, dp_spans = ctx.dev, ctx.dims, ctx.pp_spans, ctx.dp_spans
    t, p, d, v, b = st.tp, st.pp, st.dp, st.interleave, st.micro_batch
    s, h, L = model.seq_len, model.hidden, model.layers
    e = ACTIVATION_BYTES
    m = st.global_batch / (d * b)
    terms = _deduplicated(model, cluster, devices, st, ctx)
    layer_w, emb_work, head_work = (_prefixed(terms, name) for name in ("layer.", "emb.", "head."))
    first, last, most = _stage_layers(L, p)
    single = p == 1
    whole = _add(_add(_scale(layer_w, L), emb_work), head_work)
    slowest = _pick([
        _scale(layer_w, most),
        _add(_scale(layer_w, first), emb_work),
        _add(_scale(layer_w, last), head_work),
    ], key=_total)
    stage = {k: np.where(single, whole[k], slowest[k]) for k in whole}
    stage_layers = np.where(single, L, most)

    # Parameters on the busiest stage (per device): layers / t plus embedding or head.
    layer_params = model.layer_params() / t
    emb_params = model.embedding_params() / t
    head_params = model.head_params() / t + np.where(model.tied_embeddings & (p > 1), model.vocab * h / t, 0.0)
    stage_params = np.where(single, L * layer_params + emb_params + head_params,
                            np.maximum(most * layer_params,
                                       np.maximum(first * layer_params + emb_params, last * layer_params + head_params)))

    is_fp16 = st.dtype_table({"fp16": 1.0}, 0.0) > 0
    gbytes = grad_bytes(is_fp16)
    accumulate = memory_pass_time(stage_params * separate_accumulation_bytes(gbytes), dev)
    stage["bwd_mem"] = stage["bwd_mem"] + np.where(st.grad_fused, 0.0, accumulate.total)

    p2p_bytes = b * s * h * e / t  # scatter-gather optimisation / SP: each TP rank sends 1/t
    p2p = np.where(p > 1, 2.0 * v * (coll.send_recv_time(p2p_bytes, dims, pp_spans) + terms["regather"]), 0.0)

    stage_mb = _total(stage)
    bubble = (p - 1) / v * (stage_mb + p2p)

    dp_exposed = _data_parallel(model, st, dims, dp_spans, pp_spans, stage, stage_params, gbytes, m, t, p, d)
    opt_params = stage_params / np.where(st.zero >= 1, d, 1)
    optimizer = memory_pass_time(opt_params * optimizer_step_bytes(is_fp16), dev).total

    memory, act_per_mb = _memory(model, st, terms, stage_params, first, most, gbytes, m, t, p, v, b, s, e)
    acc = cluster.accelerator
    exp_cap = acc.expansion.capacity if acc.expansion else 0.0
    placed = place(memory, acc.hbm.capacity, exp_cap)
    offload = _offload_time(acc, placed, memory, act_per_mb, m)

    breakdown = {
        "compute": m * (stage["fwd_math"] + stage["bwd_math"] + stage["rec_math"]),
        "memory": m * (stage["fwd_mem"] + stage["bwd_mem"] + stage["rec_mem"]),
        "tp_communication": m * stage["tp"],
        "pp_communication": m * p2p,
        "pipeline_bubble": bubble,
        "dp_communication": dp_exposed,
        "optimizer": optimizer,
        "offload": offload,
    }
    phases = {
        "forward": m * (stage["fwd_math"] + stage["fwd_mem"]),
        "backward": m * (stage["bwd_math"] + stage["bwd_mem"]),
        "recompute": m * (stage["rec_math"] + stage["rec_mem"]),
    }
    model_flops, hw_flops = _flops(model, st, s)
    return StepArrays(
        breakdown=breakdown, phases=phases, memory=memory, memory_total=sum(memory.values()),
        hbm_bytes=placed.hbm, expansion_bytes=placed.expansion, step_time=sum(breakdown.values()),
        model_flops=model_flops, hardware_flops=hw_flops, fits=placed.fits, microbatches=m,
        stage_layers=stage_layers,
    )


def _microbatch_terms(model: Transformer, ctx: Context, st: StrategyArrays) -> dict:
    """Everything that depends only on the micro-batch shape, TP group and dtype, flat by name."""
    layer_w, layer, _ = layer_work(model, ctx, st)
    emb, head = _embedding_and_head(model, ctx.shape, ctx.dev, ctx.dims, ctx.tp_spans)
    shape = ctx.shape
    tokens_h = shape.tokens * model.hidden * shape.e
    terms = {"saved": layer.saved_bytes, "core_saved": layer.attention_core_bytes, "input": layer.input_bytes,
             "tp_message": layer.tp_message_bytes,
             "regather": np.where(shape.sp | (shape.t == 1), 0.0, coll.all_gather_time(tokens_h, ctx.dims, ctx.tp_spans))}
    for prefix, work in (("layer.", layer_w), ("emb.", emb), ("head.", head)):
        terms.update({prefix + k: v for k, v in work.items()})
    return {k: np.broadcast_to(v, st.tp.shape) for k, v in terms.items()}


def _prefixed(terms: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in terms.items() if k.startswith(prefix)}


# (field, bits) packed into one int64 key of what _microbatch_terms depends on.
_KEY_BITS = (("micro_batch", 13), ("tp", 17), ("sequence_parallel", 1), ("flash_attention", 1),
             ("dtype", 3), ("recompute", 2))
_STRIDE_BITS = 26


def _deduplicated(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays, ctx: Context) -> dict:
    """_microbatch_terms, computed once per distinct (micro-batch, TP, SP, flash, dtype, recompute, TP stride).

    A sweep of millions of points has a few hundred distinct micro-batch shapes;
    computing each once and gathering the results is the same math, done less
    often. Falls back to computing every point when a value does not fit the key.
    """
    n = len(st)
    key = np.zeros(n, dtype=np.int64)
    shift = 0
    tp_stride = st.strides()[0]
    for values, bits in [(getattr(st, f), b) for f, b in _KEY_BITS] + [(tp_stride, _STRIDE_BITS)]:
        ints = np.asarray(values).astype(np.int64)
        if n == 0 or ints.min() < 0 or ints.max() >= 2**bits:
            return _microbatch_terms(model, ctx, st)
        key |= ints << shift
        shift += bits
    unique, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    if len(unique) * 4 > n:
        return _microbatch_terms(model, ctx, st)
    sub = st.take(first)
    terms = _microbatch_terms(model, context_of(model, cluster, devices, sub), sub)
    return {k: v[inverse] for k, v in terms.items()}


def _embedding_and_head(model: Transformer, shape: LayerShape, dev: Device, dims, tp_spans):
    """Work of the embedding (first stage) and final norm + LM head + loss (last stage), per micro-batch.

    Embedding: row gather + position add + dropout over b*s*h, vocabulary-parallel
    with an all-reduce (reduce-scatter with SP) of b*s*h*e across TP.
    Head: final norm, GEMM [b*s, h] x [h, V/t], vocabulary-parallel cross
    entropy in fp32 over b*s*V/t logits (read e, write 4 B; backward the reverse).
    """
    tok, h, e, t = shape.tokens, model.hidden, shape.e, shape.t
    emb_f = elementwise_time(shape.norm_tokens * h, 4 * e + 1, 3, dev)
    emb_b = elementwise_time(shape.norm_tokens * h, 3 * e, 1, dev)
    emb_comm = np.where(shape.sp, 0.5, 1.0) * coll.all_reduce_time(tok * h * e, dims, tp_spans)
    zero = KernelTime(np.zeros_like(emb_f.math), np.zeros_like(emb_f.math))
    emb = _work(emb_f, emb_b, zero, emb_comm)

    norm_f = elementwise_time(shape.norm_tokens * h, 2 * e, 8, dev)
    norm_b = elementwise_time(shape.norm_tokens * h, 3 * e, 16, dev)
    vocab = model.vocab / t
    gemm_f = gemm_time(1, tok, vocab, h, shape.gemm_e, dev)
    gemm_b = gemm_time(1, tok, h, vocab, shape.gemm_e, dev) + gemm_time(1, h, vocab, tok, shape.gemm_e, dev)
    loss_f = elementwise_time(tok * vocab, e + FP32, 5, dev)
    loss_b = elementwise_time(tok * vocab, FP32 + e, 2, dev)
    # Input of the column-parallel head: gathered (SP) or all-reduced in backward (no SP).
    head_input = np.where(shape.sp, 2.0 * coll.all_gather_time(tok * h * e, dims, tp_spans),
                          coll.all_reduce_time(tok * h * e, dims, tp_spans))
    loss_comm = 3.0 * coll.all_reduce_time(tok * FP32, dims, tp_spans)
    head = _work(norm_f + gemm_f + loss_f, norm_b + gemm_b + loss_b, zero, head_input + loss_comm)
    return emb, head


def _data_parallel(model, st, dims, dp_spans, pp_spans, stage, stage_params, gbytes, m, t, p, d):
    """Exposed data-parallel communication per step [s].

    ZeRO 0: all-reduce of the gradients; ZeRO 1/2: reduce-scatter of the
    gradients + all-gather of the 16-bit weights (same volume). With overlap,
    the reduction hides behind the backward pass of the last micro-batch
    (bucketed, as PyTorch DDP / Megatron-LM overlap_grad_reduce); otherwise it
    is fully exposed. ZeRO 3 gathers weights before forward and backward and
    reduce-scatters gradients every micro-batch, prefetched behind that
    micro-batch's compute. Tied embeddings with p > 1 add an all-reduce of the
    embedding gradient between the first and last stage.
    """
    grads = stage_params * gbytes
    weights = stage_params * 2.0
    reduce = np.where(st.zero >= 1,
                      coll.reduce_scatter_time(grads, dims, dp_spans) + coll.all_gather_time(weights, dims, dp_spans),
                      coll.all_reduce_time(grads, dims, dp_spans))
    backward_window = stage["bwd_math"] + stage["bwd_mem"] + stage["rec_math"] + stage["rec_mem"]
    step_level = np.where(st.dp_overlap, np.maximum(reduce - backward_window, 0.0), reduce)
    per_mb = 2.0 * coll.all_gather_time(weights, dims, dp_spans) + coll.reduce_scatter_time(grads, dims, dp_spans)
    compute_mb = _total(stage) - stage["tp"]
    zero3 = m * np.maximum(per_mb - compute_mb, 0.0)
    exposed = np.where(d > 1, np.where(st.zero >= 3, zero3, step_level), 0.0)
    tied = model.tied_embeddings & (p > 1)
    emb_sync = np.where(tied, coll.send_recv_time(model.vocab * model.hidden / t * gbytes, dims, pp_spans), 0.0)
    return exposed + emb_sync


def _memory(model, st, terms, stage_params, first, most, gbytes, m, t, p, v, b, s, e):
    """Bytes per device on the busiest stage, by part, and activation bytes per micro-batch."""
    states = model_state_bytes(stage_params, st.dp, st.zero, gbytes, gathered=2.0 * model.layer_params() / t)
    rc = st.recompute
    saved, core, layer_input = terms["saved"], terms["core_saved"], terms["input"]
    per_layer = np.where(rc == 2, layer_input, np.where(rc == 1, saved - core, saved))
    layers_per_stage = np.where(p == 1, model.layers, np.maximum(first, most))
    inflight = inflight_layer_microbatches(layers_per_stage, p, v, m)
    # Transient: the layer being recomputed holds its full activations once.
    working = np.where(rc == 2, saved - layer_input, np.where(rc == 1, core, 0.0))
    logits = np.where(p == 1, b * s * model.vocab / t * (FP32 + e), 0.0)
    activations = inflight * per_layer + working + logits
    buffers = np.where(t > 1, 2.0 * terms["tp_message"], 0.0)
    memory = {"weights": states.weights, "gradients": states.gradients, "optimizer": states.optimizer,
              "activations": activations, "buffers": buffers}
    return memory, layers_per_stage * per_layer


def _offload_time(acc, placed, memory, act_per_mb, m):
    """Exposed traffic to the expansion tier per step [s].

    Optimizer state: read and written once per step (2x). Weights/gradients:
    weights read in forward and backward, gradients written: 3x per micro-batch.
    Activations: the spilled fraction of each micro-batch's activations is
    written in forward and read in backward (2x per micro-batch). Plus one
    access latency per transfer phase.
    """
    if acc.expansion is None:
        return np.zeros_like(placed.hbm)
    bw, lat = acc.expansion.achievable_bandwidth, acc.expansion.latency
    act_fraction = np.where(memory["activations"] > 0, placed.spilled_activations / np.maximum(memory["activations"], 1.0), 0.0)
    traffic = (2.0 * placed.spilled_optimizer + 3.0 * m * placed.spilled_weights
               + 2.0 * m * act_fraction * act_per_mb)
    phases = np.where(placed.spilled_optimizer > 0, 2.0, 0.0) + np.where(placed.expansion > placed.spilled_optimizer, 3.0 * m, 0.0)
    return traffic / bw + phases * lat


def _flops(model: Transformer, st: StrategyArrays, s):
    """Model and hardware FLOPs per iteration (Narayanan et al. 2021, Eq. 3, generalised).

    Per token: 6 * (L * P_matmul + V*h) + 12 * L * s * a*d  (model FLOPs: forward
    and backward of every matrix multiply, including attention scores).
    Hardware FLOPs add the recomputed forward: full 2*L*P_matmul + 4*L*s*a*d,
    selective 2*L*s*a*d (the scores; Korthikanti et al. 2022, Sec. 6).
    """
    a_d = model.attention.heads * model.attention.head_dim
    h, L, V = model.hidden, model.layers, model.vocab
    kv = model.attention.kv_heads * model.attention.head_dim
    ffn_mats = (3 if model.mlp.gated else 2) * h * model.mlp.ffn
    matmul_params = h * (a_d + 2 * kv) + a_d * h + ffn_mats
    tokens = st.global_batch * s
    model_flops = tokens * (6.0 * (L * matmul_params + V * h) + 12.0 * L * s * a_d)
    rc = st.recompute
    extra = np.where(rc == 2, 2.0 * L * matmul_params + 4.0 * L * s * a_d, np.where(rc == 1, 2.0 * L * s * a_d, 0.0))
    return model_flops, model_flops + tokens * extra
