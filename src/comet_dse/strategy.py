"""How a training step is parallelised and executed: every strategy knob, declared once.

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
import functools
import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

import numpy as np

from comet_dse.base.bounds import BOUNDS, shown
from comet_dse.base.errors import InputError
from comet_dse.base.vocabulary import NUMBER_MARK, legend_line


class Choice(str, Enum):
    """A named choice: its value is its name in files and on the command line; its code
    (its position in the Enum) is what strategy arrays and result tables hold."""

    @property
    def code(self) -> int:
        return list(type(self)).index(self)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Recompute(Choice):
    """Activation recomputation (Korthikanti et al. 2022, arXiv:2205.05198)."""

    NONE = "none"
    """Store every activation needed by backward."""
    SELECTIVE = "selective"
    """Drop the attention score/softmax/dropout tensors (O(s^2)) and recompute them in backward."""
    FULL = "full"
    """Store only each layer's input; recompute the whole layer forward in backward."""


class GradAccumulation(Choice):
    """How weight gradients of successive micro-batches are summed in fp32."""

    FUSED = "fused"
    """The weight-gradient GEMM accumulates into the fp32 buffer (Megatron-LM >= 2022, --gradient-accumulation-fusion)."""
    SEPARATE = "separate"
    """A separate element-wise add per micro-batch: main_grad += grad (Megatron-LM 2021-2022 DDP hook)."""


class Dtype(Choice):
    """Training precision of the GEMMs (activations stay 16-bit, cost/microbatch.py)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


class Placement(Choice):
    """Order of the parallel axes on the device numbering, innermost first."""

    TP_PP_DP = "tp-pp-dp"
    TP_DP_PP = "tp-dp-pp"
    PP_TP_DP = "pp-tp-dp"
    PP_DP_TP = "pp-dp-tp"
    DP_TP_PP = "dp-tp-pp"
    DP_PP_TP = "dp-pp-tp"


class CpAlgorithm(Choice):
    """How context-parallel ranks exchange K and V."""

    RING = "ring"
    """Passed around a ring, overlapped with the attention kernels."""
    ALL_GATHER = "all-gather"
    """Gathered before attention and reduce-scattered after it, exposed (Llama 3)."""


class PipelineSplit(Choice):
    """How the layers are split over the pipeline stages."""

    BALANCED = "balanced"
    """L/p layers per stage; the remainder to middle stages; embedding and head extra on the first and last."""
    EMBEDDING_LOSS = "embedding-loss"
    """The embedding and the loss each take one layer's slot: (L + 2)/p slots per stage, the first and last
    stage one transformer layer fewer (Megatron-LM --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split; Llama 3 405B: 126 + 2 = 16 stages x 8 chunks)."""


class PipelineEngine(Choice):
    """Which pipeline engine moves activations between stages."""

    MEGATRON = "megatron"
    """Megatron-LM: each TP rank sends 1/t of the activation and the next stage all-gathers it over TP
    (scatter-gather optimisation, Narayanan et al. 2021, Sec. 4.1); with SP the slices are what it needs."""
    DEEPSPEED = "deepspeed"
    """DeepSpeed's pipeline engine: every TP rank sends the whole activation (Smith et al. 2022, MT-NLG)."""


class AttentionKernel(Choice):
    """Which fused attention kernel runs with flash attention (its rates: the accelerator's attention_efficiency)."""

    FA2 = "fa2"
    """FlashAttention-2 (Dao 2023, arXiv:2307.08691); Ampere and Hopper."""
    FA3 = "fa3"
    """FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608); Hopper only."""
    CUDNN = "cudnn"
    """cuDNN fused flash attention, as Transformer Engine runs it (NeMo, Megatron-Core)."""
    FA4 = "fa4"
    """FlashAttention-4 (the flash-attention repository's CuTe DSL kernels for sm_100); Blackwell only."""


class GradPrecision(Choice):
    """In what precision weight gradients are kept, accumulated and reduced."""

    MIXED = "mixed"
    """fp32 main gradients in bf16 and fp8 training (Megatron-LM); 16-bit with loss scaling in fp16."""
    SIXTEEN_BIT = "16-bit"
    """16-bit gradients in every dtype: 2 bytes per parameter kept and all-reduced, as COMET's workload
    reduces them (dkadiyala3/comet-astrasim: weight-gradient all-reduces of 2 bytes per weight)."""


class GradBuffer(Choice):
    """Which weight gradients a device holds at once (docs/model.md, "Gradient buffer")."""

    WHOLE = "whole"
    """Every gradient of the stage, from its backward until the step's reduction (Megatron-LM's contiguous
    gradient buffer, PyTorch DDP's buckets)."""
    LAYER = "layer"
    """Layer by layer, as COMET's workload (dkadiyala3/comet-astrasim: each layer's weight-gradient all-reduce,
    then that layer's update): each layer's gradient is reduced over DP as soon as backward has produced it, so
    a device holds the gradients of two layers (one being computed, one being reduced); with several
    micro-batches per step each is reduce-scattered every micro-batch into the device's DP shard (g P / N, as
    ZeRO 2 accumulates it) and the updated weights are all-gathered at the end of the step."""


class GradSync(Choice):
    """When ZeRO 3 reduce-scatters the gradients of a step with several micro-batches (docs/model.md, "When ZeRO 3
    reduces gradients")."""

    MICRO_BATCH = "micro-batch"
    """Every micro-batch's backward reduce-scatters each layer's gradient into the device's shard, where they
    accumulate (DeepSpeed ZeRO 3; PyTorch FSDP outside no_sync)."""
    STEP = "step"
    """Gradients accumulate unsharded in fp32 and only the last micro-batch's backward reduce-scatters them:
    PyTorch FSDP's no_sync, which torch.distributed.pipelining applies to every micro-batch but the last when it
    runs FSDP2 stages (torchtitan with PP)."""


class MoeDispatcher(Choice):
    """How a MoE layer's tokens are put in expert order around the all-to-alls (docs/model.md, "Token permutation")."""

    ALLTOALL = "alltoall"
    """Megatron-Core's MoEAlltoAllTokenDispatcher (its default with expert parallelism): permute the local tokens
    into expert order (top_k copies of each), all-to-all, sort the received chunks by local expert; after the
    experts the reverse sort, all-to-all, and unpermute (a scatter-add weighted by the router probabilities)."""
    FLEX = "flex"
    """Megatron-Core's MoEFlexTokenDispatcher over DeepEP: the dispatch kernel sends each token once per
    destination rank; the received rows are permuted into expert order and unpermuted before the combine."""
    FUSED = "fused"
    """Permutation fused into the dispatch and combine kernels (DeepSeek-V3's own stack): no separate passes."""


class CrossEntropy(Choice):
    """How the loss turns the logits into a cross entropy, which decides what it keeps (docs/model.md, "Loss")."""

    IN_PLACE = "in-place"
    """Megatron-LM's vocabulary-parallel cross entropy: one fp32 copy of the 16-bit logits becomes the softmax in
    place and is kept for backward, whose gradient is written over it: 4 + 2 bytes per logit at the peak."""
    FUSED = "fused"
    """Megatron-Core's fused cross entropy (--cross-entropy-loss-fusion; megatron/core/fusions/
    fused_cross_entropy.py): its compiled steps return new tensors instead of working in place, so the fp32 copy
    of the logits and the fp32 exponentials coexist with the 16-bit logits: 2 + 4 + 4 = 10 bytes per logit."""
    FP32_CAST = "fp32-cast"
    """PyTorch's cross_entropy on logits cast to fp32, as torchtitan computes its loss: log-softmax keeps its fp32
    output, and in backward the nll gradient and the log-softmax gradient (fp32 each) coexist with it: 12 bytes
    per logit at the peak (the 16-bit logits are freed before backward)."""
    LOSS_PARALLEL = "loss-parallel"
    """PyTorch's loss_parallel (torch/distributed/tensor/parallel/loss.py), as torchtitan computes its loss with
    tensor parallelism: cross_entropy on fp32-cast vocabulary-sharded logits, decomposed into element-wise ops;
    its backward holds the kept log-softmax output, a zero-filled gradient, exp() of the output and their sum,
    fp32 each at once: 16 bytes per logit at the peak."""


class ModelParallel(Choice):
    """What model parallelism means: how the TP and PP degrees split the layers."""

    TP_PP = "tp-pp"
    """Megatron-LM: tensor parallelism inside each layer (whole heads per rank) times pipeline stages
    across layers (Narayanan et al. 2021)."""
    PURE_MP = "pure-mp"
    """COMET's model parallelism (Kadiyala et al. 2022): every layer's columns split over one MP group (the
    TP group), no pipeline (pp = 1); with a model that allows it (``column_split``), a head's columns too."""


class Zero(int, Enum):
    """ZeRO stage over the data-parallel group (Rajbhandari et al. 2020); ordered, code = stage."""

    NONE = 0
    OPTIMIZER = 1
    GRADIENTS = 2
    PARAMETERS = 3

    @property
    def code(self) -> int:
        return int(self)

    def __str__(self) -> str:
        return str(int(self))

    def __format__(self, spec: str) -> str:
        return format(int(self), spec)


# What each ZeRO stage shards over the data-parallel group (the legend of strategy codes).
ZERO_SHARDS = {Zero.NONE: "nothing sharded", Zero.OPTIMIZER: "optimizer state sharded over DP",
               Zero.GRADIENTS: "optimizer state and gradients sharded over DP",
               Zero.PARAMETERS: "optimizer state, gradients and weights sharded over DP"}

DERIVED = "derived"   # search enumerates every valid value from the model and device count
GIVEN = "given"       # one value per search, named by the command (--global-batch) or study (global_batch)
ALWAYS = "always"     # the text output shows the knob whenever it applies
CHANGED = "changed"   # ... only when it differs from the default


@dataclass(frozen=True)
class Knob:
    """What the rest of the tool needs to know about one Strategy field.

    kind: int (a positive count), float, bool, or a Choice / Zero Enum.
    search: the values a search tries when none are given (a tuple), DERIVED
      or GIVEN.
    microbatch: cost/microbatch.py's per-micro-batch terms depend on it (the
      de-duplication key of those terms is every knob marked so, plus the
      placement's group strides).
    layout: cost/layout.py's per-layout terms depend on it (their
      de-duplication key is every knob marked so).
    applies: where False the value cannot change the result (SP with tp = 1):
      a search keeps only the first of its values there, and the text output
      leaves it out. Takes a Strategy or StrategyArrays; returns a bool or mask.
    label: how the text output writes it, from the value; shown: ALWAYS or CHANGED.
    line: which strategy line of the text output it goes on (0 degrees,
      1 batch, 2 memory and precision, 3 execution switches).
    short: the column heading of search tables and the compact sweep text.
    low, high: bounds of a number.
    default_text: how help texts state the default, when not the value itself.
    cluster_default: the values a search tries when it names none, where they depend on the hardware: a
      function of the accelerators of the clusters searched that returns a tuple, or None for ``search``
      (design_space.space.with_cluster_defaults applies it).
    cluster_default_text: how help texts state that hardware-dependent default.
    """

    name: str
    kind: type
    default: object
    help: str
    search: object
    microbatch: bool
    layout: bool
    applies: Callable | None
    label: Callable
    shown: str
    line: int
    short: str
    low: float | None
    high: float | None
    default_text: str | None
    cluster_default: Callable | None
    cluster_default_text: str | None = None

    @property
    def flag(self) -> str:
        """Its command-line option, e.g. --flash-attention (a switch that defaults to on: --no-dp-overlap)."""
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.kind is bool and self.default else f"--{dashed}"

    @property
    def meaning(self) -> str:
        """What a legend says it is: a switch, what its label says when on ('sequence parallel'); any other
        knob, the first phrase of its help text (before a colon, semicolon or parenthesis)."""
        if self.kind is bool:
            return self.label(True).removesuffix(" on")
        text = self.help
        for mark in (" (", ": ", "; "):
            text = text.split(mark, 1)[0]
        return text.strip()

    @property
    def is_choice(self) -> bool:
        return isinstance(self.kind, type) and issubclass(self.kind, Enum)

    @property
    def array_dtype(self):
        """numpy dtype of its StrategyArrays column: degrees and counts as float (they divide), codes as int."""
        if self.kind is bool:
            return bool
        return np.int64 if self.is_choice else np.float64

    def choices_text(self) -> str:
        if self.kind is bool:
            return "true or false (on/off)"
        if self.is_choice:
            return "one of " + ", ".join(str(m.value) for m in self.kind)
        if self.kind is int and self.low == 1:
            return f"a positive integer up to {self.high:,.0f}"
        bound = f"at least {self.low:g}" if self.high is None else f"in [{self.low:g}, {self.high:g}]"
        return f"{'an integer' if self.kind is int else 'a number'} {bound}"

    def coerce(self, value):
        """``value`` (a Python value, or text from a command line) as this knob's type; ValueError if invalid."""
        bad = ValueError(f"must be {self.choices_text()}, got {shown(value)}")
        if self.kind is bool:
            if isinstance(value, (bool, np.bool_)):
                return bool(value)
            words = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}
            if isinstance(value, str) and value.strip().lower() in words:
                return words[value.strip().lower()]
            raise bad
        if self.is_choice:
            try:
                return self.kind(int(value) if self.kind is Zero and isinstance(value, str) else value)
            except ValueError:
                raise bad from None
        number = _number(value, self.kind)
        if number is None or number < self.low or (self.high is not None and number > self.high):
            raise bad
        return number

    def encode(self, value):
        """Its value in a StrategyArrays column (the code of a choice)."""
        return value.code if self.is_choice else value

    def decode(self, cell):
        """The value of one StrategyArrays or result-table cell (a choice by its code, or by name as read from a file)."""
        if isinstance(cell, str):
            return self.coerce(cell)
        if self.is_choice:
            return list(self.kind)[int(cell)]
        return self.kind(cell)

    def column(self, values) -> np.ndarray:
        """Its result-table column: integers as int64, codes as int64, bools, floats."""
        if self.kind is bool:
            return np.asarray(values, dtype=bool)
        return np.asarray(values, dtype=np.float64 if self.kind is float else np.int64)


def _number(value, kind):
    if isinstance(value, str):
        try:
            value = kind(value.strip())
        except ValueError:
            return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    try:
        if kind is int:
            return int(value) if float(value) == int(value) else None
        return float(value) if np.isfinite(value) else None
    except (OverflowError, ValueError):      # too large for a float, or infinite: not a valid count
        return None


def knob(default, help: str, *, search=None, microbatch: bool = False, layout: bool = False,
         applies: Callable | None = None,
         label: Callable | None = None, shown: str = CHANGED, line: int = 3, short: str = "",
         low: float | None = None, high: float | None = None, kind: type | None = None,
         default_text: str | None = None, cluster_default: Callable | None = None,
         cluster_default_text: str | None = None):
    """A Strategy field declared as a knob (see Knob). ``search`` defaults to the default alone; an integer
    knob's ``high`` defaults to the bound of every count (bounds.BOUNDS["integer"])."""
    if (kind or type(default)) is int and high is None:
        high = BOUNDS["integer"].high
    return field(default=default, metadata={"knob": dict(
        kind=kind or type(default), default=default, help=help,
        search=(default,) if search is None else search, microbatch=microbatch, layout=layout,
        applies=applies,
        label=label, shown=shown, line=line, short=short, low=low, high=high, default_text=default_text,
        cluster_default=cluster_default, cluster_default_text=cluster_default_text)})


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
        AttentionKernel.FA2, "which fused attention kernel runs with flash attention: fa2, fa3, cudnn or fa4 "
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
    if isinstance(s, StrategyArrays):
        return s.uses(Dtype.FP8)
    return s.dtype is Dtype.FP8


def _not_fp16(s):
    """Where the dtype is not fp16 (a Strategy, or StrategyArrays holding codes)."""
    if isinstance(s, StrategyArrays):
        return ~s.uses(Dtype.FP16)
    return s.dtype is not Dtype.FP16


def _declared(cls) -> tuple:
    return tuple(Knob(name=f.name, **f.metadata["knob"]) for f in dataclasses.fields(cls))


KNOBS = _declared(Strategy)
KNOB = {k.name: k for k in KNOBS}
# Knobs that cost/microbatch.py's per-micro-batch terms depend on (the de-duplication key).
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


def knob_lines(values: dict) -> list:
    """The strategy's lines of the text output: its knobs, grouped by ``Knob.line``, as lists of labels.

    ``values``: knob name -> value (a Strategy's ``to_dict()`` or a result row).
    A knob is shown when it applies and, unless it is shown ALWAYS, differs from its default.
    """
    st = Strategy(**{k: v for k, v in values.items() if k in KNOB})
    lines = [[] for _ in range(1 + max(k.line for k in KNOBS))]
    for k in KNOBS:
        value = getattr(st, k.name)
        if k.applies is not None and not k.applies(st):
            continue
        if k.shown == ALWAYS or value != k.default:
            lines[k.line].append(k.label(value))
    return lines


def compact_text(values: dict) -> str:
    """One short line for a strategy in tables, e.g. 'tp8 pp64 dp8 mb1 v1 selective sp z1'.

    Degrees and the choices shown ALWAYS, then every other knob that differs
    from its default (a switch by its short name, 'no-' when turned off); the
    global batch (one per search) is left out.
    """
    st = Strategy(**{k: v for k, v in values.items() if k in KNOB})
    words = []
    for k in KNOBS:
        value = getattr(st, k.name)
        if k.search == GIVEN or (k.applies is not None and not k.applies(st)):
            continue
        if value == k.default and (k.shown == CHANGED or k.kind is bool):
            continue
        if k.kind is bool:
            words.append(k.short if value else f"no-{k.short}")
        elif k.kind is Zero:
            words.append(f"z{int(value)}")
        elif k.is_choice:
            words.append(value.value)
        else:
            words.append(f"{k.short}{value:g}" if k.kind is float else f"{k.short}{value}")
    return " ".join(words)


def _choice_meaning(k: Knob, value) -> str:
    """What a choice's word means in a compact strategy line: the words the strategy lines of the text
    output use for it (its label, e.g. 'CP by ring'), or where that is the bare value, the knob's meaning
    and the value ('training precision: bf16')."""
    if k.kind is Zero:
        return f"ZeRO stage {int(value)}: {ZERO_SHARDS[value]}"
    label = k.label(value)
    return f"{k.meaning}: {value.value}" if label == value.value else label


@functools.lru_cache(maxsize=1)
def legend_entries() -> tuple:
    """Every word ``compact_text`` can print, as (code, meaning), in the order of KNOBS: a count as its
    short name and N ('tpN'), a switch by the word it prints when it differs from its default, a choice
    by each value it can print. Derived from the knob declarations: a new knob has its entries."""
    out = []
    for k in KNOBS:
        if k.search == GIVEN:
            continue
        if k.kind is bool:
            out.append((f"no-{k.short}", k.label(False)) if k.default else (k.short, k.meaning))
        elif k.is_choice:
            out += [(_word(k, v), _choice_meaning(k, v)) for v in k.kind if k.shown == ALWAYS or v != k.default]
        else:
            out.append((f"{k.short}{NUMBER_MARK}", k.meaning))
    return tuple(out)


def _word(k: Knob, value) -> str:
    """The word ``compact_text`` prints for a choice's value."""
    return f"z{int(value)}" if k.kind is Zero else value.value


def legend_code(word: str) -> str | None:
    """The legend code a word of a compact strategy line belongs to ('tp8' -> 'tpN', 'sp' -> 'sp'), or None."""
    codes = dict(legend_entries())
    if word in codes:
        return word
    for k in sorted((k for k in KNOBS if k.search != GIVEN and not k.is_choice and k.kind is not bool),
                    key=lambda k: -len(k.short)):
        code = f"{k.short}{NUMBER_MARK}"
        if word.startswith(k.short) and code in codes and _is_number(word[len(k.short):]):
            return code
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return bool(text)


def legend(texts) -> str:
    """One legend line for the words of the compact strategy lines ``texts`` (those that appear, in the
    order of KNOBS); the empty string when there are none."""
    used = {legend_code(w) for text in texts if text for w in str(text).split()}
    entries = [(code, meaning) for code, meaning in legend_entries() if code in used]
    return legend_line(entries) if entries else ""


class StrategyArrays:
    """Many strategies as parallel numpy arrays, one attribute per knob (``KNOBS``): the batched cost model's input.

    Degrees and counts are float arrays, switches bool, choices their codes
    (``Choice.code``); compare a choice with ``uses``, never with a bare number.
    """

    def __init__(self, columns: dict):
        missing = [k.name for k in KNOBS if k.name not in columns]
        extra = sorted(set(columns) - set(KNOB))
        if missing or extra:
            raise ValueError(f"StrategyArrays needs exactly the knobs; missing {missing}, unknown {extra}")
        n = len(np.atleast_1d(columns["tp"]))
        for k in KNOBS:
            array = np.asarray(columns[k.name], dtype=k.array_dtype)
            setattr(self, k.name, np.broadcast_to(array, (n,)) if array.ndim == 0 else array)

    @classmethod
    def of(cls, strategies: list) -> "StrategyArrays":
        """Stack a list of Strategy into arrays (a single strategy is a batch of one)."""
        return cls({k.name: [k.encode(getattr(s, k.name)) for s in strategies] for k in KNOBS})

    def take(self, index) -> "StrategyArrays":
        """The points at ``index`` (an integer array), as a new StrategyArrays."""
        return StrategyArrays({k.name: getattr(self, k.name)[index] for k in KNOBS})

    def strategy(self, i: int) -> Strategy:
        """The Strategy of point ``i``."""
        return Strategy(**{k.name: k.decode(getattr(self, k.name)[i]) for k in KNOBS})

    def uses(self, choice: Enum) -> np.ndarray:
        """True where the point's knob of that Enum (e.g. Recompute.FULL) takes that value."""
        name = next(k.name for k in KNOBS if k.kind is type(choice))
        return getattr(self, name) == choice.code

    def dtype_table(self, values: dict, missing: float = float("nan")):
        """Per point, ``values[dtype name]`` (``missing`` where absent): a table lookup, or a
        per-point selection when a value is itself an array over the points (calibration)."""
        return self.select(self.dtype, [values.get(d.value, missing) for d in Dtype])

    @staticmethod
    def select(codes, per_code: list):
        """Per point, ``per_code[code]``; each entry a number or an array over the points."""
        if all(np.ndim(x) == 0 for x in per_code):
            return np.array(per_code, dtype=float)[codes]
        return np.select([codes == i for i in range(len(per_code))],
                         [np.broadcast_to(np.asarray(x, dtype=float), np.shape(codes)) for x in per_code], np.nan)

    def strides(self) -> dict:
        """Device-number stride of each parallel group under each point's placement.

        The placement orders three blocks, innermost first: "tp" (TP, with CP
        just outside it), "pp" and "dp"; a block's stride is the product of the
        degrees of the blocks inside it. EP takes consecutive DP ranks (stride
        of DP); the expert-data-parallel group (dp/ep) steps over whole EP groups.
        """
        degree = {"tp": self.tp * self.cp, "pp": self.pp, "dp": self.dp}
        block = {axis: np.ones_like(self.tp, dtype=float) for axis in degree}
        for placement in Placement:
            inner = np.ones_like(self.tp, dtype=float)
            for axis in placement.value.split("-"):
                block[axis] = np.where(self.placement == placement.code, inner, block[axis])
                inner = inner * degree[axis]
        return {"tp": block["tp"], "cp": block["tp"] * self.tp, "pp": block["pp"], "dp": block["dp"],
                "ep": block["dp"], "edp": block["dp"] * self.ep}

    def __len__(self) -> int:
        return len(self.tp)


def combinations(values: dict) -> list:
    """Every combination of knob values (knob -> tuple), in the order of ``values``: [dict]."""
    names = list(values)
    return [dict(zip(names, combo)) for combo in itertools.product(*(values[n] for n in names))]
