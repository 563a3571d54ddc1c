"""Step 4: one micro-batch's pass through a stage, by kind of work.

Per layer kind (dense and, for MoE models, MoE; cost/layer_work.py), the embedding and the head: kernel times
by phase and the exposed communication inside them, flat by name (``microbatch_terms``: dense.<work>,
emb.<work>, head.<work>, moe.<work>), and the activation bytes one micro-batch keeps on a device
(``activation_terms``). These terms depend on only a few strategy fields, so sweeps compute them once per
distinct micro-batch shape (cost/cache.py: microbatch_terms_grouped).
"""
from __future__ import annotations

import numpy as np

from comet_dse.cost import collectives as coll
from comet_dse.cost.kernels import KernelTime, elementwise_time, gemm_time
from comet_dse.cost.layer_ops import FLOPS_SOFTCAP, NORM_BWD_ELEMENTS
from comet_dse.cost.layer_work import STAGE_KEYS, WORK_KEYS, layer_work, work, work_total
from comet_dse.cost.shapes import ACTIVATION_BYTES, FP32, Context
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import CrossEntropy, Recompute


# Bytes per logit the loss holds at its peak, by --cross-entropy (docs/model.md, "Loss"): Megatron-LM's in-place
# softmax beside the 16-bit logits; Megatron-Core's fused loss (an fp32 copy and fp32 exponentials beside them);
# PyTorch's cross_entropy on fp32-cast logits (log-softmax output, nll and log-softmax gradients); the same under
# PyTorch's loss_parallel (four fp32 tensors in its backward).
LOGIT_BYTES = {CrossEntropy.IN_PLACE: FP32 + ACTIVATION_BYTES, CrossEntropy.FUSED: 2.0 * FP32 + ACTIVATION_BYTES,
               CrossEntropy.FP32_CAST: 3.0 * FP32, CrossEntropy.LOSS_PARALLEL: 4.0 * FP32}


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
    # every layer kind's work first, then the embedding's and the head's (docs/architecture.md, "The cost rooms")
    dense_w, dense = layer_work(model, ctx, st, moe_layer=False)
    if model.moe:   # a dense model's MoE layer would be a copy of the dense one: not stored
        moe_w, moe = layer_work(model, ctx, st, moe_layer=True)
    emb, head = embedding_and_head(model, ctx)
    shape = ctx.shape
    tokens_h = shape.tokens * model.hidden * shape.e
    terms = {"regather": np.where(shape.sp | (shape.t == 1), 0.0,
                                  coll.all_gather_time(tokens_h, ctx.dims, ctx.spans["tp"]))}
    layers, works = [("dense.", dense)], [("dense.", dense_w), ("emb.", emb), ("head.", head)]
    if model.moe:
        layers.append(("moe.", moe))
        works.append(("moe.", moe_w))
    terms.update(activation_terms(model, st, layers))
    for prefix, w in works:
        terms.update({prefix + k: v for k, v in w.items()})
        terms[prefix + "total"] = work_total(w)
    return {k: np.broadcast_to(v, st.tp.shape) for k, v in terms.items()}


def activation_terms(model: Transformer, st: StrategyArrays, layers: list) -> dict:
    """The activation bytes of one micro-batch on one device that depend only on the micro-batch knobs, which
    cost/memory.py (step_memory) combines per candidate stage [bytes].

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
