"""Activation memory and per-layer costs against Korthikanti et al. 2022 (arXiv:2205.05198)."""
import numpy as np
import pytest

from comet_dse.cost.layer_ops import layer_cost
from comet_dse.cost.shapes import LayerShape, device_of
from comet_dse.model.spec import MLP, Attention, Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import Strategy


def _gpt(h=6144, a=64, s=2048):
    return Transformer(name="t", layers=48, hidden=h, attention=Attention(a, a, h // a), mlp=MLP(4 * h),
                       vocab=51200, seq_len=s)


def _shape(b, s, t, sp, flash=False):
    return LayerShape(b=np.array([float(b)]), s=s, t=np.array([float(t)]), sp=np.array([sp]),
                      flash=np.array([flash]), e=2.0, gemm_e=np.array([2.0]))


@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("b", [1, 4])
def test_saved_activations_match_korthikanti_eq(a100, t, b):
    h, a, s = 6144, 64, 2048
    model = _gpt(h, a, s)
    dev = device_of(a100, StrategyArrays.of([Strategy(dtype="bf16")]))
    plain = layer_cost(model, _shape(b, s, t, False), dev).saved_bytes[0]
    sp = layer_cost(model, _shape(b, s, t, True), dev).saved_bytes[0]
    assert plain == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)  # Eq. (2)
    assert sp == pytest.approx(s * b * h / t * (34 + 5 * a * s / h), rel=1e-12)                # Eq. (4)


def test_selective_drops_exactly_the_score_tensors(a100):
    h, a, s, b, t = 6144, 64, 2048, 4, 8
    cost = layer_cost(_gpt(h, a, s), _shape(b, s, t, True), device_of(a100, StrategyArrays.of([Strategy(dtype="bf16")])))
    kept = cost.saved_bytes[0] - cost.attention_core_bytes[0]
    assert kept == pytest.approx(34 * s * b * h / t, rel=1e-12)  # Korthikanti Eq. (6) with SP
    assert cost.input_bytes[0] == pytest.approx(2 * s * b * h / t)  # full recompute keeps the input


def test_flash_attention_stores_no_scores(a100):
    h, a, s, b, t = 4096, 32, 8192, 1, 1
    dev = device_of(a100, StrategyArrays.of([Strategy(dtype="bf16")]))
    std = layer_cost(_gpt(h, a, s), _shape(b, s, t, False), dev)
    flash = layer_cost(_gpt(h, a, s), _shape(b, s, t, False, flash=True), dev)
    assert flash.attention_core_bytes[0] == 0.0
    # 5 a s^2 b bytes of scores replaced by a fp32 log-sum-exp per row (4 a s b).
    assert std.saved_bytes[0] - flash.saved_bytes[0] == pytest.approx(5 * a * s * s * b - 4 * a * s * b, rel=1e-12)
    assert flash.forward.total[0] < std.forward.total[0]


def test_fp8_keeps_the_linear_layers_inputs_in_one_byte(a100):
    """Transformer Engine saves the fp8 copies its GEMMs read: per token, the two block inputs (2h), the
    output projection's input (h) and the down projection's input (4h) shrink from 2 bytes to 1."""
    h, a, s, b = 6144, 64, 2048, 1
    model = _gpt(h, a, s)
    dev = device_of(a100, StrategyArrays.of([Strategy(dtype="bf16")]))
    bf16 = layer_cost(model, _shape(b, s, 1, False), dev).saved_bytes[0]
    fp8_shape = LayerShape(b=np.array([1.0]), s=s, t=np.array([1.0]), sp=np.array([False]),
                           flash=np.array([False]), e=2.0, gemm_e=np.array([1.0]))
    fp8 = layer_cost(model, fp8_shape, dev).saved_bytes[0]
    assert bf16 - fp8 == pytest.approx(s * b * (2 * h + h + 4 * h) * 1.0, rel=1e-12)
