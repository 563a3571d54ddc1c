"""AMD's fused attention (docs/hardware.md, "Attention outside Hopper"): the model at aiter's benchmark shape gives
aiter's published rates, and AMD searches run fused attention with it by default."""
from __future__ import annotations

import dataclasses as dc

import pytest
from test_gpu_truth import _bench_device

import comet_dse
from comet_dse.cost.kernels import Device, attention_rate
from comet_dse.presets.catalog import load_cluster

# ROCm/aiter op_tests/cpp/mha/README.md @a83421bee: bf16, batch 1, 64 query heads, 16384 tokens, head dim 128,
# causal; forward and backward (fp32 dQ accumulation) [FLOP/s]
AITER = {"mi300x": (541.55e12, 412.04e12), "mi355x": (1392.485e12, 808.93e12)}


def _device(preset: str) -> Device:
    """The preset's device at burst clocks (a kernel benchmark) with its per-head-dim attention kernels."""
    return dc.replace(_bench_device(load_cluster(preset)), sustained=1.0, sustained16=1.0, head_dim_kernels=True)


@pytest.mark.parametrize("preset", sorted(AITER))
def test_aiter_at_its_benchmark_shape_gives_the_published_rates(preset):
    forward, backward = load_cluster(preset).accelerator.attention_efficiency["aiter"]
    dev = _device(preset)
    measured_forward, measured_backward = AITER[preset]
    assert float(attention_rate(64, 16384, 16384, 128, forward, dev)) == pytest.approx(measured_forward, rel=2e-3)
    assert float(attention_rate(64, 16384, 16384, 128, backward, dev)) == pytest.approx(measured_backward, rel=2e-3)


def test_mi325x_takes_the_mi300x_absolute_rates():
    """The same CDNA 3 compute dies and peak: the same TFLOP/s at the benchmark shape (an assumption)."""
    ours, theirs = _device("mi325x"), _device("mi300x")
    for mine, other in zip(load_cluster("mi325x").accelerator.attention_efficiency["aiter"],
                           load_cluster("mi300x").accelerator.attention_efficiency["aiter"]):
        assert float(attention_rate(64, 16384, 16384, 128, mine, ours)) == pytest.approx(
            float(attention_rate(64, 16384, 16384, 128, other, theirs)), rel=3e-3)


def test_amd_searches_run_fused_attention_with_aiter():
    """With a measured rate listed, a search on an AMD preset runs flash attention with aiter by default, and a
    fused kernel the preset does not list (FlashAttention-3, Hopper's) is refused by its rule."""
    result = comet_dse.search("llama3-8b", "mi355x", 8, global_batch=32)
    for rank in (1, 2, 3):
        chosen = result.strategy(rank)
        assert chosen.flash_attention and chosen.attention_kernel.value == "aiter"
    est = comet_dse.estimate("llama3-8b", "mi300x", 8, global_batch=32, flash_attention=True, attention_kernel="fa3")
    assert "attention_kernel" in est.broken_rules
