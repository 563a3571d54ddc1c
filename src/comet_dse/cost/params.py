"""Which layers each candidate pipeline stage holds, and its parameters on one device.

Layers run dense first (a MoE model's first ``dense_layers``), then MoE. The
stages that can be the slowest or the fullest are: the first (its share of
the dense layers + the embedding), a full middle stage (all dense or all MoE),
and the last (+ final norm and head); with p = 1 the single stage holds
everything. ``stage_mixes`` lists them once for the schedule and the memory.

Parameters are split into shared and expert weights.
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
from comet_dse.strategy.choices import PipelineSplit
from comet_dse.strategy.arrays import StrategyArrays


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
    plus MLA's latent norms (replicated); a QKV projection with fewer KV heads than ranks keeps a whole
    K and V head on each (Attention.tp_share)."""
    total = 0.0
    for proj in model.attention.projections(model.hidden):
        total = total + model.projection_params(proj) * model.attention.tp_share(proj, t)
    return total + model.attention.latent_norm_params()


def stage_layer_counts(layers: int, pp, embedding_slots=0.0):
    """Transformer layers on the first, last and fullest stage.

    Balanced split (embedding_slots = 0): base = floor(L/p) per stage; the
    r = L mod p extra layers go to middle stages first, since the first stage
    also holds the embedding and the last the LM head.
    With the embedding and the loss each taking a layer's slot (embedding_slots
    = 1, Megatron-LM --account-for-embedding/loss-in-pipeline-split): the same
    split of L + 2 slots, then the first and the last stage hold one
    transformer layer fewer than their slots (with p = 1: L).
    """
    slots = layers + 2.0 * embedding_slots
    base = np.floor(slots / pp)
    extra = slots - base * pp
    most = np.where(extra > 0, base + 1, base)
    last = np.where(pp - extra >= 2, base, most) - embedding_slots
    first = np.where(pp - extra >= 1, base, most) - embedding_slots
    single = pp == 1
    return (np.where(single, layers, np.maximum(first, 0.0)), np.where(single, layers, np.maximum(last, 0.0)),
            np.where(single, layers, most))


def layers_per_stage(layers: int, pp: int, slots: int = 0) -> list:
    """Transformer layers on each pipeline stage of one strategy (the export's traces place every stage's layers):
    the first and the last stage as ``stage_layer_counts`` gives them (the one statement of the split rule), the
    layers between them over the middle stages, the extra ones to the earliest, as that rule puts them."""
    first, last, _ = (int(x) for x in stage_layer_counts(layers, pp, float(slots)))
    if pp <= 2:
        return [first, last][:pp]
    base, extra = divmod(layers - first - last, pp - 2)
    return [first] + [base + 1] * extra + [base] * (pp - 2 - extra) + [last]


def embedding_slots(st: StrategyArrays):
    """1 where the embedding and the loss take a layer's slot of the pipeline split, else 0 (per point)."""
    return np.where(st.uses(PipelineSplit.EMBEDDING_LOSS), 1.0, 0.0)


def stage_mixes(model: Transformer, pp, slots=0.0) -> list:
    """(dense layers, MoE layers, holds embedding, holds head) of each candidate stage (arrays over points).

    Candidates: first, full middle (all MoE; MoE models only), full middle (all
    dense), last; with p = 1 every candidate is the whole model. ``slots``:
    ``embedding_slots`` of the points (stage_layer_counts).
    """
    L, D = model.layers, model.dense_layers
    first, last, most = stage_layer_counts(L, pp, slots)
    single = pp == 1
    dense_first = np.minimum(D, first)
    dense_last = np.maximum(0.0, D - (L - last))
    none = np.zeros_like(first)
    mixes = [
        (dense_first, first - dense_first, 1.0, 0.0),
        (none, np.where(L - D >= most, most, 0.0), 0.0, 0.0),
        (np.where(D - first >= most, most, 0.0), none, 0.0, 0.0),
        (dense_last, last - dense_last, 0.0, 1.0),
    ]
    if not model.moe:
        del mixes[1]           # a dense model has no all-MoE stage
    flags = {}          # one array per (whole, constant) pair: the candidates share it (cost/distinct.py gathers it once)

    def pick(whole, part):
        if np.ndim(part):
            return np.where(single, whole, part)
        if (whole, part) not in flags:
            flags[whole, part] = np.where(single, whole, part)
        return flags[whole, part]

    return [tuple(pick(whole, part) for whole, part in zip((D, L - D, 1.0, 1.0), mix)) for mix in mixes]


def stage_candidates(model: Transformer, st: StrategyArrays, mixes: list | None = None) -> list:
    """(StageParams, dense layers, MoE layers) of each candidate stage (``stage_mixes``; ``mixes``: those of
    ``st`` when the caller has them, whose layer counts are then returned as the same arrays).

    The last stage keeps its own copy of the embedding when embeddings are tied
    and p > 1.
    """
    t, p, ep = st.tp, st.pp, st.ep
    norms = model.layer_norm_params()
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
    out = []
    for n_dense, n_moe, with_emb, with_head in mixes or stage_mixes(model, p, embedding_slots(st)):
        shared = n_dense * dense_layer + n_moe * moe_shared + with_emb * emb + with_head * head
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
