"""Step 2: one transformer layer decomposed into operators, per device and per micro-batch.

For each operator: forward and backward kernel time (cost/kernels.py), the
bytes it saves for backward, and whether selective recomputation drops them.
Shapes follow Megatron-LM tensor parallelism (Shoeybi et al. 2019): QKV and
MLP-up are column-parallel, the output projection and MLP-down row-parallel;
with sequence parallelism (Korthikanti et al. 2022) norms, dropout and
residual adds work on s/t of the tokens.

Symbols: b micro-batch, s sequence, h hidden, a heads, k KV heads, d head
dim, f FFN size, t TP degree, e bytes per activation element.
With a = k, d = h/a, GELU MLP and dropout, the saved bytes reproduce
Korthikanti et al. Eq. (2) and (4): s*b*h*(10 + 24/t + 5*a*s/(h*t)) without SP
and s*b*h/t*(34 + 5*a*s/h) with SP (tests/test_layer.py checks this).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost.kernels import (
    Device, KernelTime, attention_rate, elementwise_time, gemm_time, roofline, zero_time,
)
from comet_dse.cost.shapes import FP32, LayerShape, fp8_of
from comet_dse.model.spec import MLPKind, PositionEmbedding, Transformer


MASK_BYTES = 1.0  # dropout masks are stored as uint8 (PyTorch/Megatron)


# Norm backward reads the output gradient and the input twice, once in the
# input-gradient kernel (which writes dx) and once in the scale/bias-gradient
# kernel: 5 element reads/writes (Apex FusedLayerNorm and PyTorch's native
# layer_norm_backward both run these as separate kernels).
NORM_BWD_ELEMENTS = 5


# Vector FLOPs per element of the element-wise kernels (operation counts of the
# usual implementations; they matter only on devices with weak vector units).
FLOPS_NORM, FLOPS_SOFTMAX, FLOPS_DROPOUT, FLOPS_GELU, FLOPS_SWIGLU, FLOPS_ADD, FLOPS_ROPE = 8, 5, 3, 10, 6, 1, 6


FLOPS_GEGLU = FLOPS_GELU + 1   # GELU(gate) * up


# Soft-capping c tanh(x / c): divide, tanh as 1 - 2 / (exp(2y) + 1) (multiply, exp, add, divide,
# subtract), multiply.
FLOPS_SOFTCAP = 7


@dataclass(frozen=True)
class LayerCost:
    """Per-layer, per-micro-batch costs on one device (arrays over design points)."""

    forward: KernelTime
    backward: KernelTime
    attention_core: KernelTime      # what selective recomputation re-runs
    saved_bytes: np.ndarray         # activations kept for backward (no recomputation)
    attention_core_bytes: np.ndarray  # part of saved_bytes that selective recomputation drops
    input_bytes: np.ndarray         # the layer input (all that full recomputation keeps)
    tp_messages: object             # TP all-reduces in forward (2: after attention and after MLP)
    tp_message_bytes: np.ndarray    # bytes of each full (unsharded) TP message
    moe: bool = False               # a MoE layer: dispatch and combine all-to-alls in every pass
    a2a_bytes: object = 0.0         # bytes each device sends in one all-to-all
    cp_kv_bytes: object = 0.0       # K and V bytes passed to the next CP rank at each ring step
    tp_gemm_forward: object = 0.0   # forward time of the GEMMs next to the TP collectives (_Block)
    tp_gemm_backward: object = 0.0  # their backward (input- and weight-gradient) time
    tp_messages_backward: object = 2.0  # TP all-reduces in backward (Transformer.tp_operators)
    attention_core_backward: object = 0.0   # the core's backward kernels (KernelTime): what the CP ring hides behind


# Transformer Engine's fp8 passes (delayed scaling, TE 1.x; docs/model.md, "The fp8 recipe's own kernels"):
# the fp8 GEMMs on Hopper take both operands K-major, so the weight-gradient GEMM needs the input and the
# output gradient transposed. Bytes per element:
FP8_CAST_TRANSPOSE = 4.0   # fp8_cast_transpose(_bgrad)_fused: read the 16-bit tensor (2), write fp8 and its
                           # transpose (1 + 1); the bias gradient is reduced in the same pass


                           # transpose (1 + 1); the bias gradient is reduced in the same pass
FP8_TRANSPOSE = 2.0        # fp8_transpose of an input a fused kernel already wrote in fp8: read 1, write 1


def _linear(tokens, n_in, n_out, shape: LayerShape, dev: Device, batch=1, fused_input=False, fused_grad=False):
    """Forward GEMM and backward (input-gradient + weight-gradient) GEMMs of one linear layer.

    In fp8 training (GEMM inputs of 1 byte) Transformer Engine casts each
    GEMM's 16-bit operands to fp8 and transposes them for the weight-gradient
    GEMM, in one pass per tensor where no other kernel does it:
    - the input: ``fp8_cast_transpose_fused`` in forward (read 2, write 1 + 1
      bytes per element), or, when the kernel producing it writes fp8 itself
      (``fused_input``: a LayerNorm fused into the layer, LayerNormLinear and
      LayerNormMLP, or the MLP activation, TE's fused activation-cast), only
      ``fp8_transpose`` of that fp8 output in backward (read 1, write 1);
    - the output gradient in backward: ``fp8_cast_transpose_bgrad_fused``
      (read 2, write 1 + 1, the bias gradient reduced in the same pass), or
      nothing when the activation's backward writes it in fp8 and transposed
      (``fused_grad``: TE's dgelu/dswiglu-cast-transpose for the MLP's up
      projection).
    The weights are cast once per step (cost/optimizer.py: FP8_WEIGHT_CAST_BYTES);
    the amax all-reduce per model chunk is a strategy knob (cost/data_parallel.py: amax_reduction).
    Source: TransformerEngine transformer_engine/pytorch/module/{linear,
    layernorm_linear,layernorm_mlp}.py (TE 1.x) and its cpp_extensions
    (cast_transpose, fp8_transpose, dgelu_cast_transpose_bgrad).
    """
    fwd = gemm_time(batch, tokens, n_out, n_in, shape.gemm_e, dev)
    dgrad = gemm_time(batch, tokens, n_in, n_out, shape.gemm_e, dev)
    wgrad = gemm_time(batch, n_in, n_out, tokens, shape.gemm_e, dev)
    fp8 = fp8_of(shape)
    inputs = batch * tokens * n_in
    cast_f = elementwise_time(inputs, FP8_CAST_TRANSPOSE, 2, dev).scale(fp8 * (not fused_input))
    transpose_b = elementwise_time(inputs, FP8_TRANSPOSE, 0, dev).scale(fp8 * fused_input)
    cast_b = elementwise_time(batch * tokens * n_out, FP8_CAST_TRANSPOSE, 2, dev).scale(fp8 * (not fused_grad))
    return fwd + cast_f, dgrad + wgrad + cast_b + transpose_b


def _bias_grad(rows, n_out, shape: LayerShape, dev: Device, batch=1) -> KernelTime:
    """Backward of a bias: a reduction of the output gradient over the ``rows`` it was
    added to, one read of rows x n_out elements of e bytes [s] (zero when rows = 0)."""
    return elementwise_time(batch * rows * n_out, shape.e, 1, dev).scale(np.where(rows > 0, 1.0, 0.0))


def _bias_rows(biased: bool, shape: LayerShape, shard: str):
    """Rows a projection's bias is added to: 0 without a bias; the SP-sharded
    token count for row-parallel layers (bias added after the reduction), else all tokens."""
    if not biased:
        return 0.0
    return shape.norm_tokens if shard == "in" else shape.tokens


@dataclass(frozen=True)
class _Block:
    """One block of a layer (attention, feed-forward, MoE) on one device, per micro-batch.

    forward, backward: kernel times; saved: bytes kept for backward;
    tp_gemm_forward, tp_gemm_backward: seconds of its GEMMs that a TP collective
    feeds or drains (the TP-split projections), which a chunked collective can
    be pipelined with (cost/microbatch_pass.py: _pipelined).
    """

    forward: KernelTime
    backward: KernelTime
    saved: object
    tp_gemm_forward: object = 0.0
    tp_gemm_backward: object = 0.0


def _pointwise(elements, fwd_bytes, bwd_bytes, flops, dev: Device):
    """Forward and backward element-wise kernels with per-element byte counts."""
    return (elementwise_time(elements, fwd_bytes, flops, dev),
            elementwise_time(elements, bwd_bytes, 2 * flops, dev))


def _attention_core(model: Transformer, shape: LayerShape, dev: Device, flash_keys=None):
    """Scores, softmax, dropout and attention-over-V for the a/t local heads.

    ``flash_keys``: keys per query a causal flash kernel visits, as a full-row
    equivalent (``causal_window_keys`` for a sliding window; None: s_k).

    Each device holds s_q = s/cp queries and attends to all s_k = s keys (with
    context parallelism the keys arrive chunk by chunk over the ring).
    Standard (materialised) attention: batched GEMMs of b*a/t x (s_q x s_k x d_qk)
    and (s_q x d_v x s_k), softmax and dropout over b*a/t*s_q*s_k elements;
    saves softmax output (e), dropout mask (1 byte) and dropout output (e) per
    score: 5*a*s^2*b/t bytes at e = 2 and cp = 1. The context comes out of the
    batched GEMM as [b, a/t, s, d_v] and is copied to the [s, b, a/t*d_v]
    layout of the output projection (read + write, 2e per element), and its
    gradient is made contiguous again in backward (Megatron-LM CoreAttention).
    Flash attention (Dao et al. 2022): one fused kernel, causal blocks skipped
    (half the FLOPs), scores never stored; backward recomputes the scores
    (2.5x the forward FLOPs). It runs at the fused kernel's own rate
    (compute.attention_rate: the accelerator's attention_efficiency for the
    chosen kernel, forward and backward apart), in 16-bit also in fp8
    training (Transformer Engine's fp8 recipe covers the linear layers).
    Returns (forward, backward, saved score bytes).
    """
    att = model.attention
    dk, dv, e = att.qk_dim, att.v_dim, shape.e
    s_q, s_k = shape.s / shape.cp, shape.s
    batch = shape.b * att.heads / shape.t
    scores = batch * s_q * s_k
    dropout = model.dropout
    dev16 = dev.sixteen_bit()     # the score GEMMs stay 16-bit in fp8 training
    qk = gemm_time(batch, s_q, s_k, dk, e, dev16)
    av = gemm_time(batch, s_q, dv, s_k, e, dev16)
    soft_f, soft_b = _pointwise(scores, 2 * e, 3 * e, FLOPS_SOFTMAX, dev)
    drop_f, drop_b = _pointwise(scores, 2 * e + MASK_BYTES, 2 * e + MASK_BYTES, FLOPS_DROPOUT, dev)
    if not dropout:
        drop_f, drop_b = zero_time(np.shape(scores)), zero_time(np.shape(scores))
    layout = elementwise_time(shape.b * s_q * att.heads / shape.t * dv, 2 * e, 0, dev)
    std_fwd = qk + soft_f + drop_f + av + layout
    std_bwd = qk.scale(2.0) + soft_b + drop_b + av.scale(2.0) + layout
    std_saved = scores * (e + (MASK_BYTES + e if dropout else 0.0))
    # Flash attention: QK^T and PV fused, causal => half the blocks: b*(a/t)*s_q*s_k*(d_qk + d_v) FLOPs;
    # off-chip bytes: Q, K, V read and O written once per head.
    flash_flops = batch * s_q * (s_k if flash_keys is None else flash_keys) * (dk + dv)
    flash_bytes = batch * (s_q + s_k) * (dk + dv) * e
    flash_f = roofline(flash_flops, attention_rate(batch, s_q, s_k, dv, dev.attn_fwd, dev), flash_bytes,
                       dev.hbm_bw, dev.overhead)
    # Backward: 2.5x the FLOPs; reads Q, K, V, O, dO and writes dQ, dK, dV: twice the forward's bytes.
    flash_b = roofline(2.5 * flash_flops, attention_rate(batch, s_q, s_k, dv, dev.attn_bwd, dev), 2.0 * flash_bytes,
                       dev.hbm_bw, dev.overhead)
    flash = shape.flash
    fwd = KernelTime(np.where(flash, flash_f.math, std_fwd.math), np.where(flash, flash_f.memory, std_fwd.memory))
    bwd = KernelTime(np.where(flash, flash_b.math, std_bwd.math), np.where(flash, flash_b.memory, std_bwd.memory))
    saved = np.where(flash, batch * s_q * FP32, std_saved)
    return fwd, bwd, saved


def causal_window_keys(s, w):
    """Keys per query, as a full-row equivalent, that a causal kernel visits with a sliding window w [tokens].

    Query i attends to min(i + 1, w) keys: s w - w^2 / 2 scores for w <= s
    (continuous form) against s^2 / 2 without a window. A causal kernel that
    computes s_q k / 2 scores per head therefore has k = w (2 - w/s); k = s
    when w >= s. FlashAttention skips the key blocks outside the window
    (window_size, since 2.3), so its FLOPs scale with k.
    """
    w = np.minimum(w, s)
    return w * (2.0 - w / s)


def _softcap_scores(model: Transformer, shape: LayerShape, dev: Device, flash_keys=None):
    """Attention logit soft-capping c tanh(x / c) on the scores (Gemma 2's attn_logit_softcapping).

    Standard attention: one fused element-wise pass over the b (a/t) s_q s_k
    materialised scores (read and write e; backward reads the gradient and the
    capped scores and writes the gradient, 3e), which keeps the capped scores
    (e per score) for backward; eager PyTorch runs it as three kernels
    (divide, tanh, multiply), XLA and torch.compile fuse them.
    Flash attention applies it inside the kernel (FlashAttention >= 2.6,
    ``softcap``) to the b (a/t) s_q k / 2 scores it computes (k =
    ``flash_keys`` or s): FLOPS_SOFTCAP vector FLOPs per score in forward and
    twice that in backward (the scores are recomputed and the tanh
    differentiated), assumed not to overlap the kernel's matrix work; no bytes.
    Zero without soft-capping. Returns (forward, backward, saved bytes).
    """
    att = model.attention
    batch = shape.b * att.heads / shape.t
    s_q, e = shape.s / shape.cp, shape.e
    scores = batch * s_q * shape.s
    if not model.attn_logit_softcap:
        return zero_time(np.shape(scores)), zero_time(np.shape(scores)), np.zeros(np.shape(scores))
    std_f, std_b = _pointwise(scores, 2 * e, 3 * e, FLOPS_SOFTCAP, dev)
    computed = batch * s_q * (shape.s if flash_keys is None else flash_keys) / 2.0
    flash_math = computed * FLOPS_SOFTCAP / dev.vector
    flash, zero = shape.flash, np.zeros(np.shape(scores))
    fwd = KernelTime(np.where(flash, flash_math, std_f.math), np.where(flash, zero, std_f.memory))
    bwd = KernelTime(np.where(flash, 2.0 * flash_math, std_b.math), np.where(flash, zero, std_b.memory))
    return fwd, bwd, np.where(flash, zero, scores * e)


def _attention_core_layers(model: Transformer, shape: LayerShape, dev: Device):
    """The attention core (with soft-capping) of the average layer [s, s, bytes].

    Layers with a sliding window (share f_w = ``window_fraction``) run the core
    with k = ``causal_window_keys(s, w)``, the others with k = s:
        X = (1 - f_w) X(s) + f_w X(k)   for forward, backward and saved bytes.
    A stage sums its layers, so this is exact when its share of windowed layers
    is the model's (Gemma 2 alternates: within one layer per stage). Only flash
    attention skips keys outside the window; standard attention computes and
    masks every score (Megatron-LM CoreAttention, Hugging Face eager attention).
    """
    def core(keys):
        f, b, saved = _attention_core(model, shape, dev, keys)
        cap_f, cap_b, cap_saved = _softcap_scores(model, shape, dev, keys)
        return f + cap_f, b + cap_b, saved + cap_saved

    full = core(None)
    f_w = model.window_fraction
    if not f_w:
        return full
    local = core(causal_window_keys(shape.s, model.sliding_window))
    return (full[0].scale(1.0 - f_w) + local[0].scale(f_w), full[1].scale(1.0 - f_w) + local[1].scale(f_w),
            (1.0 - f_w) * full[2] + f_w * local[2])


def _attention(model: Transformer, shape: LayerShape, dev: Device):
    """Attention projections (as Projection list), RoPE and the core.

    Saved: the inputs of projections that do not read the norm output (MLA's
    up projections), Q/K/V for the scores, the input of the output projection,
    and the core's score tensors. Backward assembles the gradients of the
    Q, K and V views back into the fused QKV output (a concatenation: read and
    write 2e per Q/K/V element). The TP-adjacent GEMMs are the projections
    split over TP (QKV or MLA's up projections, and the output projection).
    Each rank holds a/t query heads and kv = ``kv_heads_per_rank(t)`` K and V
    heads (max(k/t, 1): multi-query attention replicates its one KV head).
    Returns (_Block, core forward time, core backward time, core saved bytes, K/V bytes per CP step).
    """
    h, t, e, tok = model.hidden, shape.t, shape.e, shape.tokens
    att = model.attention
    kv = att.kv_heads_per_rank(t)
    fwd, bwd = zero_time(np.shape(tok)), zero_time(np.shape(tok))
    saved = tp_f = tp_b = 0.0
    for proj in att.projections(h):
        share = att.tp_share(proj, t)
        n_in = proj.n_in * share if proj.shard == "in" else proj.n_in
        n_out = proj.n_out * share if proj.shard == "out" else proj.n_out
        f, b = _linear(tok, n_in, n_out, shape, dev, fused_input=proj.shard == "out")
        rows = _bias_rows(model.projection_bias(proj), shape, proj.shard)
        fwd, bwd = fwd + f, bwd + b + _bias_grad(rows, n_out, shape, dev).scale(1.0 - fp8_of(shape))
        if proj.shard in ("in", "out"):
            tp_f, tp_b = tp_f + f.total, tp_b + b.total
        if proj.shard == "in" or proj.n_in != h:
            saved = saved + tok * n_in * shape.gemm_e   # MLA up projections' and the output projection's input
    core_f, core_b, core_saved = _attention_core_layers(model, shape, dev)
    qkv = tok * att.heads / t * (2 * att.qk_dim + att.v_dim) if att.latent else \
        tok * (att.heads / t + 2 * kv) * att.head_dim
    bwd = bwd + elementwise_time(qkv, 2 * e, 0, dev)
    if model.position is PositionEmbedding.ROPE:
        rope_dim = att.latent.qk_rope_head_dim if att.latent else att.head_dim
        rope_f, rope_b = _pointwise(tok * (att.heads / t + kv) * rope_dim, 2 * e, 2 * e, FLOPS_ROPE, dev)
        fwd, bwd = fwd + rope_f, bwd + rope_b
    kv_bytes = tok * kv * (att.qk_dim + att.v_dim) * e
    block = _Block(fwd + core_f, bwd + core_b, saved + qkv * e + core_saved, tp_f, tp_b)
    return block, core_f, core_b, core_saved, kv_bytes


def _ffn(tokens, ffn, model: Transformer, shape: LayerShape, dev: Device, experts=1, routed=False,
         fused=True) -> _Block:
    """A (possibly batched, one per local expert) feed-forward block on ``tokens`` rows each; FFN split over t.

    Up (gate and up for SwiGLU), activation, down. Saved: the activation's
    input(s) and the down projection's input. Routed experts also scale each
    row by its router probability after the activation (Megatron-Core
    experts.py / mlp.py: intermediate_parallel * permuted_probs); a gated
    activation fuses it (weighted_bias_swiglu_impl), a non-gated one is a
    separate multiply that keeps the activation's output too: one more e per
    element saved; 2e per element forward (read, write) and 4e backward (the
    gradient read twice, for the input's gradient and the probability's row
    sum, the kept output read, the input's gradient written). Biases of routed experts are
    added to their own ``tokens`` rows; a dense block's as ``_bias_rows`` says.
    Up and down are TP-adjacent GEMMs, except for routed experts, which sit
    behind the expert all-to-all instead. ``fused``: in fp8, the block is
    Transformer Engine's LayerNormMLP (the norm, the activation and its
    backward write fp8 themselves, ``_linear``); experts (TE GroupedLinear
    after the token permutation) cast their inputs and gradients separately.
    """
    h, t, e = model.hidden, shape.t, shape.e
    up_cols = (2 * ffn if model.mlp.gated else ffn) / t
    up_rows, down_rows = _bias_rows(model.mlp_biased, shape, "out"), _bias_rows(model.mlp_biased, shape, "in")
    if routed:
        up_rows = down_rows = tokens if model.mlp_biased else 0.0
    up_f, up_b = _linear(tokens, h, up_cols, shape, dev, batch=experts, fused_input=fused, fused_grad=fused)
    act_flops = {MLPKind.SWIGLU: FLOPS_SWIGLU, MLPKind.GEGLU: FLOPS_GEGLU}.get(model.mlp.kind, FLOPS_GELU)
    act_in = 2 if model.mlp.gated else 1
    act_f, act_b = _pointwise(experts * tokens * ffn / t, (act_in + 1) * e, (2 * act_in + 1) * e, act_flops, dev)
    down_f, down_b = _linear(tokens, ffn / t, h, shape, dev, batch=experts, fused_input=fused)
    biases = (_bias_grad(up_rows, up_cols, shape, dev, experts)
              + _bias_grad(down_rows, h, shape, dev, experts)).scale(1.0 - fp8_of(shape))
    saved = experts * tokens * ffn / t * (e * act_in + shape.gemm_e)   # activation input; down projection's input
    if routed and not model.mlp.gated:     # the separate probability multiply keeps the activation's output
        scale_f, scale_b = _pointwise(experts * tokens * ffn / t, 2 * e, 4 * e, 1, dev)
        act_f, act_b = act_f + scale_f, act_b + scale_b
        saved = saved + experts * tokens * ffn / t * e
    adjacent = 0.0 if routed else 1.0
    return _Block(up_f + act_f + down_f, up_b + act_b + down_b + biases, saved,
                  adjacent * (up_f.total + down_f.total), adjacent * (up_b.total + down_b.total))


def moe_block(model: Transformer, shape: LayerShape, dev: Device):
    """Router, routed experts sharded over the EP group, shared experts; (_Block, all-to-all bytes).

    Router: [tokens, h] x [h, E], fp32 softmax/top-k over tokens*E scores.
    The busiest device of the EP group holds E/ep experts and receives
    tokens * top_k * imbalance token copies: a batched GEMM of E/ep experts of
    tokens * top_k * imbalance * ep / E rows each, FFN split over t.
    Dispatch and combine all-to-alls move (tokens/t) * top_k * imbalance * h * e
    bytes per device each (tokens split over the TP ranks for dispatch).
    The shared experts' GEMMs are the TP-adjacent ones.
    """
    moe, h, e, tok, t = model.moe, model.hidden, shape.e, shape.tokens, shape.t
    router_f, router_b = _linear(tok, h, moe.experts, shape, dev)
    gate_f, gate_b = _pointwise(tok * moe.experts, e + FP32, 2 * FP32, FLOPS_SOFTMAX, dev)
    local = moe.experts / shape.ep
    rows = tok * moe.top_k * shape.imbalance
    routed = _ffn(rows / local, moe.ffn, model, shape, dev, experts=local, routed=True, fused=False)
    perm_f, perm_b = _token_permutation(tok / t, moe.top_k, rows, local, h, e, shape.dispatcher, dev)
    block = _Block(router_f + gate_f + routed.forward + perm_f, router_b + gate_b + routed.backward + perm_b,
                   routed.saved + rows * h * e + tok * moe.experts * FP32)
    if moe.shared_ffn:
        shared = _ffn(tok, moe.shared_ffn, model, shape, dev, fused=False)
        block = _Block(block.forward + shared.forward, block.backward + shared.backward, block.saved + shared.saved,
                       shared.tp_gemm_forward, shared.tp_gemm_backward)
    return block, tok / t * moe.top_k * shape.imbalance * h * e


DISPATCHER_ALLTOALL, DISPATCHER_FLEX = 0, 1     # MoeDispatcher codes (strategy/choices.py); 2, fused, has no passes


def _token_permutation(sent, top_k, received, local, h, e, dispatcher, dev: Device):
    """Memory passes that put a MoE layer's tokens in expert order and back, forward and backward [s].

    ``sent``: tokens the device routes (tokens / t, the sequence-parallel share); ``received``: rows its local
    experts get (tokens x top_k x imbalance); ``local``: experts on the device. Bytes per element of h e, as
    the dispatchers of Megatron-Core run them (megatron/core/transformer/moe/token_dispatcher.py, moe_utils.py):
    - alltoall: permute (read and write top_k x sent rows: 2 k S), the received chunks sorted by local expert
      when it holds more than one (sort_chunks_by_idxs: read and write, 2 R), and after the experts the reverse
      sort (2 R) and the unpermute, a scatter-add of the k S rows weighted by their probabilities into S rows
      ((k + 1) S):  (3 k + 1) S + 4 R [local > 1]
    - flex (DeepEP): the received rows permuted into expert order (2 R) and unpermuted before the combine
      (2 R):  4 R
    - fused: 0 (the dispatch and combine kernels write and read expert order themselves).
    Backward moves the same bytes the other way (each gather's gradient is a scatter and vice versa).
    """
    alltoall = (3.0 * top_k + 1.0) * sent + 4.0 * received * (local > 1)
    flex = 4.0 * received
    rows = np.where(dispatcher == DISPATCHER_ALLTOALL, alltoall, np.where(dispatcher == DISPATCHER_FLEX, flex, 0.0))
    passes = elementwise_time(rows * h, e, 0.0, dev).scale(np.where(rows > 0, 1.0, 0.0))
    return passes, passes


def _tp_messages(model: Transformer, shape: LayerShape):
    """TP all-reduces of b s h e bytes per layer in forward and in backward (all-reduce equivalents).

    From Megatron-LM's f and g operators (``Transformer.tp_operators``): without
    SP, forward all-reduces at each g and backward at each f; with SP each f is
    an all-gather (forward) / reduce-scatter (backward) and each g a
    reduce-scatter / all-gather, half an all-reduce each, so both passes move
    (f + g) / 2. Sequential blocks: 2 and 2; parallel residual with one norm:
    1 and 1; with a norm per branch (GPT-NeoX): 1 and 2 (1.5 and 1.5 with SP).
    """
    f_ops, g_ops = model.tp_operators
    sp_pass = (f_ops + g_ops) / 2.0
    return np.where(shape.sp, sp_pass, float(g_ops)), np.where(shape.sp, sp_pass, float(f_ops))


def layer_cost(model: Transformer, shape: LayerShape, dev: Device, moe_layer: bool = False) -> LayerCost:
    """Decompose one layer (dense, or MoE when ``moe_layer``); see the module docstring.

    norms_per_layer norms run in each pass. Saved for backward: the input of
    every norm (with parallel residual all norms read the layer input, kept
    once) and the inputs of the attention and MLP blocks (one tensor when a
    parallel layer's single norm feeds both).
    """
    h, e, tok = model.hidden, shape.e, shape.tokens
    ntok = shape.norm_tokens
    dropout = model.dropout

    norm_f, norm_b = _pointwise(ntok * h, 2 * e, NORM_BWD_ELEMENTS * e, FLOPS_NORM, dev)
    att, core_f, core_b, core_saved, kv_bytes = _attention(model, shape, dev)
    resid_bytes_f = 3 * e + (MASK_BYTES if dropout else 0.0)
    resid_f, resid_b = _pointwise(ntok * h, resid_bytes_f, resid_bytes_f, FLOPS_DROPOUT + FLOPS_ADD, dev)
    if moe_layer and model.moe:
        mlp, a2a = moe_block(model, shape, dev)
    else:
        mlp, a2a = _ffn(tok, model.mlp.ffn, model, shape, dev), 0.0
    norms = model.norms_per_layer
    forward = norm_f.scale(norms) + att.forward + resid_f.scale(2) + mlp.forward
    backward = norm_b.scale(norms) + att.backward + resid_b.scale(2) + mlp.backward

    # Saved activations (bytes), Korthikanti et al. 2022 Sec. 4.1 accounting. In fp8 training the
    # inputs of the linear layers are kept as the fp8 copies their GEMMs read (gemm_e = 1 byte):
    # Transformer Engine's Linear, LayerNormLinear and LayerNormMLP save the fp8-cast input for the
    # weight-gradient GEMM; attention's Q, K, V and the norms' inputs stay 16-bit.
    norm_inputs = 1 if model.parallel_residual else norms
    block_inputs = 1 if model.parallel_residual and norms == 1 else 2
    norm_in = norm_inputs * ntok * h * e                    # inputs of the norms (two pre-norms: 2)
    gemm_in = block_inputs * ntok * h * shape.gemm_e        # attention and MLP inputs (SP: sharded, re-gathered)
    masks = 2 * ntok * h * MASK_BYTES if dropout else 0.0   # two residual dropout masks
    saved = norm_in + gemm_in + att.saved + masks + mlp.saved
    tp_fwd, tp_bwd = _tp_messages(model, shape)
    return LayerCost(
        forward=forward, backward=backward, attention_core=core_f, attention_core_backward=core_b,
        saved_bytes=saved, attention_core_bytes=np.where(shape.flash, 0.0, core_saved),
        input_bytes=ntok * h * e, tp_messages=tp_fwd, tp_messages_backward=tp_bwd, tp_message_bytes=tok * h * e,
        moe=bool(moe_layer and model.moe), a2a_bytes=a2a, cp_kv_bytes=kv_bytes,
        tp_gemm_forward=att.tp_gemm_forward + mlp.tp_gemm_forward,
        tp_gemm_backward=att.tp_gemm_backward + mlp.tp_gemm_backward,
    )
