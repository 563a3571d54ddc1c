"""One transformer layer decomposed into operators, per device and per micro-batch.

For each operator: forward and backward kernel time (cost/compute.py), the
bytes it saves for backward, and whether selective recomputation drops them.
Shapes follow Megatron-LM tensor parallelism (Shoeybi et al. 2019): QKV and
MLP-up are column-parallel, the output projection and MLP-down row-parallel;
with sequence parallelism (Korthikanti et al. 2022) norms, dropout and
residual adds work on s/t of the tokens.

Symbols: b micro-batch, s sequence, h hidden, a heads, k KV heads, d head
dim, f FFN size, t TP degree, e bytes per activation element.
With a = k, d = h/a, GELU MLP and dropout, the saved bytes reproduce
Korthikanti et al. Eq. (1)-(2): s*b*h*(10 + 24/t + 5*a*s/(h*t)) without SP
and s*b*h/t*(34 + 5*a*s/h) with SP (tests/test_layer.py checks this).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost.compute import (
    Device, KernelTime, elementwise_time, gemm_time, pipeline_efficiency, quantisation_efficiency, roofline,
    zero_time,
)
from comet_dse.model.spec import PositionEmbedding, Transformer

MASK_BYTES = 1.0  # dropout masks are stored as uint8 (PyTorch/Megatron)
FP32 = 4.0

# Vector FLOPs per element of the element-wise kernels (operation counts of the
# usual implementations; they matter only on devices with weak vector units).
FLOPS_NORM, FLOPS_SOFTMAX, FLOPS_DROPOUT, FLOPS_GELU, FLOPS_SWIGLU, FLOPS_ADD, FLOPS_ROPE = 8, 5, 3, 10, 6, 1, 6


@dataclass(frozen=True)
class LayerShape:
    """Per-device sizes of one layer for one micro-batch (arrays over design points)."""

    b: object
    s: object
    t: object
    sp: object
    flash: object
    e: object          # bytes per activation element (2 for bf16/fp16)
    gemm_e: object     # bytes per GEMM input element (1 for fp8)

    @property
    def tokens(self):
        return self.b * self.s

    @property
    def norm_tokens(self):
        """Tokens each device holds in the norm/dropout region: b*s/t with SP, else b*s."""
        return np.where(self.sp, self.tokens / self.t, self.tokens)


@dataclass(frozen=True)
class LayerCost:
    """Per-layer, per-micro-batch costs on one device (arrays over design points)."""

    forward: KernelTime
    backward: KernelTime
    attention_core: KernelTime      # what selective recomputation re-runs
    saved_bytes: np.ndarray         # activations kept for backward (no recomputation)
    attention_core_bytes: np.ndarray  # part of saved_bytes that selective recomputation drops
    input_bytes: np.ndarray         # the layer input (all that full recomputation keeps)
    tp_messages: int                # TP collectives per pass (2: after attention and after MLP)
    tp_message_bytes: np.ndarray    # bytes of each full (unsharded) TP message


def _linear(tokens, n_in, n_out, shape: LayerShape, dev: Device):
    """Forward GEMM and backward (input-gradient + weight-gradient) GEMMs of one linear layer."""
    fwd = gemm_time(1, tokens, n_out, n_in, shape.gemm_e, dev)
    dgrad = gemm_time(1, tokens, n_in, n_out, shape.gemm_e, dev)
    wgrad = gemm_time(1, n_in, n_out, tokens, shape.gemm_e, dev)
    return fwd, dgrad + wgrad


def _pointwise(elements, fwd_bytes, bwd_bytes, flops, dev: Device):
    """Forward and backward element-wise kernels with per-element byte counts."""
    return (elementwise_time(elements, fwd_bytes, flops, dev),
            elementwise_time(elements, bwd_bytes, 2 * flops, dev))


def _attention_core(model: Transformer, shape: LayerShape, dev: Device):
    """Scores, softmax, dropout and attention-over-V for the a/t local heads.

    Standard (materialised) attention: two batched GEMMs of b*a/t x (s x s x d),
    softmax and dropout over b*a/t*s*s elements; saves softmax output (e),
    dropout mask (1 byte) and dropout output (e) per score: 5*a*s^2*b/t bytes
    at e = 2. Flash attention (Dao et al. 2022): one fused kernel, causal blocks
    skipped (half the FLOPs), scores never stored; backward recomputes the
    scores (2.5x the forward FLOPs).
    Returns (forward, backward, saved score bytes).
    """
    a, d, s, e = model.attention.heads, model.attention.head_dim, shape.s, shape.e
    heads = a / shape.t
    batch = shape.b * heads
    scores = batch * s * s
    dropout = model.dropout
    qk = gemm_time(batch, s, s, d, shape.gemm_e, dev)
    av = gemm_time(batch, s, d, s, shape.gemm_e, dev)
    soft_f, soft_b = _pointwise(scores, 2 * e, 3 * e, FLOPS_SOFTMAX, dev)
    drop_f, drop_b = _pointwise(scores, 2 * e + MASK_BYTES, 2 * e + MASK_BYTES, FLOPS_DROPOUT, dev)
    if not dropout:
        drop_f, drop_b = zero_time(np.shape(scores)), zero_time(np.shape(scores))
    std_fwd = qk + soft_f + drop_f + av
    std_bwd = qk.scale(2.0) + soft_b + drop_b + av.scale(2.0)
    std_saved = scores * (e + (MASK_BYTES + e if dropout else 0.0))
    # Flash attention: QK^T and PV fused, causal => half the s x s blocks: 2*b*(a/t)*s^2*d FLOPs;
    # off-chip bytes: Q, K, V read and O written once per head.
    flash_flops = 2.0 * batch * s * s * d
    flash_rate = dev.peak * dev.matmul_eff * quantisation_efficiency(batch, s, d, dev) * pipeline_efficiency(s, dev)
    flash_f = roofline(flash_flops, flash_rate, 4.0 * batch * s * d * e, dev.hbm_bw, dev.overhead)
    flash_b = flash_f.scale(2.5)
    flash = shape.flash
    fwd = KernelTime(np.where(flash, flash_f.math, std_fwd.math), np.where(flash, flash_f.memory, std_fwd.memory))
    bwd = KernelTime(np.where(flash, flash_b.math, std_bwd.math), np.where(flash, flash_b.memory, std_bwd.memory))
    saved = np.where(flash, batch * s * FP32, std_saved)
    return fwd, bwd, saved


def layer_cost(model: Transformer, shape: LayerShape, dev: Device) -> LayerCost:
    """Decompose one layer; see the module docstring for the operator list."""
    h, f = model.hidden, model.mlp.ffn
    a, k, d = model.attention.heads, model.attention.kv_heads, model.attention.head_dim
    t, e, tok = shape.t, shape.e, shape.tokens
    ntok = shape.norm_tokens
    dropout = model.dropout
    q_cols, kv_cols = a * d / t, k * d / t

    norm_f, norm_b = _pointwise(ntok * h, 2 * e, 3 * e, FLOPS_NORM, dev)
    qkv_f, qkv_b = _linear(tok, h, q_cols + 2 * kv_cols, shape, dev)
    core_f, core_b, core_saved = _attention_core(model, shape, dev)
    proj_f, proj_b = _linear(tok, a * d / t, h, shape, dev)
    resid_bytes_f = 3 * e + (MASK_BYTES if dropout else 0.0)
    resid_f, resid_b = _pointwise(ntok * h, resid_bytes_f, resid_bytes_f, FLOPS_DROPOUT + FLOPS_ADD, dev)
    up_cols = (2 * f if model.mlp.gated else f) / t
    up_f, up_b = _linear(tok, h, up_cols, shape, dev)
    act_flops = FLOPS_SWIGLU if model.mlp.gated else FLOPS_GELU
    act_in = 2 if model.mlp.gated else 1
    act_f, act_b = _pointwise(tok * f / t, (act_in + 1) * e, (2 * act_in + 1) * e, act_flops, dev)
    down_f, down_b = _linear(tok, f / t, h, shape, dev)

    forward = norm_f.scale(2) + qkv_f + core_f + proj_f + resid_f.scale(2) + up_f + act_f + down_f
    backward = norm_b.scale(2) + qkv_b + core_b + proj_b + resid_b.scale(2) + up_b + act_b + down_b
    if model.position is PositionEmbedding.ROPE:
        rope_f, rope_b = _pointwise(tok * (q_cols + kv_cols), 2 * e, 2 * e, FLOPS_ROPE, dev)
        forward, backward = forward + rope_f, backward + rope_b

    # Saved activations (bytes), Korthikanti et al. 2022 Sec. 4.1 accounting:
    norm_in = 2 * ntok * h * e                              # inputs of the two norms
    gemm_in = np.where(shape.sp, 2 * ntok * h * e, 2 * tok * h * e)  # QKV and MLP-up inputs (SP: sharded, re-gathered)
    qkv_out = tok * (q_cols + 2 * kv_cols) * e              # Q, K, V
    proj_in = tok * a * d / t * e                           # attention output
    masks = 2 * ntok * h * MASK_BYTES if dropout else 0.0   # two residual dropout masks
    mlp_mid = tok * f / t * e * (act_in + 1)                # activation input(s) and down-proj input
    saved = norm_in + gemm_in + qkv_out + proj_in + masks + mlp_mid + core_saved
    return LayerCost(
        forward=forward, backward=backward, attention_core=core_f,
        saved_bytes=saved, attention_core_bytes=np.where(shape.flash, 0.0, core_saved),
        input_bytes=ntok * h * e, tp_messages=2, tp_message_bytes=tok * h * e,
    )
