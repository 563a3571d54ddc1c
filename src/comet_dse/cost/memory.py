"""Step 6, the step's other terms: memory per device (model states, activations, buffers, the reserve) and its
placement across tiers.

Model states per parameter for mixed-precision Adam (Rajbhandari et al. 2020,
ZeRO, Sec. 3.1): weights in 16-bit (2 B), gradients (2 B in fp16 runs with
loss scaling; 4 B fp32 main gradients for bf16/fp8, as Megatron-LM keeps
them), optimizer state 12 B (fp32 master weights, Adam m and v).
ZeRO over the data-parallel shard of size N (DP x CP ranks, cost/data_parallel.py: shard_size)
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

from comet_dse.cost.pipeline import embedding_slots
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import Dtype, GradBuffer, GradSync, PipelineSplit, Zero


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
    # With a tier, what stays is total - spilled = min(total, hbm) + what could not spill: it fits exactly when
    # nothing is left over (over <= 0). Testing total - spilled <= hbm as well flipped on rounding (the two
    # sides equal in exact arithmetic), so that more HBM made a fitting point not fit.
    tier = np.asarray(expansion_capacity) > 0
    fits = np.where(tier, (over <= 0.0) & (spilled <= expansion_capacity), total <= hbm_capacity)
    return Placement(hbm=total - spilled, expansion=spilled, spilled_optimizer=opt,
                     spilled_weights=wg, spilled_activations=act, fits=fits)


FP8_WEIGHT_COPY = 1.0   # bytes per parameter: the fp8 copy of the weights kept for the GEMMs (Transformer Engine)


def state_bytes(model: Transformer, st: StrategyArrays, candidates: list, gbytes, shards) -> list:
    """Per candidate stage: weights, gradients and optimizer bytes per device, and its dense and MoE layers.

    Shared weights are sharded by ZeRO over the dp shard, expert weights over
    dp/ep (cost/memory.py: model_state_bytes); fp8 training keeps an fp8 copy
    of the weights the device holds (FP8_WEIGHT_COPY bytes per parameter held:
    with ZeRO 3 its shard and the gathered layers, as Megatron-FSDP's fp8
    parameters and FSDP2's float8 all-gather hold them), none where the cast
    runs inside the matmuls (fp8_fused_cast, XLA). ZeRO 3 holds the
    current and the prefetched layer gathered; without resharding after
    forward (SHARD_GRAD_OP) every layer stays gathered until its backward.
    For grad_buffer layer (``step_memory`` picks them per point) also
    "grad_layer", the gradients of two layers in flight, g min(2 P_l, P), and
    "grad_shard", the DP shard several micro-batches accumulate in, g P / N
    (P_l: one transformer layer's parameters on the device, P the stage's); and for
    grad_sync step "grad_unsharded", g P, what ZeRO 3 then accumulates. Each only where some point
    uses it, as step_memory reads them: every key is gathered back to every point.
    """
    kept_copy = st.uses(Dtype.FP8) & ~st.fp8_fused_cast
    layered, unsharded = bool(np.any(st.uses(GradBuffer.LAYER))), bool(np.any(st.uses(GradSync.STEP)))
    layer = model.layer_params() / st.tp
    keep = st.reshard_after_forward
    out = []
    for params, n_dense, n_moe in candidates:
        shared = model_state_bytes(params.shared, shards[0], st.zero, gbytes,
                                   gathered=np.where(keep, 2.0 * layer, params.shared))
        expert = model_state_bytes(params.expert, shards[1], st.zero, gbytes,
                                   gathered=np.where(keep, 0.0, params.expert))
        held = shared.weights + expert.weights
        states = {"weights": held + np.where(kept_copy, FP8_WEIGHT_COPY / WEIGHT_BYTES * held, 0.0),
                  "gradients": shared.gradients + expert.gradients, "optimizer": shared.optimizer + expert.optimizer,
                  "n_dense": n_dense, "n_moe": n_moe}
        if layered:
            states["grad_layer"] = gbytes * np.minimum(2.0 * layer, params.total)
            states["grad_shard"] = gbytes * (params.shared / shards[0] + params.expert / shards[1])
        if unsharded:
            states["grad_unsharded"] = gbytes * params.total
        out.append(states)
    return out


def step_memory(model: Transformer, st: StrategyArrays, terms: dict, states: list, mixes: list, m, cluster: Cluster):
    """Bytes per device of the stage that needs the most, by part; that stage's activations per micro-batch; the
    total of the last pipeline rank (the one Megatron-LM logs memory from), its reserve included; and the most
    bytes of kept activations any pipeline rank has waiting in host memory (activation_offload: a share o of its
    kept activations K, o K, the device keeping (1 - o) K; the first rank, holding the most micro-batches, needs
    the most; 0.0 where nothing is offloaded).

    Per candidate stage (cost/pipeline.py): model states (``state_bytes``: shared
    weights sharded by ZeRO over dp x cp, expert weights over dp/ep x cp, an fp8
    weight copy in fp8 training) and activations: the in-flight micro-batches of
    its pipeline rank under 1F1B (first stage rank 0, a full middle stage rank 1,
    the last rank p - 1) of its dense and MoE layers, one layer's transient
    recomputation, and on the stage with the head the logits of the one micro-batch
    whose loss it computes (the last rank runs each micro-batch's backward right
    after its forward; with p = 1 the single stage). Per layer, the bytes kept and the
    recomputation's transient bytes, the logits and the TP buffers depend only on the
    micro-batch knobs (cost/microbatch_pass.py: activation_terms). With interleaving, the stage that holds the
    embedding in a layer's slot of its first chunk (pipeline split
    embedding-loss) has one layer fewer there, where the warm-up's extra
    micro-batches sit (cost/memory.py: inflight_layer_microbatches); the stage whose
    last chunk holds the loss in a layer's slot has (S + 1)/v layers in its first
    chunk and the rest spread over the others. The
    candidate with the largest total is reported, with the reserve the cluster
    keeps (cost/memory.py: reserved_bytes) as the part "reserved". With grad_buffer
    layer the gradients are two layers' in flight, plus their DP shard when the step
    has several micro-batches (``state_bytes``). ZeRO 3 with grad_sync
    step and several micro-batches holds its stage's gradients unsharded, g P (FSDP's
    no_sync accumulation, docs/model.md).
    """
    p = st.pp
    dense_pl, dense_work = terms["dense.kept"], terms["dense.working"]
    moe_pl, moe_work = (terms["moe.kept"], terms["moe.working"]) if model.moe else (dense_pl, dense_work)
    working = np.maximum(dense_work, moe_work) if model.moe else dense_work    # the same for every candidate
    logits, buffers = terms["logits"], terms["buffers"]
    best, best_total, best_act, best_host = None, None, None, 0.0
    offloads = bool(np.any(st.activation_offload > 0))      # most batches offload nothing: skip the products
    any_slot = bool(np.any(st.uses(PipelineSplit.EMBEDDING_LOSS)))
    slot = embedding_slots(st) if any_slot else 0.0
    bounds = warm_up(p, st.interleave, m)      # every rank's warm-up bounds, once for the candidates
    below_last = p - 1.0
    last = len(states) - 1
    layer_grads = st.uses(GradBuffer.LAYER)
    any_layer_grads = bool(np.any(layer_grads))
    unsharded = st.uses(GradSync.STEP)
    any_unsharded = bool(np.any(unsharded))
    if any_unsharded:         # most batches have none: skip the rest of the test
        unsharded = unsharded & (st.zero >= Zero.PARAMETERS) & (m > 1) & (st.dp * st.cp > 1)
    for index, (stage, (_, _, with_emb, with_head)) in enumerate(zip(states, mixes)):
        n_dense, n_moe = stage["n_dense"], stage["n_moe"]
        # the pipeline rank the candidate stands for: the first stage, a full middle stage (the earliest,
        # rank 1, warms up longest) or the last; one stage when p = 1
        if index == 0:
            rank = 0.0
        else:
            rank = np.maximum(below_last if index == last else np.minimum(1.0, below_last), 0.0)
        layers = n_dense + n_moe
        if model.moe:          # the stage's mean activation bytes per layer over its dense and MoE layers
            per_layer = (n_dense * dense_pl + n_moe * moe_pl) / np.maximum(layers, 1.0)
        else:
            per_layer = dense_pl * (layers > 0)
        first_chunk = None
        if any_slot and np.any((with_emb + with_head) * slot):
            # the embedding takes a layer's slot of this stage's first chunk, the loss one of its last chunk: the
            # first chunk holds (S + slots)/v - embedding slot layers (cost/memory.py: inflight_layer_microbatches)
            taken, loss = with_emb * slot * (p > 1), with_head * slot * (p > 1)
            first_chunk = np.where(taken + loss > 0, np.maximum((layers + taken + loss) / st.interleave - taken, 0.0),
                                   layers / st.interleave)
        inflight = inflight_layer_microbatches(layers, p, st.interleave, m, first_chunk, rank, bounds)
        gradients = stage["gradients"]
        if any_layer_grads:       # most batches have none: skip two full-size where()s per candidate
            gradients = np.where(layer_grads, stage["grad_layer"] + np.where(m > 1, stage["grad_shard"], 0.0),
                                 gradients)
        if any_unsharded:
            gradients = np.where(unsharded, stage["grad_unsharded"], gradients)
        kept = inflight * per_layer
        on_host = kept * st.activation_offload if offloads else 0.0      # waits in host memory instead
        memory = {"weights": stage["weights"], "gradients": gradients, "optimizer": stage["optimizer"],
                  "activations": kept - on_host + working + with_head * logits,
                  "buffers": buffers}
        total = memory["weights"] + gradients + memory["optimizer"] + memory["activations"] + buffers
        act_per_mb = layers * per_layer
        if index == last:
            last_total = total
        if best is None:
            best, best_total, best_act, best_host = memory, total, act_per_mb, on_host
        else:
            better = total > best_total
            best = {k: best[k] if memory[k] is best[k] else np.where(better, memory[k], best[k]) for k in best}
            best_act = np.where(better, act_per_mb, best_act)
            best_host = np.maximum(on_host, best_host) if offloads else 0.0
            best_total = np.maximum(total, best_total)
    fixed = (cluster.reserved_memory, cluster.fragmentation, cluster.workspace_memory)
    reserved = reserved_bytes(best_total, *fixed)
    best["reserved"] = reserved if np.shape(reserved) == np.shape(best_total) else reserved + np.zeros_like(best_total)
    return best, best_act, last_total + reserved_bytes(last_total, *fixed), best_host
