"""What one training step is made of, per rank: the layers, their times from the cost model, the groups.

``plan_of`` reads the cost model's per-micro-batch terms (cost/microbatch_pass.py: microbatch_terms, the same
terms ``estimate`` combines) and its layout (cost/cache.py: layout_of), and lays the model out on the
devices as comet-dse does: TP innermost unless the placement says otherwise (StrategyArrays.strides),
pipeline stages holding the layer counts of cost/pipeline.py, interleaved chunks of L / (p v) layers (with the
embedding-loss split, (L + 2) / (p v) slots, the first and the last chunk one layer fewer: ``chunk_layers_of``).
A mixture-of-experts model runs its first ``dense_layers`` layers dense, the rest MoE (cost/pipeline.py: layers
run dense first); each kind's kernels are the cost model's terms of that kind (dense.*, moe.*).
Nothing here costs anything itself: the FLOP counts a Chakra node carries are the cost model's own
(cost/flops.py: dense_layer_flops, per device; a MoE layer's from the same matrix-multiply weights
cost/flops.py counts), so that a simulator's roofline mode sees the same work; the expert all-to-alls carry
the bytes cost/layer_work.py: expert_exchange_time charges.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from comet_dse.base.errors import InputError
from comet_dse.cost.cache import layout_of
from comet_dse.cost.flops import dense_layer_flops
from comet_dse.cost.layer_ops import layer_cost, moe_block
from comet_dse.cost.layer_work import expert_exchange_bytes
from comet_dse.cost.memory import grad_bytes
from comet_dse.cost.microbatch_pass import microbatch_terms
from comet_dse.cost.pipeline import attention_params_per_device, layers_per_stage
from comet_dse.cost.shapes import ACTIVATION_BYTES, context_of
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import (Dtype, GradBuffer, GradPrecision, PipelineEngine, PipelineSplit,
                                        Recompute)
from comet_dse.strategy.declared import Strategy

LOSS_BYTES = 4.0    # the vocabulary-parallel cross entropy's fp32 all-reduces (cost/microbatch_pass.py: embedding_and_head)


@dataclass(frozen=True)
class Work:
    """One compute node's work on one device for one micro-batch: seconds, FLOP."""

    seconds: float
    flops: float


@dataclass(frozen=True)
class Where:
    """One device's place in the job: TP index, CP index, pipeline stage, DP index."""

    tp: int
    cp: int
    pp: int
    dp: int


@dataclass(frozen=True)
class Plan:
    """One step of one strategy, per micro-batch and device, as the trace writer needs it (SI units).

    layer_f, layer_b: one dense transformer layer's forward and backward (with its recomputation) kernels;
    moe_f, moe_b: one MoE layer's (router, token permutation, experts; equal to the dense ones for a dense
    model); dense_layers: how many of the first layers are dense (all of a dense model's);
    emb_f, emb_b, head_f, head_b: the embedding and the final norm + head + loss;
    accumulate: a separate gradient accumulation pass per micro-batch (0 when fused);
    optimizer: the optimizer step [s]; weight_cast: fp8's once-per-step weight cast [s];
    tp_bytes: one TP message (b s h e); p2p_bytes: one pipeline transfer per rank; loss_bytes: each of the
    loss's three all-reduces; chunk_layers[s][c]: layers of chunk c on stage s; grad_bytes_per_param: 4
    (fp32 main gradients) or 2; layer_params, emb_params, head_params: parameters per device;
    moe_shared_params, moe_expert_params: a MoE layer's parameters per device reduced over the DP group
    (attention, router, shared experts, norms) and over the expert-DP group (its E/ep routed experts);
    dispatch_bytes, combine_bytes: comm_size of a MoE layer's dispatch and combine all-to-all (each rank's
    whole buffer); kv_bytes: the K and V one CP rank passes per ring step (cost/layer_ops.py: cp_kv_bytes).
    """

    model: Transformer
    strategy: Strategy
    devices: int
    microbatches: int
    layer_f: Work
    layer_b: Work
    moe_f: Work
    moe_b: Work
    dense_layers: int
    emb_f: Work
    emb_b: Work
    head_f: Work
    head_b: Work
    accumulate: float
    optimizer: float
    weight_cast: float
    tp_bytes: float
    p2p_bytes: float
    loss_bytes: float
    chunk_layers: tuple
    grad_bytes_per_param: float
    layer_params: float
    moe_shared_params: float
    moe_expert_params: float
    emb_params: float
    head_params: float
    dispatch_bytes: float
    combine_bytes: float
    kv_bytes: float
    strides: dict

    @property
    def tp(self) -> int:
        return self.strategy.tp

    @property
    def cp(self) -> int:
        return self.strategy.cp

    @property
    def pp(self) -> int:
        return self.strategy.pp

    @property
    def dp(self) -> int:
        return self.strategy.dp

    @property
    def ep(self) -> int:
        return self.strategy.ep

    @property
    def chunks(self) -> int:
        return self.strategy.interleave

    def rank(self, where: Where) -> int:
        """The device number of ``where`` under the strategy's placement (StrategyArrays.strides: CP just
        outside TP)."""
        return (where.tp * self.strides["tp"] + where.cp * self.strides["cp"] + where.pp * self.strides["pp"]
                + where.dp * self.strides["dp"])

    def places(self) -> list:
        """Every device's Where, by rank."""
        out = [Where(i, c, s, d) for i in range(self.tp) for c in range(self.cp) for s in range(self.pp)
               for d in range(self.dp)]
        return sorted(out, key=self.rank)

    def is_moe(self, layer: int) -> bool:
        """Whether global layer ``layer`` has a MoE block (layers run dense first)."""
        return layer >= self.dense_layers

    @cached_property
    def first_layers(self) -> list:
        """[stage][chunk] -> the global index of the chunk's first layer (virtual stage c p + s holds the
        c p + s'th block of layers)."""
        p, v = self.pp, self.chunks
        starts, at = [[0] * v for _ in range(p)], 0
        for c in range(v):
            for stage in range(p):
                starts[stage][c] = at
                at += self.chunk_layers[stage][c]
        return starts

    def chunk_layer_range(self, stage: int, chunk: int) -> range:
        """The global indices of the layers of chunk ``chunk`` of ``stage``."""
        first = self.first_layers[stage][chunk]
        return range(first, first + self.chunk_layers[stage][chunk])

    def chunk_shared_params(self, stage: int, chunk: int) -> float:
        """Parameters per device of chunk ``chunk`` of ``stage`` whose gradients are reduced over the DP group
        (dense layers, MoE layers but their routed experts, the embedding, the head)."""
        first = stage == 0 and chunk == 0
        last = stage == self.pp - 1 and chunk == self.chunks - 1
        layers = self.chunk_layer_range(stage, chunk)
        moe = sum(self.is_moe(n) for n in layers)
        return ((len(layers) - moe) * self.layer_params + moe * self.moe_shared_params + first * self.emb_params
                + last * self.head_params)

    def chunk_expert_params(self, stage: int, chunk: int) -> float:
        """Routed-expert parameters per device of chunk ``chunk`` of ``stage`` (reduced over expert DP)."""
        return sum(self.is_moe(n) for n in self.chunk_layer_range(stage, chunk)) * self.moe_expert_params

    def chunk_params(self, stage: int, chunk: int) -> float:
        """Parameters per device of chunk ``chunk`` of ``stage`` (its layers, the embedding, the head)."""
        return self.chunk_shared_params(stage, chunk) + self.chunk_expert_params(stage, chunk)


def check_supported(model: Transformer, strategy: Strategy) -> None:
    """An InputError for what the trace writer does not lay out yet (docs/export.md, "Not carried over")."""
    slots = embedding_slots(strategy)
    chunks = strategy.pp * strategy.interleave
    unsupported = (
        (strategy.hybrid_shard, "hybrid-shard", "hybrid sharding is not exported yet"),
        (strategy.grad_buffer is GradBuffer.LAYER, "grad-buffer", "per-layer gradient reduction is not exported "
         "yet; use grad-buffer whole"),
        (strategy.interleave > 1 and slots == 0 and model.layers % chunks != 0, "interleave",
         f"interleaving needs the {model.layers} layers to divide into pp x interleave chunks"),
        (strategy.interleave > 1 and slots == 1 and (model.layers + 2) % chunks != 0, "interleave",
         f"interleaving with the embedding-loss split needs the {model.layers} layers and the embedding's and the "
         "loss's slots to divide into pp x interleave equal chunks, as Megatron-LM's virtual stages split them"),
        (strategy.interleave > 1 and slots == 1 and (model.layers + 2) // chunks < 2, "interleave",
         f"{chunks} chunks of the embedding-loss split would leave the first or the last chunk without layers; "
         "use a smaller pp x interleave"),
        (strategy.interleave > 1 and (strategy.global_batch // (strategy.dp * strategy.micro_batch)) % strategy.pp,
         "interleave", "the interleaved schedule needs the micro-batches per step to be a multiple of pp"),
    )
    for broken, field, message in unsupported:
        if broken:
            raise InputError(field, message)


def embedding_slots(strategy: Strategy) -> int:
    """1 where the embedding and the loss each take a layer's slot of the pipeline split (cost/pipeline.py:
    embedding_slots), else 0."""
    return 1 if strategy.pipeline_split is PipelineSplit.EMBEDDING_LOSS else 0


def chunk_layers_of(layers: int, pp: int, interleave: int, slots: int) -> tuple:
    """[stage][chunk] -> the chunk's transformer layers. Each stage's layers (``stage_layers``) in ``interleave``
    equal chunks; with the embedding's and the loss's slots (Megatron-LM --account-for-embedding-in-pipeline-split
    and --account-for-loss-in-pipeline-split with virtual stages, megatron/core/transformer/transformer_layer.py:
    get_transformer_layer_offset) the L + 2 slots in p v equal virtual chunks of n = (L + 2) / (p v), the first
    chunk of stage 0 holding the embedding's slot and n - 1 layers, the last chunk of the last stage the loss's
    and n - 1: each stage's total is then cost/pipeline.py's (n v - 1 at both ends, n v between)."""
    per_stage = stage_layers(layers, pp, slots)
    if not (slots and interleave > 1):
        return tuple(tuple([n // interleave] * interleave) for n in per_stage)
    n = (layers + 2) // (pp * interleave)
    out = tuple(tuple(n - (s == 0 and c == 0) - (s == pp - 1 and c == interleave - 1) for c in range(interleave))
                for s in range(pp))
    assert [sum(c) for c in out] == per_stage      # the cost model's split, chunk by chunk
    return out


def stage_layers(layers: int, pp: int, slots: int) -> list:
    """Transformer layers on each pipeline stage (cost/pipeline.py: layers_per_stage); an InputError where the
    embedding's and the loss's slots leave the first or the last stage fewer than none: fewer than ``slots``
    slots each, (L + 2 slots) // p < slots."""
    if (layers + 2 * slots) // pp < slots:
        raise InputError("pp", f"{pp} stages leave a stage without layers for the embedding's and the loss's slots")
    return layers_per_stage(layers, pp, slots)


def layer_flops(model: Transformer, strategy: Strategy, tokens: float) -> tuple:
    """(forward, backward with recomputation) FLOP of one layer on one device for ``tokens`` tokens: the cost
    model's per-layer hardware FLOPs (cost/flops.py: dense_layer_flops) split over the TP group."""
    forward, backward = dense_layer_flops(model, tokens, strategy.recompute)
    return forward / strategy.tp, backward / strategy.tp


def moe_layer_flops(model: Transformer, strategy: Strategy, tokens: float) -> tuple:
    """(forward, backward with recomputation) FLOP of one MoE layer on one device for ``tokens`` tokens.

    cost/flops.py counts a MoE layer's matrix-multiply weights as the attention projections, the router h E
    and m h (k f_e + f_s) for the top-k routed and the shared experts (m = 3 gated, else 2), where a dense
    layer has m h f; the scores are the same. So per token the forward is the dense layer's plus
    2 d, d = h E + m h (k f_e + f_s) - m h f, the backward twice that, and full recomputation the forward
    again: forward + d' and backward + (2 + full) d' with d' = 2 tokens d. Split over the TP group (every
    TP rank of the EP group computes its share of every routed token copy; summed over the ranks of a step
    it is the cost model's hardware FLOPs)."""
    moe, h = model.moe, model.hidden
    mats = 3 if model.mlp.gated else 2
    extra = h * moe.experts + mats * h * (moe.top_k * moe.ffn + moe.shared_ffn) - mats * h * model.mlp.ffn
    forward, backward = dense_layer_flops(model, tokens, strategy.recompute)
    delta = 2.0 * tokens * extra
    full = 1.0 if strategy.recompute is Recompute.FULL else 0.0
    return (forward + delta) / strategy.tp, (backward + (2.0 + full) * delta) / strategy.tp


def layer_exchange_bytes(model: Transformer, ctx, st: StrategyArrays) -> tuple:
    """(dispatch, combine) comm_size of one MoE layer's all-to-alls on one rank: cost/layer_work.py's
    expert_exchange_bytes of the layer's a2a_bytes (cost/layer_ops.py: moe_block). The outer dimension's
    node_copy_fraction (group-limited routing) is not carried over: the all-to-all is written flat
    (docs/export.md)."""
    _, a2a = moe_block(model, ctx.shape, ctx.dev)
    dispatch, combine = expert_exchange_bytes(model.moe, a2a, ctx, st)
    return _scalar(dispatch), _scalar(combine)


def _scalar(x) -> float:
    """The value of a batch of one."""
    return float(np.asarray(x).reshape(-1)[0])


def plan_of(model: Transformer, cluster: Cluster, devices: int, strategy: Strategy) -> Plan:
    """The Plan of one estimate (``estimate``'s inputs)."""
    check_supported(model, strategy)
    cluster.accelerator.flops(strategy.dtype.value)
    st = StrategyArrays.of([strategy])
    with np.errstate(divide="ignore", invalid="ignore"):
        ctx = context_of(model, cluster, devices, st)
        terms = {k: _scalar(v) for k, v in microbatch_terms(model, ctx, st).items()}
        lay = layout_of(model, cluster, devices, st)
        dispatch, combine = layer_exchange_bytes(model, ctx, st) if model.moe else (0.0, 0.0)
        kv_bytes = _scalar(layer_cost(model, ctx.shape, ctx.dev).cp_kv_bytes)

    def kernels(prefix: str, phase: str) -> float:
        keys = ("fwd",) if phase == "f" else ("bwd", "rec")
        return sum(terms[f"{prefix}{k}_{part}"] for k in keys for part in ("math", "mem"))

    tokens = strategy.micro_batch * model.seq_len / strategy.cp
    lf, lb = layer_flops(model, strategy, tokens)
    mf, mb = moe_layer_flops(model, strategy, tokens) if model.moe else (lf, lb)
    moe_prefix = "moe." if model.moe else "dense."
    head_f = 2.0 * tokens * model.vocab * model.hidden / strategy.tp
    e = ACTIVATION_BYTES
    whole = strategy.pipeline_engine is PipelineEngine.DEEPSPEED
    chunk_layers = chunk_layers_of(model.layers, strategy.pp, strategy.interleave, embedding_slots(strategy))
    sixteen = strategy.dtype is Dtype.FP16 or strategy.grad_precision is GradPrecision.SIXTEEN_BIT
    t = strategy.tp
    attention = attention_params_per_device(model, t)
    layer_params = attention + model.mlp_params() / t + model.layer_norm_params()
    moe_shared = moe_expert = 0.0
    if model.moe:     # as cost/pipeline.py: stage_candidates splits a MoE layer's parameters
        shared_ffn = model.ffn_params(model.moe.shared_ffn) / t if model.moe.shared_ffn else 0.0
        moe_shared = attention + model.hidden * model.moe.experts + shared_ffn + model.layer_norm_params()
        moe_expert = model.moe.experts / strategy.ep * model.ffn_params(model.moe.ffn) / t
    tied_copy = model.vocab * model.hidden / t if (model.tied_embeddings and strategy.pp > 1) else 0.0
    return Plan(
        model=model, strategy=strategy, devices=devices,
        microbatches=int(round(strategy.global_batch / (strategy.dp * strategy.micro_batch))),
        layer_f=Work(kernels("dense.", "f"), lf), layer_b=Work(kernels("dense.", "b"), lb),
        moe_f=Work(kernels(moe_prefix, "f"), mf), moe_b=Work(kernels(moe_prefix, "b"), mb),
        dense_layers=model.dense_layers,
        emb_f=Work(kernels("emb.", "f"), 0.0), emb_b=Work(kernels("emb.", "b"), 0.0),
        head_f=Work(kernels("head.", "f"), head_f), head_b=Work(kernels("head.", "b"), 2.0 * head_f),
        accumulate=_scalar(lay.accumulate) if strategy.grad_accumulation.value != "fused" else 0.0,
        optimizer=_scalar(lay.optimizer), weight_cast=_scalar(lay.weight_cast),
        tp_bytes=tokens * model.hidden * e, p2p_bytes=tokens * model.hidden * e / (1 if whole else t),
        loss_bytes=tokens * LOSS_BYTES, chunk_layers=chunk_layers,
        grad_bytes_per_param=float(grad_bytes(sixteen)),
        layer_params=float(layer_params), moe_shared_params=float(moe_shared), moe_expert_params=float(moe_expert),
        emb_params=model.embedding_params() / t, head_params=model.head_params() / t + tied_copy,
        dispatch_bytes=dispatch, combine_bytes=combine, kv_bytes=kv_bytes,
        strides={k: int(_scalar(x)) for k, x in st.strides().items()},
    )
