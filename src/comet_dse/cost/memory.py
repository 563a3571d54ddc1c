"""Memory per device: model states, activations, buffers, the reserve, and placement across tiers.

Model states per parameter for mixed-precision Adam (Rajbhandari et al. 2020,
ZeRO, Sec. 3.1): weights in 16-bit (2 B), gradients (2 B in fp16 runs with
loss scaling; 4 B fp32 main gradients for bf16/fp8, as Megatron-LM keeps
them), optimizer state 12 B (fp32 master weights, Adam m and v).
ZeRO over the data-parallel shard of size N (DP x CP ranks, cost/layout.py)
divides: stage 1 the optimizer state, stage 2 also gradients, stage 3 also weights.

Activations under 1F1B (Korthikanti et al. 2022, Sec. 4.2.3): pipeline rank r
holds min(m, p - r) micro-batches of its layers; with v-way interleaving it
holds the layers of min(m v, p v + p - 1 - 2r) chunk forwards
(``inflight_layer_microbatches``), L (1 + (p-1)/(p v)) on the first stage when
m is large. The reserve (``reserved_bytes``): the cluster's fixed
reserved_memory, plus its GEMM workspaces and its fragmentation x the rest (docs/hardware.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.strategy.choices import Zero

OPTIMIZER_BYTES = 12.0   # fp32 master weight + Adam m + Adam v
WEIGHT_BYTES = 2.0       # 16-bit working copy


def grad_bytes(dtype_is_fp16):
    """Bytes per gradient element: 2 for fp16 (loss-scaled fp16 grads), 4 otherwise (fp32 main grads)."""
    return np.where(dtype_is_fp16, 2.0, 4.0)


@dataclass(frozen=True)
class ModelStates:
    """Bytes per device of weights, gradients and optimizer state (arrays)."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray


def model_state_bytes(params, dp, zero, grad_el_bytes, gathered=0.0) -> ModelStates:
    """Weights, gradients, optimizer bytes of ``params`` parameters on one device under ZeRO.

    weights   = 2 P, or with ZeRO 3: min(2 P, 2 P / N_d + 2 G (1 - 1/N_d)) where G is
                the parameter count gathered at a time (the current and the
                prefetched layer: G = 2 * layer parameters)
    gradients = g P / (N_d if zero >= 2 else 1)
    optimizer = 12 P / (N_d if zero >= 1 else 1)
    """
    sharded = WEIGHT_BYTES * (params / dp + gathered * (1.0 - 1.0 / dp))
    return ModelStates(
        weights=np.where(zero >= Zero.PARAMETERS, np.minimum(WEIGHT_BYTES * params, sharded), WEIGHT_BYTES * params),
        gradients=grad_el_bytes * params / np.where(zero >= Zero.GRADIENTS, dp, 1),
        optimizer=OPTIMIZER_BYTES * params / np.where(zero >= Zero.OPTIMIZER, dp, 1),
    )


@dataclass(frozen=True)
class WarmUp:
    """What ``inflight_layer_microbatches`` reads of the schedule that is the same for every pipeline rank
    (arrays over points): m v, p v + p - 1, where v > 1, and whether any point interleaves. ``warm_up``
    builds it once per batch for all the candidate stages."""

    microbatches_v: object
    forwards_rank0: object
    interleaved: object
    any_interleaved: bool


def warm_up(pp, interleave, microbatches) -> WarmUp:
    """The rank-independent bounds of 1F1B's warm-up (``inflight_layer_microbatches``): m v and p v + p - 1."""
    interleaved = interleave > 1
    return WarmUp(microbatches * interleave, pp * interleave + pp - 1, interleaved, bool(np.any(interleaved)))


def inflight_layer_microbatches(layers_per_stage, pp, interleave, microbatches, first_chunk=None, rank=0,
                                bounds: WarmUp | None = None):
    """Layer-micro-batches whose activations pipeline rank ``rank`` holds at its peak (1F1B).

    A rank runs its warm-up forwards, then one more, before its first backward (Megatron-LM
    schedules.py; Narayanan et al. 2021, Sec. 2.2): p - r - 1 warm-up micro-batches without
    interleaving, 2 (p - r - 1) + (v - 1) p chunk forwards with v virtual stages.
    v = 1: (L/p) * min(m, p - r).
    v > 1: F = min(m v, p v + p - 1 - 2 r) chunk forwards, run in groups of p micro-batches per
    chunk, chunk 0 to v-1, so chunk 0 holds n_0 = floor(F / (p v)) p + min(F mod p v, p) of them
    and the other chunks the rest:
        c_0 n_0 + (S - c_0) (F - n_0) / (v - 1)
    with S the stage's layers and c_0 (``first_chunk``) the layers of its first chunk. With S/v layers
    in every chunk (the default) this is (S/v) F. It differs where the first chunk holds fewer layers:
    when the embedding takes a layer's slot of it (Megatron-LM --account-for-embedding-in-pipeline-split;
    Llama 3 405B: the embedding alone in the first chunk), the warm-up's extra micro-batches hold
    no transformer layer there. Where the loss takes a layer's slot of the last chunk
    (--account-for-loss-in-pipeline-split), the first chunk holds (S + 1)/v layers and the last one
    fewer; the chunks after the first are taken as one even share (S - c_0)/(v - 1) each.
    ``bounds``: ``warm_up(pp, interleave, microbatches)``, given when several ranks of one batch are asked for.
    """
    bounds = bounds or warm_up(pp, interleave, microbatches)
    first_rank = np.ndim(rank) == 0 and rank == 0      # p - 0 and F - 2 x 0 are p and F: not computed
    plain = layers_per_stage * np.minimum(microbatches, pp if first_rank else pp - rank)
    if not bounds.any_interleaved:
        return plain
    chunk = layers_per_stage / interleave
    forwards = np.minimum(bounds.microbatches_v, bounds.forwards_rank0 if first_rank
                          else bounds.forwards_rank0 - 2.0 * rank)
    interleaved = chunk * forwards
    if first_chunk is not None:
        cycle = pp * interleave
        cycles = np.floor(forwards / cycle)
        in_first = cycles * pp + np.minimum(forwards - cycles * cycle, pp)
        uneven = first_chunk * in_first + (layers_per_stage - first_chunk) * (forwards - in_first) / np.maximum(
            interleave - 1, 1)
        interleaved = np.where(first_chunk == chunk, interleaved, uneven)
    return np.where(bounds.interleaved, interleaved, plain)


def reserved_bytes(footprint, reserved_memory: float, fragmentation: float, workspace: float = 0.0):
    """Device memory a job cannot use for its tensors, per device [bytes]:

        reserved = R + W + f * footprint

    R (``Cluster.reserved_memory``): what is gone before the first tensor, fixed per device: the memory the
    driver keeps back from the nominal capacity, the runtime context (CUDA context with its kernels; XLA's
    runtime reserve on TPU) and the collective library's buffers (NCCL: NCCL_BUFFSIZE and the LL/LL128
    buffers per channel and connection, per communicator). W (``Cluster.workspace_memory``): the GEMM
    libraries' workspaces the framework allocates once among its tensors (PyTorch's cuBLAS workspace,
    Transformer Engine's). f (``Cluster.fragmentation``): the allocator's
    fragmentation, memory it holds but cannot hand out, as a fraction of the ``footprint`` (weights,
    gradients, optimizer state, activations and buffers, in bytes). Each preset's R and f and their sources:
    docs/hardware.md, "Reserved memory". The reserve stays in HBM: it never spills to an expansion tier.
    """
    return reserved_memory + workspace + fragmentation * footprint


def footprint_bytes(total, reserved_memory: float, fragmentation: float, workspace: float = 0.0):
    """The footprint inside a total that includes its reserve (``reserved_bytes``), per device [bytes]:

        footprint = (total - R - W) / (1 + f)
    """
    return (total - reserved_memory - workspace) / (1.0 + fragmentation)


@dataclass(frozen=True)
class Placement:
    """Where the footprint lives: bytes in HBM and in the expansion tier, and what spilled."""

    hbm: np.ndarray
    expansion: np.ndarray
    spilled_optimizer: np.ndarray
    spilled_weights: np.ndarray
    spilled_activations: np.ndarray
    fits: np.ndarray


def place(parts: dict, hbm_capacity, expansion_capacity, total=None) -> Placement:
    """Place the footprint: HBM first; what does not fit spills to the expansion tier.

    Spill order (cheapest traffic first): optimizer state (touched once per
    step), then weights and gradients (touched every micro-batch), then
    activations; buffers and the reserve (``reserved_bytes``) never spill.
    Without an expansion tier nothing spills. Fits when HBM holds what stays
    and the expansion tier holds what spilled. ``total``: the sum of ``parts`` where the caller has it.
    """
    total = sum(parts.values()) if total is None else total
    if np.ndim(expansion_capacity) == 0 and not expansion_capacity > 0:     # no tier: nothing is over
        over = np.zeros(np.broadcast(total, hbm_capacity).shape)
    else:
        over = np.where(expansion_capacity > 0, np.maximum(total - hbm_capacity, 0.0), 0.0)
    opt = np.minimum(over, parts["optimizer"])
    over = over - opt
    wg = np.minimum(over, parts["weights"] + parts["gradients"])
    over = over - wg
    act = np.minimum(over, parts["activations"])
    over = over - act
    spilled = opt + wg + act
    fits = (over <= 0.0) & (spilled <= expansion_capacity) & (total - spilled <= hbm_capacity)
    return Placement(hbm=total - spilled, expansion=spilled, spilled_optimizer=opt,
                     spilled_weights=wg, spilled_activations=act, fits=fits)
