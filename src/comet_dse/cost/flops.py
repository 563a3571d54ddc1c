"""Step 6, the step's other terms: the work of a step in FLOP, for MFU, HFU and the tier's compute roof.

Model FLOPs (Narayanan et al. 2021, Eq. 3, generalised to GQA, MLA, gated MLPs, MoE and causal attention) and
hardware FLOPs (with recomputation); docs/model.md, "MFU".
"""
from __future__ import annotations

import numpy as np

from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import Recompute


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
    per-layer form of ``step_flops``: forward 2 P_l + 2 k a (d_qk + d_v) per token (k the causal keys per query),
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


def step_flops(model: Transformer, st: StrategyArrays):
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
