"""Step 6, the step's other terms: the optimizer step and the passes over gradients it needs.

Bytes the mixed-precision Adam step moves per parameter, zeroing the gradient buffer, the scalar all-reduces
before the update (gradient-norm clipping, fp16's found-inf check), a separate gradient accumulation pass and
fp8 training's weight cast; docs/model.md, "Optimizer".
"""
from __future__ import annotations

import numpy as np

from comet_dse.cost import collectives as coll
from comet_dse.cost.pipeline import StageParams
from comet_dse.cost.shapes import FP32, joint_spans
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import Zero


def optimizer_step_bytes(dtype_is_fp16, sixteen_bit_grads=False):
    """Bytes moved per parameter the optimizer updates by a mixed-precision Adam step (Megatron-LM passes).

    Adam itself (fused): read fp32 weight, grad, m, v (16), write weight, m, v (12);
    grad-norm for clipping: read grad (4); copy fp32 weights to the 16-bit
    model (read 4, write 2).
    fp16 adds loss scaling: cast the fp16 grads to fp32 (read 2, write 4) and
    unscale with an inf/nan check (read 4, write 4).
    fp16: 28 + 4 + 6 + 6 + 8 = 52 bytes; bf16/fp8 (fp32 main grads): 28 + 4 + 6 = 38;
    bf16/fp8 with 16-bit gradients (grad_precision 16-bit): Adam and the norm
    touch 2-byte gradients: 38 - 2 x 2 = 34.
    Zeroing the gradient buffer is a separate pass over every gradient the
    device holds (``grad_zeroing_params``), not only the ones it updates.
    """
    return np.where(dtype_is_fp16, 52.0, np.where(sixteen_bit_grads, 34.0, 38.0))


def grad_zeroing_params(params: StageParams, st: StrategyArrays, shards: tuple):
    """Gradients per device the step zeroes before the next one: the whole local buffer below ZeRO 2, the shard
    from ZeRO 2 on [elements].

    Megatron-Core's distributed optimizer (ZeRO 1) reduce-scatters into a full-size gradient buffer and
    zeroes all of it every step (``DistributedDataParallel.zero_grad_buffer``: ``grad_data.zero_()``, one
    memset of g bytes per local parameter), although each rank updates only its shard; with ZeRO 2 and 3 the
    gradients kept are the shard. ``shards``: the DP and expert-DP shard counts (``shard_size``).
    """
    grads_sharded = st.zero >= Zero.GRADIENTS
    return (params.shared / np.where(grads_sharded, shards[0], 1)
            + params.expert / np.where(grads_sharded, shards[1], 1))


GRAD_NORM_BYTES = FP32   # the squared gradient norm of one device's shard: one fp32 value


def step_scalar_reductions(st: StrategyArrays, ctx, is_fp16):
    """The step's scalar all-reduces before the optimizer may update [s] (latency-bound).

    Gradient clipping (Megatron-LM ``clip_grad_norm_fp32``): every device sums the squares of the gradients
    it holds (the read is in ``optimizer_step_bytes``) and all-reduces that one fp32 value over the devices
    holding different gradients: the TP and PP ranks, and with ZeRO >= 1 (each DP x CP rank holds a shard)
    the DP and CP ranks too. fp16 adds the loss scaler's found-inf check, one more scalar all-reduce over the
    same group (Megatron-LM ``MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan``):
        T = (1 + [fp16]) AR(4 B, tp x pp (x dp x cp with ZeRO >= 1))
    """
    spans = ctx.spans
    sharded = st.zero >= Zero.OPTIMIZER
    shard = [np.where(sharded, d * c, 1.0) for d, c in zip(spans["dp"], spans["cp"])]
    group = joint_spans(joint_spans(spans["tp"], spans["pp"]), shard)
    return np.where(is_fp16, 2.0, 1.0) * coll.all_reduce_time(GRAD_NORM_BYTES, ctx.dims, group)


def separate_accumulation_bytes(grad_el_bytes):
    """main_grad += grad per micro-batch: read main (g) + read grad (2) + write main (g) bytes/param."""
    return 2.0 * grad_el_bytes + 2.0


# fp8 training casts each 16-bit weight to fp8 and its transpose once per step, on the first micro-batch
# (Transformer Engine's is_first_microbatch weight cache, which Megatron-LM and NeMo pass): read 2, write
# 1 + 1 bytes per parameter (TE fp8_cast_transpose_fused).
FP8_WEIGHT_CAST_BYTES = 4.0
