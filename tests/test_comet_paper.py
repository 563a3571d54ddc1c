"""The COMET paper's setup: pure model parallelism with a column split, 16-bit gradients, SRAM that holds
state, plausibility caps from the fastest real parts, and an expansion tier whose traffic overlaps compute."""
import dataclasses as dc
from importlib import resources

import pytest
import yaml

from comet_dse.answers.estimate import estimate
from comet_dse.base.errors import InputError
from comet_dse.cost.pipeline import attention_params_per_device
from comet_dse.hardware.load import cluster_from
from comet_dse.hardware.spec import MemoryTier
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.declared import Strategy

TPU = load_cluster("tpu-v4")
TILE = load_cluster("dojo-tile")
A100 = load_cluster("dgx-a100-80gb")
COMET = load_model("comet-transformer-1t")
GiB = 2.0**30


def preset_yaml(kind: str, name: str) -> dict:
    return yaml.safe_load(resources.files("comet_dse").joinpath("presets", kind, f"{name}.yaml").read_text())

# The paper's setup on 4096 TPU v4 chips (studies/comet/paper-rq1-parallelism.yaml), one split of it.
PAPER = Strategy(tp=256, pp=1, dp=16, global_batch=2048, micro_batch=1, recompute="full", zero=1,
                 grad_precision="16-bit", model_parallel="pure-mp")


def test_the_workload_shape_is_the_authors():
    """dkadiyala3/comet-astrasim's workload: h 24576, FFN 98304, 192 columns per rank at MP 128."""
    assert (COMET.hidden, COMET.mlp.ffn, COMET.seq_len) == (24576, 98304, 2048)
    assert COMET.hidden // 128 == 192 and COMET.mlp.ffn // 128 == 768
    assert COMET.total_params() == pytest.approx(0.929e12, rel=1e-3)


def test_pure_mp_splits_columns_beyond_the_heads_where_the_model_allows_it():
    pure = estimate(COMET, TPU, 4096, PAPER)
    megatron = estimate(COMET, TPU, 4096, dc.replace(PAPER, model_parallel="tp-pp"))
    assert "tp_heads" not in pure.broken_rules and pure.feasible
    assert "tp_heads" in megatron.broken_rules                      # Megatron keeps heads whole: 128 heads
    # The 4096-way split of the 24576 query columns is six per rank; 4096 does not divide 160 heads' columns
    # of megatron-1t (25600 = 2^10 x 25) at 2048, a column split that does not divide is refused too:
    odd = estimate(load_model("megatron-1t"), TPU, 4096, dc.replace(PAPER, tp=2048, dp=2))
    assert "tp_heads" in odd.broken_rules                           # no column_split in that model


def test_a_column_split_divides_every_projection_by_t():
    """Q, K and V columns all split by t, also past one head per rank (no K/V head replicated)."""
    t = 4096.0
    per_rank = attention_params_per_device(COMET, t)
    assert per_rank == pytest.approx(COMET.attention_params() / t, rel=2e-3)   # biases of the out projection stay


def test_pure_mp_is_tp_with_one_stage_where_both_are_valid():
    """The knob changes which strategies are valid, not what a valid one costs."""
    for tp in (8, 64, 128):
        a = estimate(COMET, TPU, 4096, dc.replace(PAPER, tp=tp, dp=4096 // tp))
        b = estimate(COMET, TPU, 4096, dc.replace(PAPER, tp=tp, dp=4096 // tp, model_parallel="tp-pp"))
        assert a.step_time_s == b.step_time_s and a.memory_bytes == b.memory_bytes


def test_pure_mp_has_no_pipeline():
    e = estimate(COMET, TPU, 4096, dc.replace(PAPER, tp=128, pp=2))
    assert e.broken_rules == ["pure_mp"] and "pp=2 must be 1" in e.reasons[0]


def test_sixteen_bit_gradients_take_two_bytes_and_halve_the_gradient_reduction():
    """The optimizer pass over the ZeRO-1 shard reads and writes 34 instead of 38 bytes per parameter, and the
    zeroing of the whole local gradient buffer 2 instead of 4 (cost/layout.py). The step's scalar all-reduce
    (the gradient norm, latency-bound) is the same for both: with zero link latency it is a few 4-byte
    transfers, below the comparison's tolerance."""
    tpu = dc.replace(TPU, network=tuple(dc.replace(d, latency=0.0) for d in TPU.network))
    mixed = estimate(COMET, tpu, 4096, dc.replace(PAPER, grad_precision="mixed", tp=8, dp=512))
    sixteen = estimate(COMET, tpu, 4096, dc.replace(PAPER, tp=8, dp=512))
    assert sixteen.memory_bytes["gradients"] == pytest.approx(mixed.memory_bytes["gradients"] / 2, rel=1e-9)
    assert sixteen.memory_bytes["weights"] == mixed.memory_bytes["weights"]
    held = mixed.memory_bytes["gradients"] / 4.0          # fp32 main gradients, not sharded under ZeRO 1
    shard = mixed.memory_bytes["optimizer"] / 12.0        # fp32 weight, m and v of the shard the device updates
    bandwidth, launch = TPU.accelerator.hbm.achievable_bandwidth, TPU.accelerator.kernel_overhead
    for result, adam, zeroing in ((mixed, 38, 4), (sixteen, 34, 2)):
        expected = (adam * shard + zeroing * held) / bandwidth + 2 * launch
        assert result.breakdown_s["optimizer"] == pytest.approx(expected, rel=1e-4)


def test_the_papers_memory_wall_on_tpu_v4():
    """With the paper's setup, MP256_DP16 is the smallest split that fits 32 GiB (the paper's finding)."""
    fits = {tp: estimate(COMET, TPU, 4096, dc.replace(PAPER, tp=tp, dp=4096 // tp)).feasible for tp in (128, 256)}
    assert fits == {128: False, 256: True}


def test_sram_that_holds_state_adds_to_the_capacity():
    """A Dojo tile: 160 GiB of HBM on its DIPs plus 11 GB of SRAM, when the SRAM holds state."""
    assert TILE.accelerator.state_capacity == 160 * GiB + 11e9
    hbm_only = dc.replace(TILE, accelerator=dc.replace(
        TILE.accelerator, sram=dc.replace(TILE.accelerator.sram, holds_state=False)))
    assert hbm_only.accelerator.state_capacity == 160 * GiB
    # A split that needs between 160 GiB and 170 GiB fits only when the SRAM counts:
    point = Strategy(tp=64, pp=1, dp=1, global_batch=64, micro_batch=1, recompute="full", zero=0,
                     grad_precision="16-bit", model_parallel="pure-mp")
    small = dc.replace(COMET, layers=92)
    need = estimate(small, TILE, 64, point).memory_per_device_bytes
    assert 160 * GiB < need < 160 * GiB + 11e9
    assert estimate(small, TILE, 64, point).feasible
    refused = estimate(small, hbm_only, 64, point)
    assert refused.broken_rules == ["memory"] and "HBM holds 160.0 GiB" in refused.reasons[0]


def test_holds_state_is_only_for_sram():
    data = preset_yaml("clusters", "tpu-v4")
    data["accelerator"]["memory"]["hbm"]["holds_state"] = True
    with pytest.raises(InputError) as info:
        cluster_from(data)
    assert "holds_state" in info.value.field


def test_the_caps_admit_the_fastest_real_parts_and_refuse_ten_times_more():
    """Cerebras WSE-3 (125 PFLOP/s, 44 GB SRAM at 21 PB/s) and a Dojo tile's 9 TB/s edge are real."""
    data = preset_yaml("clusters", "dojo-tile")
    acc = data["accelerator"]
    acc["peak_flops"]["bf16"] = "125 PFLOP/s"
    acc["memory"]["sram"].update(capacity="44 GB", bandwidth="21 PB/s")
    wse = cluster_from(data)
    assert wse.accelerator.sram.achievable_bandwidth == 21e15 and TILE.network[0].link_bandwidth == 9e12
    for path, value in ((("peak_flops", "bf16"), "2 EFLOP/s"), (("memory", "sram", "bandwidth"), "300 PB/s"),
                        (("memory", "sram", "capacity"), "600 GiB")):
        bad = preset_yaml("clusters", "dojo-tile")
        node = bad["accelerator"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(InputError):
            cluster_from(bad)


def _with_tier(cluster, hbm: float, capacity: float, bandwidth: float, latency: float):
    acc = dc.replace(cluster.accelerator, hbm=dc.replace(cluster.accelerator.hbm, capacity=hbm),
                     expansion=MemoryTier("expansion", capacity, bandwidth, 1.0, latency))
    return dc.replace(cluster, accelerator=acc)


@pytest.mark.parametrize("bw", [20e9, 200e9])   # every pass exposed in part; only the optimizer's traffic exposed
def test_expansion_traffic_overlapped_with_compute_matches_a_hand_calculation(bw):
    """megatron-1.7b, pure DP on 8 A100s, 8 micro-batches: HBM too small for the model states, so the
    optimizer state and part of the weights and gradients live in the tier. By hand, per docs/model.md:
        exposed = m [max(0, W_x/B - T_f) + max(0, 2 W_x/B - T_b)] + max(0, 2 O_x/B - T_opt) + latencies
    (no activation spills here), against (2 O_x + 3 m W_x)/B + latencies without overlap."""
    model = load_model("megatron-1.7b")
    point = Strategy(dp=8, global_batch=64, micro_batch=1, recompute="full")
    need = estimate(model, A100, 8, point)
    parts = need.memory_bytes
    opt, wg = parts["optimizer"], parts["weights"] + parts["gradients"]
    hbm = need.memory_per_device_bytes - opt - 0.5 * wg          # optimizer and half the weights+grads spill
    lat, m = 2e-6, 8
    cluster = _with_tier(A100, hbm, 64 * GiB, bw, lat)
    off = estimate(model, cluster, 8, point)
    on = estimate(model, cluster, 8, dc.replace(point, expansion_overlap=True))
    assert off.feasible and on.feasible and off.memory_tiers_bytes["expansion"] == pytest.approx(opt + 0.5 * wg, abs=2)
    w_x = 0.5 * wg
    latencies = (2 + 3 * m) * lat
    assert off.breakdown_s["offload"] == pytest.approx((2 * opt + 3 * m * w_x) / bw + latencies, rel=1e-9)
    t_f = on.phases_s["forward"] / m
    t_b = (on.phases_s["backward"] + on.phases_s["recompute"]) / m
    t_opt = on.breakdown_s["optimizer"]
    hand = (m * (max(0.0, w_x / bw - t_f) + max(0.0, 2 * w_x / bw - t_b))
            + max(0.0, 2 * opt / bw - t_opt) + latencies)
    assert on.breakdown_s["offload"] == pytest.approx(hand, rel=1e-9)
    assert on.breakdown_s["offload"] < off.breakdown_s["offload"]
    if bw > 100e9:      # 5 GB of weights and gradients stream faster than a pass computes: hidden
        assert 2 * w_x / bw < t_b and w_x / bw < t_f
        assert on.breakdown_s["offload"] == pytest.approx(2 * opt / bw - t_opt + latencies, rel=1e-9)
    # Every other part of the step is the same: the overlap only hides tier traffic.
    for part, seconds in off.breakdown_s.items():
        if part != "offload":
            assert on.breakdown_s[part] == seconds


def test_overlapped_traffic_that_exceeds_its_pass_is_exposed_in_part():
    """A slow tier: the weights take longer to stream than a pass computes, so the excess shows."""
    model = load_model("megatron-1.7b")
    point = Strategy(dp=8, global_batch=64, micro_batch=1, recompute="full", expansion_overlap=True)
    need = estimate(model, A100, 8, point)
    wg = need.memory_bytes["weights"] + need.memory_bytes["gradients"]
    cluster = _with_tier(A100, need.memory_per_device_bytes - need.memory_bytes["optimizer"] - wg, 64 * GiB, 1e9, 0.0)
    e = estimate(model, cluster, 8, point)
    t_b = (e.phases_s["backward"] + e.phases_s["recompute"]) / 8
    assert 2 * wg / 1e9 > t_b and e.breakdown_s["offload"] > 8 * (2 * wg / 1e9 - t_b)
