"""The Strategy: one design point, every field a knob declared once (``KNOBS``), with the rules between
knobs and reading knob values from rows and keywords.

A Strategy is one design point. Each of its fields is a knob declared with
``knob(...)``: its type (int, float, bool or a choice Enum), default, help
text and how a search treats it. Everything else is derived from those
declarations (``KNOBS``): the batched ``StrategyArrays``, the result table's
strategy columns, the micro-batch de-duplication key, the ``estimate`` and
``search`` command-line options, the study file's ``strategy:`` schema and
the strategy lines of the text output and the legend of its compact strategy
lines (``legend``). docs/knobs.md says how to add one.

Validity rules that depend on the model and cluster (degrees must divide
heads, batch, devices) live in cost/feasibility.py, because an invalid point
is a result with reasons, not an exception.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Callable

import numpy as np

from comet_dse.base.bounds import BOUNDS
from comet_dse.base.errors import InputError
from comet_dse.strategy.choices import (
    AttentionKernel, CpAlgorithm, CrossEntropy, Dtype, EmbeddingSharding, GradAccumulation, GradBuffer,
    GradPrecision, GradSync, ModelParallel, MoeDispatcher, PipelineEngine, PipelineSplit, Placement, Recompute,
    Zero,
)
from comet_dse.strategy.knob import ALWAYS, CHANGED, DERIVED, GIVEN, Knob, knob


def _on_off(text: str) -> Callable:
    return lambda value: f"{text} {'on' if value else 'off'}"


def _shared_kernels(accelerators) -> list:
    """Fused attention kernels every accelerator lists a measured rate for (``attention_efficiency``), in the
    first one's order. Searches run flash attention by default only where there is one: elsewhere the
    kernel's rate would be a guess at the GEMM rate (docs/design-space.md, "Defaults")."""
    if not accelerators:
        return []
    return [k for k in accelerators[0].attention_efficiency
            if all(k in a.attention_efficiency for a in accelerators)]


def _listed_kernel(accelerators):
    """The kernel a search runs when none is named: the knob's default (fa2) where every accelerator lists
    it, else the first kernel they all list (None: the default)."""
    shared = _shared_kernels(accelerators)
    return None if not shared or AttentionKernel.FA2.value in shared else (shared[0],)


def runs_fused_attention(values) -> bool:
    """Whether any point of ``values`` runs flash attention: knob name -> one value or the values of many points
    (a Strategy's ``to_dict()``, a search's result columns, a SearchSpace's ``values``); the knob's default
    where ``values`` do not name it."""
    given = values.get("flash_attention", KNOB["flash_attention"].default)
    return bool(np.any(np.asarray(given, dtype=bool)))


def with_listed_kernel(strategy: "Strategy", accelerator, kernel_named: bool) -> "Strategy":
    """``strategy`` with, where it runs flash attention and no kernel was named, the kernel a search would run on
    ``accelerator`` (the attention_kernel knob's cluster default: fa2 where it lists it, else the first it
    lists, fa4 on Blackwell) instead of the knob's default, which such a device has no rate for."""
    if not strategy.flash_attention or kernel_named:
        return strategy
    listed = _listed_kernel([accelerator])
    return dataclasses.replace(strategy, attention_kernel=AttentionKernel(listed[0])) if listed else strategy


def _degree(name: str, help: str, microbatch: bool, shown: str = ALWAYS, default_text: str | None = None):
    return knob(1, help, search=DERIVED, microbatch=microbatch, layout=True, label=lambda v: f"{name}={v}",
                shown=shown, line=0, short=name, low=1, default_text=default_text)


@dataclass(frozen=True)
class Strategy:
    """One parallelisation and execution choice: every field is a knob (help text on each).

    tp * cp * pp * dp = devices. Choices are Enums; their names ("fp8",
    "selective") are accepted and converted.
    """

    tp: int = _degree("tp", "tensor-parallel degree", True)
    cp: int = _degree("cp", "context-parallel degree: each sequence split over cp devices", True, CHANGED)
    ep: int = _degree("ep", "expert-parallel degree for mixture-of-experts models (divides the experts and dp)",
                      True, CHANGED)
    pp: int = _degree("pp", "pipeline-parallel degree", False)
    dp: int = _degree("dp", "data-parallel degree", False, default_text="devices/(tp*cp*pp)")
    global_batch: int = knob(1, "sequences per iteration", search=GIVEN, label=lambda v: f"global batch {v}",
                             shown=ALWAYS, line=1, short="batch", low=1, high=BOUNDS["global_batch"].high)
    micro_batch: int = knob(1, "sequences per micro-batch", search=DERIVED, microbatch=True,
                            label=lambda v: f"micro-batch {v}", shown=ALWAYS, line=1, short="mb", low=1)
    interleave: int = knob(1, "virtual pipeline stages per device (Narayanan et al. 2021, Sec. 2.2.2)", search=DERIVED,
                           label=lambda v: f"interleave {v}", shown=ALWAYS, line=1, short="v", low=1)
    recompute: Recompute = knob(Recompute.NONE, "activation recomputation", search=tuple(Recompute), microbatch=True,
                                label=lambda v: f"recompute {v.value}", shown=ALWAYS, line=2, short="recompute")
    sequence_parallel: bool = knob(False, "shard norms and dropout over the TP group (Korthikanti et al. 2022)",
                                   search=(False, True), microbatch=True, applies=lambda s: s.tp > 1,
                                   label=_on_off("sequence parallel"), shown=ALWAYS, line=2, short="sp")
    zero: Zero = knob(Zero.NONE, "ZeRO stage over the data-parallel group", search=tuple(Zero), layout=True,
                      applies=lambda s: s.dp * s.cp > 1, label=lambda v: f"ZeRO {v.value}", shown=ALWAYS, line=2,
                      short="zero")
    dtype: Dtype = knob(Dtype.BF16, "training precision", microbatch=True, layout=True, label=lambda v: v.value,
                        shown=ALWAYS, line=2, short="dtype")
    flash_attention: bool = knob(False, "fused attention that never stores the s x s scores", microbatch=True,
                                 label=lambda v: "flash attention" if v else "no flash attention", short="flash",
                                 cluster_default=lambda accs: (True,) if _shared_kernels(accs) else None,
                                 cluster_default_text="on where the accelerator lists a fused-attention rate, "
                                                      "else off")
    attention_kernel: AttentionKernel = knob(
        AttentionKernel.FA2, "which fused attention kernel runs with flash attention: fa2, fa3, cudnn, fa4 or triton "
        "(its rates from the accelerator's attention_efficiency)", microbatch=True,
        applies=lambda s: s.flash_attention, label=lambda v: f"{v.value} kernel", short="kernel",
        cluster_default=lambda accs: _listed_kernel(accs),
        cluster_default_text="fa2 where the accelerator lists its rate, else the first kernel it lists")
    tp_overlap: bool = knob(False, "pipeline each TP collective in chunks with the GEMM next to it "
                            "(Megatron-Core --tp-comm-overlap)", microbatch=True, applies=lambda s: s.tp > 1,
                            label=lambda v: "TP comm pipelined with GEMMs" if v else "TP comm not pipelined",
                            short="tpo")
    cp_algorithm: CpAlgorithm = knob(CpAlgorithm.RING, "how CP ranks exchange K and V: ring (overlapped with "
                                     "attention) or all-gather (exposed, as Llama 3)", microbatch=True,
                                     applies=lambda s: s.cp > 1, label=lambda v: f"CP by {v.value}", shown=ALWAYS,
                                     short="cp-alg")
    moe_imbalance: float = knob(1.0, "tokens on the busiest expert device relative to a balanced router",
                                microbatch=True, label=lambda v: f"MoE imbalance {v:g}", short="imb", low=1.0,
                                high=64.0)
    moe_dispatcher: MoeDispatcher = knob(
        MoeDispatcher.ALLTOALL, "how MoE tokens are put in expert order: alltoall (Megatron-Core's default: "
        "permute, sort received chunks, unpermute as separate memory passes), flex (DeepEP: received rows "
        "permuted and unpermuted) or fused (no separate passes, DeepSeek-V3)", microbatch=True,
        label=lambda v: f"{v.value} token dispatcher", short="dispatcher")
    ep_overlap: bool = knob(False, "hide expert all-to-alls behind another micro-batch's compute (DualPipe)",
                            microbatch=True, applies=lambda s: s.ep > 1,
                            label=lambda v: "expert all-to-all overlapped" if v else "expert all-to-all exposed",
                            short="epo")
    ep_fp8_dispatch: bool = knob(False, "with dtype fp8: tokens go to their experts in fp8 (DeepSeek-V3); "
                                 "combines stay 16-bit", microbatch=True, applies=lambda s: s.ep > 1,
                                 label=lambda v: "fp8 expert dispatch" if v else "16-bit expert dispatch",
                                 short="ep-fp8")
    pipeline_split: PipelineSplit = knob(
        PipelineSplit.BALANCED, "how layers are split over pipeline stages: balanced, or embedding-loss (the "
        "embedding and the loss each take a layer's slot, as Megatron-LM's account-for-embedding/loss)",
        search=tuple(PipelineSplit), applies=lambda s: s.pp > 1, label=lambda v: f"pipeline split {v.value}",
        short="split", layout=True)
    pipeline_engine: PipelineEngine = knob(
        PipelineEngine.MEGATRON, "what moves activations between pipeline stages: megatron (each TP rank "
        "sends 1/t, then a TP all-gather) or deepspeed (every TP rank sends the whole activation)",
        applies=lambda s: s.pp > 1, label=lambda v: f"{v.value} pipeline engine", short="engine")
    pp_overlap: bool = knob(False, "overlap pipeline send/recv with the next chunk's compute (interleaved "
                            "schedule; Megatron-LM --overlap-p2p-communication)",
                            applies=lambda s: (s.pp > 1) & (s.interleave > 1),
                            label=lambda v: "pipeline send/recv overlapped" if v else "pipeline send/recv exposed",
                            short="ppo")
    reshard_after_forward: bool = knob(
        True, "ZeRO 3 / FSDP: free each layer's gathered weights after forward and gather them again in "
        "backward (FSDP FULL_SHARD); off keeps them until backward (SHARD_GRAD_OP)", search=(True, False), layout=True,
        applies=lambda s: (s.zero >= Zero.PARAMETERS) & (s.dp * s.cp > 1),
        label=lambda v: "weights resharded after forward" if v else "weights kept gathered until backward",
        short="reshard")
    hybrid_shard: bool = knob(
        False, "ZeRO sharding only over the data-parallel ranks inside a node, replicated across nodes, whose "
        "gradients are all-reduced once per step (FSDP HYBRID_SHARD)", layout=True,
        applies=lambda s: (s.zero >= Zero.OPTIMIZER) & (s.dp * s.cp > 1),
        label=lambda v: "sharded inside a node (hybrid)" if v else "sharded over all DP ranks", short="hsdp")
    grad_precision: GradPrecision = knob(
        GradPrecision.MIXED, "weight gradients: mixed (fp32 main gradients in bf16/fp8, 16-bit in fp16) or 16-bit "
        "in every dtype (as COMET's workload reduces them)", applies=lambda s: _not_fp16(s), layout=True,
        label=lambda v: f"{v.value} gradients", line=2, short="grads")
    grad_buffer: GradBuffer = knob(
        GradBuffer.WHOLE, "which weight gradients a device holds: whole (every gradient of its stage until the "
        "step's reduction) or layer (each layer's reduced over DP right after its backward, as COMET's workload; "
        "two layers' gradients in flight, plus the DP shard they accumulate in with several micro-batches)",
        layout=True, label=lambda v: "gradients reduced layer by layer" if v is GradBuffer.LAYER else
        "whole gradient buffer", line=2, short="gbuf")
    grad_sync: GradSync = knob(
        GradSync.MICRO_BATCH, "ZeRO 3 with several micro-batches: reduce-scatter the gradients every micro-batch "
        "(micro-batch: sharded accumulation) or once, at the last (step: unsharded fp32 accumulation, FSDP no_sync, "
        "as PyTorch's pipeline schedules run FSDP2)", layout=True,
        applies=lambda s: (s.zero >= Zero.PARAMETERS) & (s.dp * s.cp > 1),
        label=lambda v: f"gradients reduce-scattered every {v.value}", short="gsync")
    cross_entropy: CrossEntropy = knob(
        CrossEntropy.IN_PLACE, "how the loss computes its cross entropy: in-place (Megatron-LM's vocabulary-parallel "
        "softmax in one fp32 copy, 6 B per logit at the peak), fused (Megatron-Core --cross-entropy-loss-fusion: "
        "10 B per logit), fp32-cast (PyTorch's cross_entropy on fp32-cast logits, as torchtitan: 12 B per logit) or "
        "loss-parallel (the same under PyTorch's loss_parallel with TP, as torchtitan: 16 B per logit)", microbatch=True,
        label=lambda v: f"{v.value} cross entropy", short="xent")
    embedding_sharding: EmbeddingSharding = knob(
        EmbeddingSharding.TABLE_WISE, "how a recommendation model's embedding tables are laid out over the "
        "devices: table-wise, row-wise, column-wise, data-parallel (TorchRec's sharding types), planned (small "
        "tables replicated, the hottest split by rows, the rest whole, balanced, as planners mix them) or "
        "table-row-wise (planned over nodes, each node's tables split by rows over its devices); a search tries "
        "every one the model allows", search=DERIVED, label=lambda v: f"{v.value} embeddings", line=2,
        short="emb")
    embedding_overlap: bool = knob(
        False, "recommendation models: pipeline each batch's index and embedding exchanges behind the previous "
        "batch's dense passes and lookups (TorchRec's TrainPipelineSparseDist, HugeCTR's inter-iteration overlap); "
        "off, each hides only behind the bottom MLP", label=lambda v: "embedding exchange pipelined" if v else
        "embedding exchange not pipelined", short="embo")
    embedding_hierarchical: bool = knob(
        False, "recommendation models: the exchanges cross the network hierarchically: a node gathers its devices' "
        "traffic for each other node over its scale-up links and sends it through all its network interfaces "
        "(HugeCTR's Hierarchical communication); off, each device's bytes leave through its own interface",
        label=lambda v: "hierarchical embedding exchange" if v else "flat embedding exchange", short="embh")
    activation_offload: float = knob(
        0.0, "share of the activations each layer keeps for backward that wait in host memory instead of the "
        "device's (Megatron-Core --cpu-offloading-num-layers over the stage's layers, MaxText's offloaded remat "
        "tensors, NxD activation offload): copied to the host beside each forward and back beside each backward "
        "over the host link, only what the pass's compute does not cover exposed; needs the accelerator's host "
        "memory (memory.host)", microbatch=True, label=lambda v: f"activations {v:.0%} offloaded to host",
        short="aoff", low=0.0, high=1.0)
    expansion_overlap: bool = knob(
        False, "prefetch expansion-tier traffic and overlap it with each pass's compute (ZeRO-Infinity, CXL memory "
        "pooling); off exposes it all", label=lambda v: "expansion traffic overlapped" if v else
        "expansion traffic exposed", short="xo")
    expansion_roofline: bool = knob(
        False, "cost the expansion tier as COMET's remote-memory roofline (dkadiyala3/comet-astrasim trial/run.log): "
        "each pass's spilled traffic at the tier's bandwidth against that pass's GEMM math only, nothing hidden "
        "behind communication or prefetched across passes; on, it replaces expansion_overlap",
        label=lambda v: "expansion tier as a remote-memory roofline" if v else "expansion tier as a traffic model",
        short="xr")
    fp8_amax_reduction: bool = knob(
        False, "with dtype fp8: Transformer Engine's delayed scaling all-reduces the amax of every fp8 tensor over "
        "the TP x DP x CP group, blocking, at each model chunk's forward and backward (TE 1.x reduce_amax with "
        "NVTE_ASYNC_AMAX_REDUCTION=0, as NVIDIA's MLPerf v3.1 GPT-3: FP8_REDUCE_AMAX=True); off: none that "
        "blocks (NVTE_DP_AMAX_REDUCE_INTERVAL=0, NVTE_ASYNC_AMAX_REDUCTION=1, or per-block scaling)",
        layout=True, applies=lambda s: _is_fp8(s),
        label=lambda v: "fp8 amax all-reduced per chunk" if v else "no blocking fp8 amax reduction",
        short="amax")
    fp8_fused_cast: bool = knob(
        False, "with dtype fp8: each weight is cast to fp8 inside the matmul that reads it (XLA's fp8 dot as "
        "MaxText runs it, fp8 all-gathers of FSDP2 float8): no fp8 copy of the weights is kept and no separate cast "
        "pass runs; off: Transformer Engine casts the weights once per step into a kept fp8 copy",
        layout=True, applies=lambda s: _is_fp8(s),
        label=lambda v: "fp8 cast inside the matmuls (no kept copy)" if v else "fp8 weight copy kept",
        short="fp8-fused")
    dp_overlap: bool = knob(True, "overlap the data-parallel gradient reduction with backward",
                            applies=lambda s: s.dp * s.cp > 1,
                            label=lambda v: "DP reduction overlapped" if v else "DP reduction not overlapped",
                            short="dpo")
    grad_accumulation: GradAccumulation = knob(
        GradAccumulation.FUSED, "fp32 gradient accumulation fused into the GEMM, or a separate add per "
        "micro-batch (Megatron-LM before 2022)", label=lambda v: f"gradient accumulation {v.value}", short="grad-acc")
    placement: Placement = knob(Placement.TP_PP_DP, "order of the parallel axes on the devices, innermost first "
                                "(CP sits right outside TP; EP takes consecutive DP ranks)", microbatch=True,
                                layout=True,
                                label=lambda v: f"placement {v.value} (innermost first)", short="placement")
    model_parallel: ModelParallel = knob(
        ModelParallel.TP_PP, "what model parallelism is: tp-pp (Megatron-LM: TP inside layers x pipeline stages) "
        "or pure-mp (COMET: every layer's columns split over the TP group, no pipeline; a head's columns too "
        "where the model has column_split)", label=lambda v: "pure model parallelism (COMET)" if
        v is ModelParallel.PURE_MP else "TP x PP model parallelism", line=0, short="mp")

    def __post_init__(self) -> None:
        for k in KNOBS:
            try:
                object.__setattr__(self, k.name, k.coerce(getattr(self, k.name)))
            except ValueError as exc:
                raise InputError(k.name.replace("_", "-"), str(exc)) from None
        for names, holds, message in CROSS_RULES:
            if not holds(self):
                raise InputError(names[0].replace("_", "-"), f"{message}, got {self.dtype.value}")

    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def to_dict(self) -> dict:
        """Knob name -> plain value (choices by name): the JSON form, read back by ``Strategy(**d)``."""
        return {k.name: _plain(getattr(self, k.name)) for k in KNOBS}


def _plain(value):
    if isinstance(value, Zero):
        return int(value)
    return value.value if isinstance(value, Enum) else value


def _is_fp8(s):
    """Where the dtype is fp8 (a Strategy, or StrategyArrays holding codes)."""
    if isinstance(s, Strategy):
        return s.dtype is Dtype.FP8
    return s.uses(Dtype.FP8)


def _not_fp16(s):
    """Where the dtype is not fp16 (a Strategy, or StrategyArrays holding codes)."""
    if isinstance(s, Strategy):
        return s.dtype is not Dtype.FP16
    return ~s.uses(Dtype.FP16)


def _declared(cls) -> tuple:
    return tuple(Knob(name=f.name, **f.metadata["knob"]) for f in dataclasses.fields(cls))


KNOBS = _declared(Strategy)
KNOB = {k.name: k for k in KNOBS}
# Knobs that cost/microbatch_pass.py's per-micro-batch terms depend on (the de-duplication key).
MICROBATCH_KNOBS = tuple(k.name for k in KNOBS if k.microbatch)
# Knobs that cost/layout.py's per-layout terms depend on (their de-duplication key).
LAYOUT_KNOBS = tuple(k.name for k in KNOBS if k.layout)
# Rules between knobs, checked for a Strategy and for every combination a SearchSpace allows:
# (knobs involved, holds(strategy-like) -> bool, what is needed).
CROSS_RULES = (
    (("ep_fp8_dispatch", "dtype"), lambda s: not s.ep_fp8_dispatch or s.dtype is Dtype.FP8, "needs dtype fp8"),
)


def knob_values(columns: dict) -> dict:
    """Knob name -> value of the columns of a row (a CSV row: text) that name a knob; empty cells are left out.

    Other columns are ignored. A bad value raises InputError naming the column.
    """
    out = {}
    for k in KNOBS:
        text = columns.get(k.name)
        if text not in (None, ""):
            try:
                out[k.name] = k.coerce(text)
            except ValueError as exc:
                raise InputError(k.name, str(exc)) from None
    return out


def coerced(values: dict) -> dict:
    """``values`` (knob name -> a Python value) with each coerced by its knob (``Knob.coerce``), as a Strategy
    would; a bad value raises InputError naming the knob as the command line does (``micro-batch``), before
    anything computes with it (the API's ``tp=0`` was a ZeroDivisionError)."""
    out = {}
    for name, value in values.items():
        try:
            out[name] = KNOB[name].coerce(value)
        except ValueError as exc:
            raise InputError(name.replace("_", "-"), str(exc)) from None
    return out
