"""Step 6 gathered: the step's terms that depend only on the parallel layout, assembled once per layout.

The layout is the knobs declared ``layout=True`` on Strategy
(``LAYOUT_KNOBS``): the parallel degrees and their placement, the pipeline
split, the dtype and gradient precision, the ZeRO stage and its sharding
switches. From them follow the spans of the parallel groups, which layers
each candidate pipeline stage holds, its parameters and model-state bytes,
and the data-parallel, ZeRO-3 and optimizer costs that do not depend on the
micro-batch schedule (cost/pipeline.py, memory.py, data_parallel.py, optimizer.py compute them; this room
assembles them). cost/step.py combines these per point with the micro-batch terms; cost/cache.py computes
them once per distinct layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost.data_parallel import DataParallelComm, amax_reduction, data_parallel_comm, shard_size
from comet_dse.cost.kernels import memory_pass_time
from comet_dse.cost.memory import grad_bytes, state_bytes
from comet_dse.cost.optimizer import (
    FP8_WEIGHT_CAST_BYTES, grad_zeroing_params, optimizer_step_bytes, separate_accumulation_bytes,
    step_scalar_reductions,
)
from comet_dse.cost.pipeline import embedding_slots, stage_candidates, stage_layer_counts, stage_mixes, stage_params
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import Dtype, GradPrecision, Zero


@dataclass(frozen=True)
class Layout:
    """The layout terms of a batch of points (arrays over the points; a scalar where equal for all).

    strides: the TP and DP device-number strides (StrategyArrays.strides), part
      of the micro-batch terms' de-duplication key;
    pp_spans: the pipeline group's span per network dimension;
    mixes: (dense layers, MoE layers, holds embedding, holds head) of each
      candidate stage (cost/pipeline.py: stage_mixes);
    stage_layers: transformer layers of the fullest stage;
    memory: per candidate stage, model-state bytes per device ("weights",
      "gradients", "optimizer") and its "n_dense" and "n_moe" layers;
    accumulate: one separate fp32 gradient accumulation pass [s];
    optimizer: the optimizer step [s];
    dp: the data-parallel collectives (DataParallelComm);
    weight_cast: fp8 training's cast of the stage's weights, once per step (none with fp8_fused_cast) [s];
    amax: fp8_amax_reduction's blocking all-reduces of one micro-batch on one stage [s].
    """

    strides: dict
    pp_spans: list
    mixes: list
    stage_layers: object
    memory: list
    accumulate: object
    optimizer: object
    dp: DataParallelComm
    weight_cast: object = 0.0
    amax: object = 0.0


def layout_terms(model: Transformer, st: StrategyArrays, ctx) -> Layout:
    """The Layout of the points of ``st`` (``ctx``: their Context, cost/microbatch_pass.py: context_of);
    reads only the LAYOUT_KNOBS of ``st``."""
    slots = embedding_slots(st)
    mixes = stage_mixes(model, st.pp, slots)
    candidates = stage_candidates(model, st, mixes)     # their layer counts are the mixes' arrays: gathered once
    params = stage_params(candidates)
    is_fp16 = st.uses(Dtype.FP16)
    sixteen_grads = st.uses(GradPrecision.SIXTEEN_BIT)
    gbytes = grad_bytes(is_fp16 | sixteen_grads)
    accumulate = memory_pass_time(params.total * separate_accumulation_bytes(gbytes), ctx.dev).total
    sharded = st.zero >= Zero.OPTIMIZER
    shards = (shard_size(st, ctx, "dp"), shard_size(st, ctx, "edp"))
    opt_params = params.shared / np.where(sharded, shards[0], 1) + params.expert / np.where(sharded, shards[1], 1)
    optimizer = (memory_pass_time(opt_params * optimizer_step_bytes(is_fp16, sixteen_grads), ctx.dev).total
                 + memory_pass_time(grad_zeroing_params(params, st, shards) * gbytes, ctx.dev).total
                 + step_scalar_reductions(st, ctx, is_fp16))
    stage_layers = stage_layer_counts(model.layers, st.pp, slots)[2]
    is_fp8 = st.uses(Dtype.FP8)
    cast_pass = memory_pass_time(params.total * FP8_WEIGHT_CAST_BYTES, ctx.dev).total
    weight_cast = np.where(is_fp8 & ~st.fp8_fused_cast, cast_pass, 0.0)
    return Layout(
        strides={"tp": ctx.strides["tp"], "dp": ctx.strides["dp"]}, pp_spans=ctx.spans["pp"],
        mixes=mixes, stage_layers=stage_layers,
        memory=state_bytes(model, st, candidates, gbytes, shards), accumulate=accumulate, optimizer=optimizer,
        dp=data_parallel_comm(model, st, ctx, params, gbytes, np.maximum(stage_layers, 1.0)),
        weight_cast=weight_cast, amax=amax_reduction(model, st, ctx, stage_layers, is_fp8),
    )
