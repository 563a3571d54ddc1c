"""Step 7: one training iteration, evaluated for many design points at once (numpy arrays).

This is the single copy of the step-time and memory math: ``estimate`` calls
it with a batch of one, sweeps with millions. Every term is explained in
docs/model.md; the schedule is Megatron-LM's 1F1B with optional
interleaving (Narayanan et al. 2021, Sec. 2.2):

    T_step = (m + (p-1)/v) * (t_stage + t_p2p) + T_dp,exposed + T_optimizer + T_offload + T_overhead

where t_stage is the slowest pipeline stage's forward + backward (+
recompute) time for one micro-batch, including its exposed TP, EP and CP
communication (cost/pipeline.py: stage_work, over cost/microbatch_pass.py's
terms). ``evaluate`` takes the rooms in the order of a step (docs/architecture.md,
"The cost rooms"): the per-layout terms and the per-micro-batch terms (through
cost/cache.py), the slowest stage and its send/recv (cost/pipeline.py), memory
and its placement (cost/memory.py), FLOPs (cost/flops.py), the data-parallel
exposure (cost/data_parallel.py) and the expansion tier (cost/expansion.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost.cache import layout_grouped, microbatch_terms_grouped
from comet_dse.cost.data_parallel import exposed_data_parallel
from comet_dse.cost.distinct import gathered
from comet_dse.cost.expansion import (
    host_offload_time, offload_time, remote_compute_per_pass, remote_per_pass, stage_pass_flops,
)
from comet_dse.cost.flops import step_flops
from comet_dse.cost.layer_work import STAGE_KEYS, contention, work_total
from comet_dse.cost.memory import place, step_memory
from comet_dse.cost.pipeline import backward_total, forward_total, pipeline_p2p, stage_work
from comet_dse.cost.shapes import ACTIVATION_BYTES, context_of, network_dims
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import GradAccumulation, PipelineEngine


@dataclass
class StepArrays:
    """Results for a batch of design points; every field is an array of the batch length."""

    breakdown: dict          # part -> seconds, parts add up to step_time
    phases: dict             # forward/backward/recompute seconds on the critical stage
    memory: dict             # part -> bytes per device (busiest stage)
    memory_total: np.ndarray
    hbm_bytes: np.ndarray
    expansion_bytes: np.ndarray
    step_time: np.ndarray
    model_flops: np.ndarray
    hardware_flops: np.ndarray
    tokens_per_second: np.ndarray
    mfu: np.ndarray            # model FLOPs / (devices x peak(dtype) x step time)
    hfu: np.ndarray            # the same with hardware FLOPs (recomputation included)
    fits: np.ndarray
    microbatches: np.ndarray
    stage_layers: np.ndarray
    last_stage_memory: np.ndarray   # bytes per device of the last pipeline rank, its reserve included
    host_bytes: np.ndarray | None = None   # bytes per device in host memory (recommendation tables; None: unused)


def evaluate(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays) -> StepArrays:
    """Step time, breakdown and memory for every strategy in ``st`` (same model, cluster, devices).

    The layout terms (cost/layout.py) and the micro-batch terms
    (cost/microbatch_pass.py) are computed once per distinct layout and
    micro-batch shape; this function combines them per point.
    """
    contexts = {}      # one Context per batch it is asked for: the whole batch when neither term groups

    def context(sub: StrategyArrays):
        if id(sub) not in contexts:
            contexts[id(sub)] = (sub, context_of(model, cluster, devices, sub))
        return contexts[id(sub)][1]

    lay_groups, lay_rows = layout_grouped(model, cluster, devices, st, context)
    lay = lay_groups if lay_rows is None else gathered(lay_groups, lay_rows[1])
    p, d, v, b = st.pp, st.dp, st.interleave, st.micro_batch
    s, h = model.seq_len, model.hidden
    e = ACTIVATION_BYTES
    m = st.global_batch / (d * b)
    terms_groups, terms_rows = microbatch_terms_grouped(model, cluster, devices, st, lay.strides, context)
    work = {k: terms_groups.pop(k) for k in list(terms_groups) if k.split(".")[-1] in STAGE_KEYS + ("total",)}
    terms = terms_groups if terms_rows is None else gathered(terms_groups, terms_rows[1])
    stage = stage_work(model, lay.mixes, (lay_groups, lay_rows), (work, terms_rows))
    stage["bwd_mem"] = stage["bwd_mem"] + np.where(st.uses(GradAccumulation.FUSED), 0.0, lay.accumulate)

    fwd, bwd = forward_total(stage), backward_total(stage)

    whole = st.uses(PipelineEngine.DEEPSPEED)   # every TP rank sends the whole activation, nothing to gather
    # communication kernels beside compute slow it (cost/microbatch_pass.py: contention); none where they take no units
    u = cluster.accelerator.comm_units / cluster.accelerator.compute_units
    p2p, p2p_hidden = pipeline_p2p(st, network_dims(cluster, devices), lay.pp_spans, fwd, bwd,
                                    np.where(whole, 0.0, terms["regather"]),
                                    b * s / st.cp * h * e / np.where(whole, 1.0, st.tp), hidden_too=u > 0)
    if u > 0:        # send/recv beside the next chunk's compute
        stage["fwd_math"] = stage["fwd_math"] + contention(u, p2p_hidden[0])
        stage["bwd_math"] = stage["bwd_math"] + contention(u, p2p_hidden[1])

    stage_mb = work_total(stage)
    bubble = (p - 1) / v * (stage_mb + p2p)

    memory, act_per_mb, last_stage, on_host = step_memory(model, st, terms, lay.memory, lay.mixes, m, cluster)
    acc = cluster.accelerator
    exp_cap = acc.expansion.capacity if acc.expansion else 0.0
    memory_total = _added(memory.values())
    placed = place(memory, acc.state_capacity, exp_cap, memory_total)
    fits = placed.fits
    offloads = bool(np.any(st.activation_offload > 0))
    if offloads:        # the offloaded activations must fit the device's share of host memory
        fits = fits & (on_host <= (acc.host.capacity if acc.host else 0.0))

    flops = step_flops(model, st)
    dp_fwd, dp_bwd = fwd, bwd
    roofline = None
    if acc.expansion is not None and np.any(st.expansion_roofline):
        # a pass that streams spilled data from the tier lasts max(its work, the stream, its work on spilled
        # operands at the tier's compute roof) (the roofline below), and the data-parallel reduction hides
        # behind that whole duration
        remote_f, remote_b = remote_per_pass(acc, placed, memory, act_per_mb)
        if acc.expansion.compute is not None:
            capped_f, capped_b = remote_compute_per_pass(acc.expansion.compute, placed, memory,
                                                          stage_pass_flops(model, st, lay.stage_layers, m, flops))
            remote_f, remote_b = np.maximum(remote_f, capped_f), np.maximum(remote_b, capped_b)
        dp_fwd = np.where(st.expansion_roofline, np.maximum(fwd, remote_f), fwd)
        dp_bwd = np.where(st.expansion_roofline, np.maximum(bwd, remote_b), bwd)
        roofline = (st.expansion_roofline, fwd, bwd, remote_f, remote_b, (p - 1) / v)
    dp_exposed, dp_hidden = exposed_data_parallel(st, dp_fwd, dp_bwd, lay.dp, m, np.maximum(lay.stage_layers, 1.0),
                                           u > 0)
    # fp8 amax all-reduces: every micro-batch of every stage, on the critical path like the stage's work
    dp_exposed = dp_exposed + (m + (p - 1) / v) * lay.amax
    dp_slowdown = contention(u, dp_hidden)
    optimizer = lay.optimizer

    offload = offload_time(acc, placed, memory, act_per_mb, m,
                            overlap=(st.expansion_overlap, fwd, bwd, optimizer, dp_exposed), roofline=roofline)
    if offloads:
        offload = offload + host_offload_time(acc, st.activation_offload * act_per_mb, m, fwd, bwd)

    breakdown = {
        "compute": m * (stage["fwd_math"] + stage["bwd_math"] + stage["rec_math"]) + dp_slowdown,
        "memory": m * (stage["fwd_mem"] + stage["bwd_mem"] + stage["rec_mem"]) + lay.weight_cast,
        "tp_communication": m * stage["tp"],
        "cp_communication": m * stage["cp"],
        "ep_communication": m * stage["ep"],
        "embedding_communication": np.zeros_like(optimizer),     # a recommendation model's (cost/recommendation.py)
        "pp_communication": m * p2p,
        "pipeline_bubble": bubble,
        "dp_communication": dp_exposed,
        "optimizer": optimizer,
        "offload": offload,
        "overhead": cluster.step_overhead + m * cluster.microbatch_overhead + np.zeros_like(optimizer),
    }
    phases = {
        "forward": m * (stage["fwd_math"] + stage["fwd_mem"]),
        "backward": m * (stage["bwd_math"] + stage["bwd_mem"]),
        "recompute": m * (stage["rec_math"] + stage["rec_mem"]),
    }
    model_flops, hw_flops = flops
    step_time = _added(breakdown.values())
    capacity = devices * st.dtype_table(cluster.accelerator.peak_flops) * step_time
    return StepArrays(
        breakdown=breakdown, phases=phases, memory=memory, memory_total=memory_total,
        hbm_bytes=placed.hbm, expansion_bytes=placed.expansion, step_time=step_time,
        model_flops=model_flops, hardware_flops=hw_flops,
        tokens_per_second=st.global_batch * model.seq_len / step_time,
        mfu=model_flops / capacity, hfu=hw_flops / capacity, fits=fits, microbatches=m,
        stage_layers=lay.stage_layers, last_stage_memory=last_stage,
        host_bytes=on_host + np.zeros_like(step_time) if offloads else None,
    )


def _added(values):
    """a + b + c + ... of ``values`` in their order (``sum`` would start with 0 + a, one more full-size pass)."""
    values = iter(values)
    total = next(values)
    for value in values:
        total = total + value
    return total
