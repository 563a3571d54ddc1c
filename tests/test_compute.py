"""Kernel-time terms against hand calculations."""
import numpy as np
import pytest

from comet_dse.cost.kernels import gemm_hbm_bytes, gemm_time, pipeline_efficiency, quantisation_efficiency, roofline
from comet_dse.cost.shapes import device_of
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import Strategy


def test_roofline_is_max_of_bounds_plus_overhead():
    t = roofline(np.array([2e12, 1e9]), 1e12, np.array([1e9, 2e12]), 1e12, 1e-6)
    assert t.total == pytest.approx([2.0 + 1e-6, 2.0 + 1e-6])
    assert t.math[0] > 0 and t.memory[0] == 0 and t.memory[1] > 0 and t.math[1] == 0


def test_wave_quantisation_on_a100(a100):
    dev = device_of(a100, StrategyArrays.of([Strategy(dtype="bf16")]))
    # 6912 x 16384 output in 256 x 128 tiles = 27 * 128 = 3456 tiles = 32 full waves of 108 SMs.
    assert float(quantisation_efficiency(1, 6912, 16384, dev)) == pytest.approx(1.0)
    # 8192 x 2304: 32 * 18 = 576 tiles -> 6 waves, last one 1/3 full: 576 / 648.
    assert float(quantisation_efficiency(1, 8192, 2304, dev)) == pytest.approx(576 / 648)


def test_pipeline_efficiency(a100):
    dev = device_of(a100, StrategyArrays.of([Strategy(dtype="bf16")]))
    assert pipeline_efficiency(6144, dev)[()] == pytest.approx(96 / 100)   # 96 k-steps of 64, 4 exposed
    assert pipeline_efficiency(96, dev)[()] == pytest.approx(2 / 6)


def test_more_sram_means_fewer_gemm_bytes():
    small = gemm_hbm_bytes(1, 8192, 8192, 8192, 2, 2, 4 * 2**20)
    large = gemm_hbm_bytes(1, 8192, 8192, 8192, 2, 2, 2**30)
    minimum = 2 * (3 * 8192 * 8192)
    assert large < small
    assert large == pytest.approx(minimum)   # everything fits: each operand read once


def test_large_gemm_time_by_hand(a100):
    dev = device_of(a100, StrategyArrays.of([Strategy(dtype="fp16")]))
    m, n, k = 6912, 16384, 2048
    t = gemm_time(1, m, n, k, 2.0, dev)
    rate = 312e12 * 0.859 * 1.0 * (32 / 36)
    assert t.total[0] == pytest.approx(2 * m * n * k / rate + 3e-6, rel=1e-9)
    assert t.memory[0] == 0.0
