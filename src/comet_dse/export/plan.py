"""What one training step is made of, per rank: the layers, their times from the cost model, the groups.

``plan_of`` reads the cost model's per-micro-batch terms (cost/microbatch_pass.py: microbatch_terms, the same
terms ``estimate`` combines) and its layout (cost/cache.py: layout_of), and lays the model out on the
devices as comet-dse does: TP innermost unless the placement says otherwise (StrategyArrays.strides),
pipeline stages holding the layer counts of cost/pipeline.py, interleaved chunks of L / (p v) layers.
Nothing here costs anything itself: the FLOP counts a Chakra node carries are the cost model's own
(cost/flops.py: dense_layer_flops, per device), so that a simulator's roofline mode sees the same work.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.base.errors import InputError
from comet_dse.cost.cache import layout_of
from comet_dse.cost.flops import dense_layer_flops
from comet_dse.cost.memory import grad_bytes
from comet_dse.cost.microbatch_pass import microbatch_terms
from comet_dse.cost.pipeline import attention_params_per_device, layers_per_stage
from comet_dse.cost.shapes import ACTIVATION_BYTES, context_of
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import Dtype, GradBuffer, GradPrecision, PipelineEngine, PipelineSplit
from comet_dse.strategy.declared import Strategy

LOSS_BYTES = 4.0    # the vocabulary-parallel cross entropy's fp32 all-reduces (cost/microbatch_pass.py: embedding_and_head)


@dataclass(frozen=True)
class Work:
    """One compute node's work on one device for one micro-batch: seconds, FLOP."""

    seconds: float
    flops: float


@dataclass(frozen=True)
class Plan:
    """One step of one strategy, per micro-batch and device, as the trace writer needs it (SI units).

    layer_f, layer_b: one transformer layer's forward and backward (with its recomputation) kernels;
    emb_f, emb_b, head_f, head_b: the embedding and the final norm + head + loss;
    accumulate: a separate gradient accumulation pass per micro-batch (0 when fused);
    optimizer: the optimizer step [s]; weight_cast: fp8's once-per-step weight cast [s];
    tp_bytes: one TP message (b s h e); p2p_bytes: one pipeline transfer per rank; loss_bytes: each of the
    loss's three all-reduces; chunk_layers[s][c]: layers of chunk c on stage s; grad_bytes_per_param: 4
    (fp32 main gradients) or 2; layer_params, emb_params, head_params: parameters per device.
    """

    model: Transformer
    strategy: Strategy
    devices: int
    microbatches: int
    layer_f: Work
    layer_b: Work
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
    emb_params: float
    head_params: float
    strides: dict

    @property
    def tp(self) -> int:
        return self.strategy.tp

    @property
    def pp(self) -> int:
        return self.strategy.pp

    @property
    def dp(self) -> int:
        return self.strategy.dp

    @property
    def chunks(self) -> int:
        return self.strategy.interleave

    def rank(self, tp_index: int, stage: int, dp_index: int) -> int:
        """The device number of (TP index, pipeline stage, DP index) under the strategy's placement."""
        return (tp_index * self.strides["tp"] + stage * self.strides["pp"] + dp_index * self.strides["dp"])

    def chunk_params(self, stage: int, chunk: int) -> float:
        """Parameters per device of chunk ``chunk`` of ``stage`` (its layers, the embedding, the head)."""
        first = stage == 0 and chunk == 0
        last = stage == self.pp - 1 and chunk == self.chunks - 1
        return (self.chunk_layers[stage][chunk] * self.layer_params + first * self.emb_params
                + last * self.head_params)


def check_supported(model: Transformer, strategy: Strategy) -> None:
    """An InputError for what the trace writer does not lay out yet (docs/export.md, "Not carried over")."""
    if model.moe:
        raise InputError("model", f"{model.name} is a mixture-of-experts model; the export lays out dense models "
                         "only (expert all-to-alls are not written yet)")
    unsupported = (
        (strategy.cp > 1, "cp", "context parallelism is not exported yet; use cp 1"),
        (strategy.hybrid_shard, "hybrid-shard", "hybrid sharding is not exported yet"),
        (strategy.grad_buffer is GradBuffer.LAYER, "grad-buffer", "per-layer gradient reduction is not exported "
         "yet; use grad-buffer whole"),
        (strategy.pp > 1 and strategy.pipeline_split is PipelineSplit.EMBEDDING_LOSS and strategy.interleave > 1,
         "pipeline-split", "embedding-loss with interleave > 1 is not exported yet"),
        (strategy.interleave > 1 and model.layers % (strategy.pp * strategy.interleave) != 0, "interleave",
         f"interleaving needs the {model.layers} layers to divide into pp x interleave chunks"),
        (strategy.interleave > 1 and (strategy.global_batch // (strategy.dp * strategy.micro_batch)) % strategy.pp,
         "interleave", "the interleaved schedule needs the micro-batches per step to be a multiple of pp"),
    )
    for broken, field, message in unsupported:
        if broken:
            raise InputError(field, message)


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


def plan_of(model: Transformer, cluster: Cluster, devices: int, strategy: Strategy) -> Plan:
    """The Plan of one estimate (``estimate``'s inputs)."""
    check_supported(model, strategy)
    cluster.accelerator.flops(strategy.dtype.value)
    st = StrategyArrays.of([strategy])
    with np.errstate(divide="ignore", invalid="ignore"):
        ctx = context_of(model, cluster, devices, st)
        terms = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in microbatch_terms(model, ctx, st).items()}
        lay = layout_of(model, cluster, devices, st)
    scalar = lambda x: float(np.asarray(x).reshape(-1)[0])   # noqa: E731 - one point of a batch of one

    def kernels(prefix: str, phase: str) -> float:
        keys = ("fwd",) if phase == "f" else ("bwd", "rec")
        return sum(terms[f"{prefix}{k}_{part}"] for k in keys for part in ("math", "mem"))

    tokens = strategy.micro_batch * model.seq_len / strategy.cp
    lf, lb = layer_flops(model, strategy, tokens)
    head_f = 2.0 * tokens * model.vocab * model.hidden / strategy.tp
    e = ACTIVATION_BYTES
    whole = strategy.pipeline_engine is PipelineEngine.DEEPSPEED
    slots = 1 if strategy.pipeline_split is PipelineSplit.EMBEDDING_LOSS else 0
    per_stage = stage_layers(model.layers, strategy.pp, slots)
    v = strategy.interleave
    chunk_layers = tuple(tuple([n // v] * v) for n in per_stage)
    sixteen = strategy.dtype is Dtype.FP16 or strategy.grad_precision is GradPrecision.SIXTEEN_BIT
    t = strategy.tp
    layer_params = attention_params_per_device(model, t) + model.mlp_params() / t + model.layer_norm_params()
    tied_copy = model.vocab * model.hidden / t if (model.tied_embeddings and strategy.pp > 1) else 0.0
    return Plan(
        model=model, strategy=strategy, devices=devices,
        microbatches=int(round(strategy.global_batch / (strategy.dp * strategy.micro_batch))),
        layer_f=Work(kernels("dense.", "f"), lf), layer_b=Work(kernels("dense.", "b"), lb),
        emb_f=Work(kernels("emb.", "f"), 0.0), emb_b=Work(kernels("emb.", "b"), 0.0),
        head_f=Work(kernels("head.", "f"), head_f), head_b=Work(kernels("head.", "b"), 2.0 * head_f),
        accumulate=scalar(lay.accumulate) if strategy.grad_accumulation.value != "fused" else 0.0,
        optimizer=scalar(lay.optimizer), weight_cast=scalar(lay.weight_cast),
        tp_bytes=tokens * model.hidden * e, p2p_bytes=tokens * model.hidden * e / (1 if whole else t),
        loss_bytes=tokens * LOSS_BYTES, chunk_layers=chunk_layers,
        grad_bytes_per_param=float(grad_bytes(sixteen)),
        layer_params=float(layer_params), emb_params=model.embedding_params() / t,
        head_params=model.head_params() / t + tied_copy,
        strides={k: int(scalar(x)) for k, x in st.strides().items()},
    )
