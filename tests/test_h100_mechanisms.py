"""The terms added for today's GPUs (docs/model.md: communication kernels, the fp8 recipe, the step's scalar
reductions, the sustained tensor rate), each against a hand calculation."""
import dataclasses as dc

import numpy as np
import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.cost import collectives as coll
from comet_dse.cost.kernels import Device, gemm_time, pipeline_efficiency
from comet_dse.cost.layer_ops import _linear
from comet_dse.cost.layer_work import TP_OVERLAP_SM_SHARE, _pipelined, layer_work
from comet_dse.cost.shapes import LayerShape, context_of, device_of, network_dims
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import Strategy

H100 = load_cluster("dgx-h100", efficiency="physical")   # the mechanisms, at the burn-test rate
LLAMA8B = load_model("llama3-8b")
GPT3 = load_model("gpt3-175b")


def _acc(cluster, **changes):
    return dc.replace(cluster, accelerator=dc.replace(cluster.accelerator, **changes))


def _device(**fields) -> Device:
    base = dict(peak=1e15, matmul_eff=1.0, units=100, tile_m=128, tile_n=128, tile_k=64, pipeline_overhead=2,
                sram_cap=50 * 2**20, sram_bw=1e13, hbm_bw=2e12, vector=1e14, overhead=0.0, peak16=1e15,
                matmul_eff16=1.0)
    base.update(fields)
    return Device(**base)


# --- the fp8 GEMM's k tile holds the same bytes as a 16-bit one ----------------------------------------------

def test_fp8_gemm_has_half_the_main_loop_iterations():
    dev = _device()
    # k = 2048, 16-bit: 2048 / 64 = 32 iterations, 2 exposed: 32 / 34; fp8: 2048 / 128 = 16: 16 / 18
    assert float(pipeline_efficiency(2048, dev, 2.0)) == pytest.approx(32 / 34)
    assert float(pipeline_efficiency(2048, dev, 1.0)) == pytest.approx(16 / 18)


def test_h100_fp8_rate_at_a_long_k_matches_the_benchmark_it_comes_from():
    """MAMF's fp8 1402.6 TFLOP/s was measured at 1024 x 9216 x 14336 (best shape): the model at that shape
    gives the efficiency times its own tile terms (72 x 72 = 5184 tiles of 128 x 256... here 256 x 128: 4 x 72
    = 288 tiles on 132 SMs, 3 waves, 288 / 396; k: 14336 / 128 = 112 iterations, 112 / 114), times the
    preset's sustained fraction (0.962: gpu-fryer's 60 s burn against the model's burst at 8192^3)."""
    dev = device_of(H100, StrategyArrays.of([Strategy(dtype="fp8")]))
    flops = 2.0 * 1024 * 9216 * 14336
    t = gemm_time(1, 1024, 9216, 14336, 1.0, dev)
    rate = flops / (float(t.total[0]) - 3e-6)
    assert rate == pytest.approx(1978.9e12 * 0.709 * 0.962 * (288 / 396) * (112 / 114), rel=1e-6)


# --- communication kernels take compute units --------------------------------------------------------------

def test_tp_overlap_slows_the_gemms_by_the_share_of_sms_its_reduce_scatters_hold():
    st = StrategyArrays.of([Strategy(tp=8, pp=8, dp=1, global_batch=64, sequence_parallel=True, dtype="bf16",
                                     tp_overlap=True)])
    quiet = _acc(H100, comm_units=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        busy, layer = layer_work(GPT3, context_of(GPT3, H100, 64, st), st)
        free, _ = layer_work(GPT3, context_of(GPT3, quiet, 64, st), st)
    dims, spans = network_dims(H100, 64), context_of(GPT3, H100, 64, st).spans
    comm = layer.tp_messages * coll.all_reduce_time(layer.tp_message_bytes, dims, spans["tp"])
    hidden = comm - _pipelined(comm, layer.tp_gemm_forward, 8.0)
    assert float(busy["fwd_math"][0] - free["fwd_math"][0]) == pytest.approx(
        float((16 / 132) * TP_OVERLAP_SM_SHARE * hidden[0]))
    assert float(busy["tp"][0]) == pytest.approx(float(free["tp"][0]))     # the exposed part is the same


def test_without_overlap_communication_takes_no_compute_units():
    strategy = Strategy(tp=8, pp=1, dp=8, global_batch=64, dtype="bf16", dp_overlap=False, zero=1)
    busy = estimate(LLAMA8B, H100, 64, strategy)
    free = estimate(LLAMA8B, _acc(H100, comm_units=0), 64, strategy)
    assert busy.step_time_s == pytest.approx(free.step_time_s)


def test_hidden_data_parallel_reduction_slows_compute_by_its_sm_share():
    """dp 64 over 8 nodes, ZeRO 1, overlapped: the compute part grows by exactly u x the hidden seconds, and
    hidden = total - exposed of the reduce-scatter and the all-gather."""
    strategy = Strategy(tp=1, pp=1, dp=64, global_batch=64, dtype="bf16", zero=1, dp_overlap=True)
    busy = estimate(LLAMA8B, H100, 64, strategy)
    free = estimate(LLAMA8B, _acc(H100, comm_units=0), 64, strategy)
    plain = estimate(LLAMA8B, H100, 64, dc.replace(strategy, dp_overlap=False))
    total_comm = plain.breakdown_s["dp_communication"]          # all of it exposed without overlap
    hidden = total_comm - free.breakdown_s["dp_communication"]
    assert hidden > 0
    assert busy.breakdown_s["compute"] - free.breakdown_s["compute"] == pytest.approx(16 / 132 * hidden)


# --- the fp8 recipe's own kernels --------------------------------------------------------------------------

def _shape(gemm_e):
    return LayerShape(b=1, s=1024, t=1, sp=False, flash=True, e=2.0, gemm_e=gemm_e)


def test_fp8_linear_casts_and_transposes_what_no_kernel_fuses():
    dev = _device()
    tok, n_in, n_out = 4096.0, 4096.0, 8192.0
    f16, b16 = _linear(tok, n_in, n_out, _shape(2.0), dev)
    f8, b8 = _linear(tok, n_in, n_out, _shape(1.0), dev)
    g = lambda m, n, k: gemm_time(1, m, n, k, 1.0, dev).total    # noqa: E731
    # unfused input: cast + transpose in forward, 4 B per input element at 2 TB/s (working set > L2/2)
    assert float(f8.total) == pytest.approx(float(g(tok, n_out, n_in)) + tok * n_in * 4 / 2e12)
    # backward: the output gradient cast + transposed, 4 B per element
    assert float(b8.total) == pytest.approx(float(g(tok, n_in, n_out) + g(n_in, n_out, tok)) + tok * n_out * 4 / 2e12)
    # a fused input (LayerNormLinear): no forward cast; an fp8 transpose in backward, 2 B per element
    ff, bf = _linear(tok, n_in, n_out, _shape(1.0), dev, fused_input=True, fused_grad=True)
    assert float(ff.total) == pytest.approx(float(g(tok, n_out, n_in)))
    assert float(bf.total) == pytest.approx(float(g(tok, n_in, n_out) + g(n_in, n_out, tok)) + tok * n_in * 2 / 2e12)
    assert float(f16.total) < float(f8.total) * 2            # 16-bit: no casts at all, 16-bit GEMMs


def test_fp8_weights_are_cast_once_per_step():
    """4 B per parameter of the device (read 2, write fp8 and its transpose) at 90 % of 3.35 TB/s, plus one
    launch; nothing in bf16."""
    from comet_dse.cost.layout import layout_terms
    from comet_dse.cost.pipeline import stage_candidates, stage_params

    st = StrategyArrays.of([Strategy(tp=8, pp=1, dp=1, global_batch=8, dtype="fp8"),
                            Strategy(tp=8, pp=1, dp=1, global_batch=8, dtype="bf16")])
    lay = layout_terms(LLAMA8B, st, context_of(LLAMA8B, H100, 8, st))
    params = float(np.ravel(stage_params(stage_candidates(LLAMA8B, st)).total)[0])
    assert float(lay.weight_cast[0]) == pytest.approx(params * 4 / (3.35e12 * 0.9) + 3e-6)
    assert float(lay.weight_cast[1]) == 0.0


def test_amax_reduction_is_a_blocking_all_reduce_per_chunk_and_pass():
    """Llama 3 8B (32 layers, 4 fp8 GEMMs a layer: fused QKV, output, MLP up with its gate (TE LayerNormMLP)
    and down), tp 8 on one node, pp 1, dp 1, 4 micro-batches: per micro-batch one all-reduce of
    4 x 3 x 4 x 32 B in forward and one of 4 x 2 x 4 x 32 B in backward over the 8 NVLink ranks, each
    latency-bound:
    2 phases x (7/8 S / (450 GB/s x 0.82) + 6 steps x 3 us)."""
    strategy = Strategy(tp=8, pp=1, dp=1, global_batch=4, micro_batch=1, dtype="fp8")
    on = estimate(LLAMA8B, H100, 8, dc.replace(strategy, fp8_amax_reduction=True))
    off = estimate(LLAMA8B, H100, 8, strategy)
    bw = 450e9 * 0.82
    ar = lambda s: 2 * (7 / 8 * s / bw + 6 * 3e-6)     # noqa: E731
    per_microbatch = ar(4 * 3 * 4 * 32) + ar(4 * 2 * 4 * 32)
    assert on.breakdown_s["dp_communication"] - off.breakdown_s["dp_communication"] == pytest.approx(
        4 * per_microbatch)
    bf16 = estimate(LLAMA8B, H100, 8, dc.replace(strategy, dtype="bf16", fp8_amax_reduction=True))
    assert bf16.breakdown_s["dp_communication"] == pytest.approx(
        estimate(LLAMA8B, H100, 8, dc.replace(strategy, dtype="bf16")).breakdown_s["dp_communication"])


def test_gradient_norm_is_one_scalar_all_reduce_over_the_model_parallel_ranks():
    """tp 8 on one node, no ZeRO: the squared norm (4 B) all-reduced over the 8 TP ranks,
    2 x (7/8 x 4 B / (450 GB/s x 0.82) + 6 x 3 us); fp16 adds the found-inf check, a second one."""
    from comet_dse.cost.optimizer import step_scalar_reductions

    st = StrategyArrays.of([Strategy(tp=8, pp=1, dp=1, global_batch=8, dtype="bf16"),
                            Strategy(tp=8, pp=1, dp=1, global_batch=8, dtype="fp16")])
    ctx = context_of(LLAMA8B, H100, 8, st)
    t = step_scalar_reductions(st, ctx, np.array([False, True]))
    ar = 2 * (7 / 8 * 4 / (450e9 * 0.82) + 6 * 3e-6)
    assert t == pytest.approx([ar, 2 * ar])


def test_sustained_fraction_divides_the_tensor_rate():
    strategy = Strategy(tp=8, pp=1, dp=1, global_batch=8, dtype="bf16", flash_attention=True)
    full = estimate(LLAMA8B, H100, 8, strategy)
    half = estimate(LLAMA8B, _acc(H100, tensor_sustained={d: 0.5 for d in H100.accelerator.peak_flops}), 8,
                    strategy)
    assert half.breakdown_s["compute"] > 1.9 * full.breakdown_s["compute"]
    assert half.breakdown_s["memory"] <= full.breakdown_s["memory"] * (1 + 1e-9)
