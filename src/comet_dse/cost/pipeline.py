"""Step 5: the pipeline: which layers each stage holds, the slowest stage, and what crosses stage boundaries.

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

The slowest candidate stage's work per micro-batch (``stage_work``) and the pipeline send/recv of every
chunk boundary (``pipeline_p2p``) are what the schedule in cost/step.py repeats (m + (p-1)/v) times.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost import collectives as coll
from comet_dse.cost.distinct import gathered, paired_rows
from comet_dse.cost.layer_work import BACKWARD_COMM, STAGE_KEYS
from comet_dse.cost.microbatch_pass import prefixed
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import PipelineSplit


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


def slowest_stage(mixes: list, dense: dict, moe: dict, emb: dict, head: dict) -> dict:
    """Per-micro-batch work of the slowest candidate stage (``mixes``: the layout's stage_mixes; the work
    dicts with their "total", cost/microbatch_pass.py: prefixed).

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


def stage_work(model: Transformer, mixes: list, layouts: tuple, work: tuple) -> dict:
    """``slowest_stage`` of every point (``mixes``: its layout's stage mixes, cost/layout.py: Layout.mixes),
    from the layouts and the micro-batch work terms as grouped (``layouts``: (Layout per group, rows); ``work``:
    (work dicts per group, rows); rows None where not grouped). Its inputs are a layout's stage mixes and a micro-batch shape's work, so where both are
    grouped it is computed once per distinct pair of them and gathered back (cost/distinct.py: paired_rows;
    the same numbers); else per point."""
    (lay_groups, lay_rows), (terms, terms_rows) = layouts, work
    pairs = None
    if lay_rows is not None and terms_rows is not None:
        pairs = paired_rows(lay_rows[1], terms_rows[1], len(lay_rows[0]), len(terms_rows[0]))
    if pairs is None:
        if terms_rows is not None:
            terms = gathered(terms, terms_rows[1])
    else:
        mixes = gathered(lay_groups.mixes, lay_rows[1][pairs[0]])
        terms = gathered(terms, terms_rows[1][pairs[0]])
    dense_w, emb_w, head_w = (prefixed(terms, k) for k in ("dense.", "emb.", "head."))
    moe_w = prefixed(terms, "moe.") if model.moe else dense_w
    stage = slowest_stage(mixes, dense_w, moe_w, emb_w, head_w)
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


def forward_total(stage: dict):
    """Forward seconds of the stage per micro-batch: kernels plus the in-layer communication exposed in forward."""
    return stage["fwd_math"] + stage["fwd_mem"] + stage["tp"] + stage["ep"] + stage["cp"] - stage[BACKWARD_COMM]


def backward_total(stage: dict):
    """Backward (+ recomputation) seconds of the stage per micro-batch, with the communication exposed in them."""
    return stage["bwd_math"] + stage["bwd_mem"] + stage["rec_math"] + stage["rec_mem"] + stage[BACKWARD_COMM]


def pipeline_p2p(st: StrategyArrays, dims: tuple, pp_spans: list, fwd, bwd, regather, nbytes, hidden_too=True):
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
