"""Step 1 of a training step's cost: the shapes of a design point, before any work is timed.

What every later room reads: the device's rates for the point's dtype and attention kernel (``device_of``:
the cost model's Device), the network dimensions sized for the device count, the span of every parallel
group on them (TP, CP, PP, DP, EP, expert-DP; ``context_of``), and the per-device sizes of one layer for one
micro-batch (``LayerShape``). Element sizes: 16-bit activations also in fp8 training (Transformer Engine),
GEMM inputs of 1 byte in fp8. All arrays over design points.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost import collectives as coll
from comet_dse.cost.kernels import Device
from comet_dse.hardware.efficiency import kind_of
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import AttentionKernel


FP32 = 4.0


DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


ACTIVATION_BYTES = 2.0          # activations stay 16-bit, also in fp8 training (Transformer Engine)


@dataclass(frozen=True)
class LayerShape:
    """Per-device sizes of one layer for one micro-batch (arrays over design points).

    b micro-batch, s sequence, t TP degree, cp context-parallel degree (each
    device holds s/cp tokens of every sequence), ep expert-parallel degree,
    imbalance: tokens the busiest expert device gets relative to a balanced router.
    """

    b: object
    s: object
    t: object
    sp: object
    flash: object
    e: object          # bytes per activation element (2 for bf16/fp16)
    gemm_e: object     # bytes per GEMM input element (1 for fp8)
    cp: object = 1.0
    ep: object = 1.0
    imbalance: object = 1.0
    dispatcher: object = 0     # MoeDispatcher code: 0 alltoall, 1 flex, 2 fused

    @property
    def tokens(self):
        """Tokens of the micro-batch on one device: b*s/cp."""
        return self.b * self.s / self.cp

    @property
    def norm_tokens(self):
        """Tokens each device holds in the norm/dropout region: tokens/t with SP, else tokens."""
        return np.where(self.sp, self.tokens / self.t, self.tokens)


def fp8_of(shape: LayerShape):
    """1.0 where the GEMM inputs are fp8 (1 byte), else 0.0."""
    return np.where(np.asarray(shape.gemm_e) < 2, 1.0, 0.0)


def device_of(cluster: Cluster, st: StrategyArrays, moe=None, kind: str | None = None) -> Device:
    """Cost-model view of the accelerator for the dtypes and attention kernels of ``st``, for a dense
    (``moe`` falsy) or mixture-of-experts model, or the ``kind`` of model given ("recommendation"): its tensor
    rates carry the training efficiency of that family where the cluster has one (hardware/efficiency.py),
    else the physical tensor_sustained.

    A kernel the accelerator has no attention_efficiency for is NaN (the
    attention_kernel validity rule); an accelerator without any runs every
    kernel at matmul_efficiency.
    """
    acc = cluster.accelerator
    peaks = acc.peak_flops
    bf16 = peaks.get("bf16", peaks.get("fp16", np.nan))
    sixteen = st.dtype_table({"bf16": bf16, "fp16": peaks.get("fp16", bf16), "fp8": bf16})
    attn_fwd, attn_bwd = attention_efficiencies(cluster, st)
    kind = kind or kind_of(moe)
    sustained = st.dtype_table({d: acc.sustained(d, kind) for d in peaks})
    # 16-bit kernels of a step (attention): the physical 16-bit fraction, or the step's family's efficiency
    sustained16 = sustained if acc.training_efficiency else acc.sustained("bf16" if "bf16" in peaks else "fp16")
    return Device(
        peak=st.dtype_table(acc.peak_flops), matmul_eff=st.dtype_table(acc.matmul_efficiencies()),
        matmul_eff16=acc.matmul_efficiency, units=acc.compute_units,
        tile_m=acc.matmul_tile[0], tile_n=acc.matmul_tile[1], tile_k=acc.matmul_tile[2],
        pipeline_overhead=acc.matmul_pipeline_overhead,
        sram_cap=acc.sram.capacity, sram_bw=acc.sram.achievable_bandwidth,
        hbm_bw=acc.hbm.achievable_bandwidth, vector=acc.vector_flops, overhead=acc.kernel_overhead,
        peak16=sixteen, attn_fwd=attn_fwd, attn_bwd=attn_bwd,
        sustained=sustained, sustained16=sustained16,
        comm_share=acc.comm_units / acc.compute_units, head_dim_kernels=bool(acc.attention_efficiency),
    )


def attention_efficiencies(cluster: Cluster, st: StrategyArrays) -> tuple:
    """(forward, backward) efficiency of each point's attention kernel (the accelerator's
    attention_efficiency; NaN for a kernel it has none for; matmul_efficiency for every kernel when it
    has none at all)."""
    acc = cluster.accelerator
    rates = acc.attention_efficiency or {k.value: (acc.matmul_efficiency,) * 2 for k in AttentionKernel}
    per_kernel = [rates.get(k.value, (np.nan, np.nan)) for k in AttentionKernel]
    return (st.select(st.attention_kernel, [r[0] for r in per_kernel]),
            st.select(st.attention_kernel, [r[1] for r in per_kernel]))


@dataclass(frozen=True)
class Context:
    """What every term needs: the device, the network dimensions, each group's span, the layer shape."""

    dev: Device
    dims: tuple
    spans: dict        # group name (tp, cp, pp, dp, ep, edp) -> spans per dimension
    shape: LayerShape
    strides: dict      # group name -> device-number stride (StrategyArrays.strides)


def network_dims(cluster: Cluster, devices: int) -> tuple:
    """The cluster's network dimensions as the cost model sees them, sized for ``devices``."""
    return tuple(coll.Dim.of(d, n) for d, n in zip(cluster.network, cluster.dim_sizes(devices)))


def context_of(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays) -> Context:
    """Device view, network dimensions for ``devices``, and the spans of every parallel group.

    Groups: TP (size tp), CP (cp), PP (pp), DP (dp), EP (ep consecutive DP
    ranks) and expert-DP (dp/ep, stepping over EP groups); strides from
    ``StrategyArrays.strides`` (placement).
    """
    dims = network_dims(cluster, devices)
    shape = LayerShape(b=st.micro_batch, s=model.seq_len, t=st.tp, sp=st.sequence_parallel,
                       flash=st.flash_attention, e=ACTIVATION_BYTES, gemm_e=st.dtype_table(DTYPE_BYTES),
                       cp=st.cp, ep=st.ep, imbalance=st.moe_imbalance, dispatcher=st.moe_dispatcher)
    stride = st.strides()
    sizes = {"tp": st.tp, "cp": st.cp, "pp": st.pp, "dp": st.dp, "ep": st.ep, "edp": st.dp / st.ep}
    spans = {g: coll.spans(dims, stride[g], sizes[g]) for g in sizes}
    return Context(dev=device_of(cluster, st, model.moe), dims=dims, spans=spans, shape=shape, strides=stride)


def joint_spans(a: list, b: list) -> list:
    """Spans of two orthogonal groups taken together (CP and DP reduce gradients jointly)."""
    return [x * y for x, y in zip(a, b)]
