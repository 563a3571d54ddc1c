"""Parameters held by one device of the busiest pipeline stage, split into shared and expert weights.

Shared weights (attention, dense MLPs, routers, shared experts, norms,
embedding, head) are replicated over data-parallel ranks and split by TP;
routed experts are split over the EP group (E/ep experts per device) and by
TP. The split matters because their gradients are reduced over different
groups (dp vs dp/ep ranks).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.model.spec import Transformer
from comet_dse.strategy import StrategyArrays


@dataclass(frozen=True)
class StageParams:
    """Parameters on one device (arrays over design points)."""

    shared: np.ndarray
    expert: np.ndarray

    @property
    def total(self):
        return self.shared + self.expert


def attention_params_per_device(model: Transformer, t):
    """Attention weights on one TP rank: split projections / t, replicated ones (MLA down projections) whole,
    plus MLA's latent norms (replicated)."""
    total = 0.0
    for proj in model.attention.projections(model.hidden):
        size = proj.n_in * proj.n_out + (proj.n_out if model.bias else 0)
        total = total + (size / t if proj.shard != "none" else size)
    lat = model.attention.latent
    return total + (((lat.q_lora_rank or 0) + lat.kv_lora_rank) if lat else 0)


def stage_candidates(model: Transformer, st: StrategyArrays) -> list:
    """(StageParams, dense layers, MoE layers) of each stage that can be the busiest.

    The first stage (dense layers first, + embedding), a full middle stage, the
    last stage (+ final norm and head; with tied embeddings and p > 1 it keeps
    its own copy of the embedding). With p = 1 every candidate is the whole model.
    """
    from comet_dse.cost.step import stage_layer_counts

    t, p, ep = st.tp, st.pp, st.ep
    L, D = model.layers, model.dense_layers
    norms = 2 * model.norm_params()
    attn = attention_params_per_device(model, t)
    dense_layer = attn + model.mlp_params() / t + norms
    moe_shared = moe_expert = 0.0
    if model.moe:
        moe = model.moe
        shared_ffn = model.ffn_params(moe.shared_ffn) / t if moe.shared_ffn else 0.0
        moe_shared = attn + model.hidden * moe.experts + shared_ffn + norms
        moe_expert = moe.experts / ep * model.ffn_params(moe.ffn) / t
    emb = model.embedding_params() / t
    head = model.head_params() / t + np.where(model.tied_embeddings & (p > 1), model.vocab * model.hidden / t, 0.0)
    first, last, most = stage_layer_counts(L, p)
    single = p == 1
    out = []
    for n_dense, n_moe, extra in (
        (np.minimum(D, first), first - np.minimum(D, first), emb),
        (np.where(D - first >= most, most, 0.0), np.where(D - first >= most, 0.0, most), 0.0),
        (np.maximum(0.0, D - (L - last)), last - np.maximum(0.0, D - (L - last)), head),
    ):
        n_dense = np.where(single, D, n_dense)
        n_moe = np.where(single, L - D, n_moe)
        shared = n_dense * dense_layer + n_moe * moe_shared + np.where(single, emb + head, extra)
        out.append((StageParams(shared=shared, expert=n_moe * moe_expert), n_dense, n_moe))
    return out


def stage_params(candidates: list) -> StageParams:
    """Of ``stage_candidates``, the stage with the most parameters on one device (it sets gradient and optimizer work)."""
    best = candidates[0][0]
    for params, _, _ in candidates[1:]:
        better = params.total > best.total
        best = StageParams(shared=np.where(better, params.shared, best.shared),
                           expert=np.where(better, params.expert, best.expert))
    return best
