"""Issue 31's mechanisms, each against its source or a hand calculation: the sustained tensor rate of each
GPU preset (the model at the burn test's shape gives the burn test's rate), the Blackwell attention kernel
(the model at FlashAttention-4's benchmark shape gives the benchmark's rate), each framework's rank order in
the validation, and the gradient buffer zeroed whole below ZeRO 2."""
import dataclasses as dc

import numpy as np
import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.cost.kernels import Device, attention_rate, matmul_rate
from comet_dse.cost.optimizer import grad_zeroing_params, optimizer_step_bytes
from comet_dse.cost.pipeline import StageParams
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import Strategy


def _bench_device(cluster, dtype="bf16") -> Device:
    acc = cluster.accelerator
    tm, tn, tk = acc.matmul_tile
    return Device(peak=acc.peak_flops[dtype], matmul_eff=acc.matmul_efficiencies()[dtype], units=acc.compute_units,
                  tile_m=tm, tile_n=tn, tile_k=tk, pipeline_overhead=acc.matmul_pipeline_overhead, sram_cap=1.0,
                  sram_bw=1.0, hbm_bw=1.0, vector=1.0, overhead=0.0, peak16=acc.peak_flops["bf16"],
                  sustained=acc.sustained(dtype), sustained16=acc.sustained("bf16"))


# huggingface/gpu-fryer README reference table: 60 s of back-to-back 8192^3 cuBLASLt bf16 GEMMs [FLOP/s]
GPU_FRYER_BF16 = {"dgx-h100": 730e12, "gb200-nvl72": 1550e12}


@pytest.mark.parametrize("preset", sorted(GPU_FRYER_BF16))
def test_the_sustained_rate_at_the_burn_tests_shape_is_the_burn_tests_rate(preset):
    rate = float(matmul_rate(1, 8192, 8192, 8192, _bench_device(load_cluster(preset))))
    assert rate == pytest.approx(GPU_FRYER_BF16[preset], rel=2e-3)


def test_gpus_without_their_own_burn_test_take_their_siblings_figure():
    """H200 and H800: the H100's GH100 die at the same 700 W; B200: the GB200's Blackwell die (docs/hardware.md)."""
    h100, b_gb200 = load_cluster("dgx-h100").accelerator, load_cluster("gb200-nvl72").accelerator
    for name in ("dgx-h200", "dgx-h800"):
        assert load_cluster(name).accelerator.sustained("bf16") == h100.sustained("bf16")
    assert load_cluster("dgx-b200").accelerator.sustained("bf16") == b_gb200.sustained("bf16")
    # the A100's burn test (gpu-fryer ~270 TFLOP/s) is above the model's burst at that shape: it keeps 1.0
    a100 = load_cluster("dgx-a100-80gb")
    assert a100.accelerator.sustained("bf16") == 1.0
    assert float(matmul_rate(1, 8192, 8192, 8192, _bench_device(a100))) < 270e12


def test_fp8_takes_the_bf16_clock_ratio():
    for name in ("dgx-h100", "gb200-nvl72", "dgx-b200"):
        acc = load_cluster(name).accelerator
        assert acc.sustained("fp8") == acc.sustained("bf16") < 1.0


def test_fa4_at_its_benchmark_shape_gives_the_published_rate():
    """flash-attention PR #2280 on a B200: head dim 128, 8k tokens, batch 4 x 16 heads, causal: forward 1418.1,
    backward 1208.6 TFLOP/s (a burst benchmark: the sustained fraction is left out here)."""
    b200 = load_cluster("dgx-b200")
    dev = dc.replace(_bench_device(b200), sustained16=1.0)
    forward, backward = b200.accelerator.attention_efficiency["fa4"]
    assert float(attention_rate(64, 8192, 8192, 128, forward, dev)) == pytest.approx(1418.1e12, rel=2e-3)
    assert float(attention_rate(64, 8192, 8192, 128, backward, dev)) == pytest.approx(1208.6e12, rel=2e-3)


def test_blackwell_searches_run_fused_attention_and_hopper_has_no_fa4():
    model = load_model("llama3-8b")
    b200 = estimate(model, load_cluster("dgx-b200"), 8, Strategy(dp=8, global_batch=8, flash_attention=True,
                                                                    attention_kernel="fa4"))
    assert b200.feasible
    h100 = estimate(model, load_cluster("dgx-h100"), 8, Strategy(dp=8, global_batch=8, flash_attention=True,
                                                                    attention_kernel="fa4"))
    assert "attention_kernel" in h100.broken_rules


def test_megatron_order_keeps_part_of_the_data_parallel_group_inside_the_node():
    """TP 4 on 8-GPU nodes: under tp-dp-pp two DP ranks share a node (stride 4), under tp-pp-dp none do (stride
    32): the reduction's inter-node bytes halve, so the exposed DP time can only fall."""
    model, h100 = load_model("gpt3-175b"), load_cluster("dgx-h100")
    base = Strategy(tp=4, pp=8, dp=64, global_batch=512, interleave=12, sequence_parallel=True, zero=1,
                    dtype="fp8", flash_attention=True, attention_kernel="cudnn")
    outer = estimate(model, h100, 2048, base)
    inner = estimate(model, h100, 2048, dc.replace(base, placement="tp-dp-pp"))
    assert inner.breakdown_s["dp_communication"] < outer.breakdown_s["dp_communication"]
    assert inner.step_time_s < outer.step_time_s


def test_the_gradient_buffer_is_zeroed_whole_below_zero_2():
    params = StageParams(shared=np.array([8e9, 8e9, 8e9]), expert=np.array([0.0, 0.0, 0.0]))
    st = StrategyArrays.of([Strategy(dp=8, zero=z) for z in (0, 1, 2)])
    zeroed = grad_zeroing_params(params, st, (np.full(3, 8.0), np.full(3, 8.0)))
    np.testing.assert_allclose(zeroed, [8e9, 8e9, 1e9])
    # the optimizer's own pass no longer counts the zeroing: 16 + 12 Adam, 4 norm, 6 copy
    assert float(optimizer_step_bytes(np.array(False))) == 38.0
    assert float(optimizer_step_bytes(np.array(True))) == 52.0
    assert float(optimizer_step_bytes(np.array(False), np.array(True))) == 34.0


def test_token_permutation_bytes_by_dispatcher():
    """(3k + 1) S + 4 R [local > 1] rows of h e bytes for alltoall, 4 R for flex, nothing for fused; each pass
    at the device's streaming bandwidth plus one launch."""
    from comet_dse.cost.layer_ops import _token_permutation

    dev = Device(peak=1e15, matmul_eff=1.0, units=100, tile_m=128, tile_n=128, tile_k=64, pipeline_overhead=2,
                 sram_cap=1.0, sram_bw=1e12, hbm_bw=1e12, vector=1e14, overhead=1e-6, peak16=1e15)
    sent, k, received, h, e = 1024.0, 8, 8192.0, 4096.0, 2.0
    times = {}
    for code, name in enumerate(("alltoall", "flex", "fused")):
        for local in (1.0, 4.0):
            fwd, bwd = _token_permutation(sent, k, received, local, h, e, np.array(code), dev)
            assert float(fwd.total) == float(bwd.total)
            times[name, local] = float(fwd.total)
    assert times["alltoall", 1.0] == pytest.approx((3 * k + 1) * sent * h * e / 1e12 + 1e-6)
    assert times["alltoall", 4.0] == pytest.approx(((3 * k + 1) * sent + 4 * received) * h * e / 1e12 + 1e-6)
    assert times["flex", 4.0] == pytest.approx(4 * received * h * e / 1e12 + 1e-6)
    assert times["fused", 1.0] == times["fused", 4.0] == 0.0


def test_a_job_that_cannot_fill_whole_racks_uses_equal_parts_of_them_in_whole_trays():
    gb200 = load_cluster("gb200-nvl72")
    assert gb200.dim_sizes(72) == (72, 1)
    assert gb200.dim_sizes(144) == (72, 2)
    assert gb200.dim_sizes(128) == (64, 2)      # NVIDIA's GB200 benchmarks: 16 of a rack's 18 trays
    assert gb200.dim_sizes(512) == (64, 8)
    assert gb200.dim_sizes(36) == (36, 1)       # inside one rack, as before
    # a domain of one node keeps refusing what it cannot fill (an 8-GPU DGX is not split)
    from comet_dse.base.errors import InputError
    with pytest.raises(InputError, match="multiple of 8"):
        load_cluster("dgx-h100").dim_sizes(12)
