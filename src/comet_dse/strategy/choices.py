"""The named choices of the strategy knobs (Recompute, Dtype, ZeRO stages, ...): one Enum per choice,
whose value is its name in files and on the command line and whose code (position) is what arrays hold."""
from __future__ import annotations

from enum import Enum


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
    """Training precision of the GEMMs (activations stay 16-bit, cost/microbatch_pass.py)."""

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
    AITER = "aiter"
    """AMD's aiter fused attention: its v3 assembly FMHA kernels for CDNA 3 and 4 (ROCm/aiter), which
    Transformer Engine's CK backend on ROCm also runs (NVTE_FUSED_ATTN_CK with the v3 kernels); MI300X,
    MI325X, MI355X."""
    FA3 = "fa3"
    """FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608); Hopper only."""
    CUDNN = "cudnn"
    """cuDNN fused flash attention, as Transformer Engine runs it (NeMo, Megatron-Core)."""
    FA4 = "fa4"
    """FlashAttention-4 (the flash-attention repository's CuTe DSL kernels for sm_100); Blackwell only."""
    TRITON = "triton"
    """FlashAttention in Triton (the flash-attention repository's flash_attn_triton.py, FlashAttention-1's
    algorithm, which llm-foundry's MPT runs as attn_impl triton); Dao 2023 (arXiv:2307.08691) Sec. 4.1 measures
    FlashAttention-2 1.3-1.5x faster in the forward pass and about 2x faster in the backward pass on an A100."""


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


class EmbeddingSharding(Choice):
    """How a recommendation model's embedding tables are laid out over the devices (TorchRec's sharding types;
    docs/model.md, "Recommendation models"). The dense part is data-parallel on every device in each."""

    TABLE_WISE = "table-wise"
    """Each table whole on one device, the tables spread to balance the lookups; pooled embeddings reach the
    devices that own each sample by an all-to-all, their gradients come back by another."""
    ROW_WISE = "row-wise"
    """Each table's rows split evenly over every device; each device pools its rows' share of every sample,
    and a reduce-scatter sums the partial pools (an all-gather returns their gradients)."""
    COLUMN_WISE = "column-wise"
    """Each table's embedding dimension split evenly over every device (dim divisible by the devices); an
    all-to-all as table-wise, balanced by construction."""
    DATA_PARALLEL = "data-parallel"
    """Every table whole on every device; no exchange in forward, the tables' whole gradients all-reduced in
    backward (for small tables only)."""
    TABLE_ROW_WISE = "table-row-wise"
    """The planned placement over nodes instead of devices, each node's share split by rows over its devices
    (TorchRec's TABLE_ROW_WISE; HugeCTR's hier_auto plans per node): partial pools reduce-scattered inside the
    node, only whole pools cross the network (cost/recommendation.py)."""
    PLANNED = "planned"
    """As a planner lays tables out (TorchRec's, HugeCTR's): small tables replicated (data-parallel), the hottest
    tables split by rows over several devices, the rest whole on one device each, balanced by traffic
    (cost/recommendation.py: planned_items)."""


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
