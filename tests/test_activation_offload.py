"""activation_offload (cost/memory.py: step_memory, cost/expansion.py: host_offload_time): a share of the kept
activations waits in host memory; the device holds the rest, the host link carries it out and back, and only
what the pass's compute does not cover is exposed."""
from __future__ import annotations

import pytest

import comet_dse
from cli_run import one_line_error, run

GiB = 2.0**30
POINT = dict(tp=4, pp=4, dp=4, global_batch=64, micro_batch=1, recompute="selective")


def _estimate(share: float, cluster: str = "gb200-nvl72", overrides=None):
    return comet_dse.estimate("llama3-70b", cluster, 64, overrides=overrides, activation_offload=share, **POINT)


def test_the_offloaded_share_leaves_the_device_for_the_host():
    """One stage (pp 1): the device's activations drop by exactly what the host takes, o x the kept activations
    (the working set of the layer being computed and the logits stay); weights, gradients and optimizer state
    do not move. With a pipeline the host figure is the rank that offloads the most (the first, holding the most
    micro-batches), at least what the busiest rank's device sheds."""
    one_stage = dict(tp=8, pp=1, dp=8, global_batch=64, micro_batch=1, recompute="selective")

    def point(share):
        return comet_dse.estimate("llama3-70b", "gb200-nvl72", 64, activation_offload=share, **one_stage)

    kept_all, half, whole = point(0.0), point(0.5), point(1.0)
    assert kept_all.memory_tiers_bytes.get("host", 0) == 0
    for est in (half, whole):
        moved = kept_all.memory_bytes["activations"] - est.memory_bytes["activations"]
        assert moved == pytest.approx(est.memory_tiers_bytes["host"], rel=1e-6)
        for part in ("weights", "gradients", "optimizer"):
            assert est.memory_bytes[part] == kept_all.memory_bytes[part]
    assert whole.memory_tiers_bytes["host"] == pytest.approx(2 * half.memory_tiers_bytes["host"], rel=1e-6)
    assert whole.memory_bytes["activations"] > 0                   # the working layer and the logits stay
    piped = [_estimate(share) for share in (0.0, 0.5, 1.0)]
    assert piped[2].memory_tiers_bytes["host"] == pytest.approx(2 * piped[1].memory_tiers_bytes["host"], rel=1e-6)
    shed = piped[0].memory_bytes["activations"] - piped[2].memory_bytes["activations"]
    assert piped[2].memory_tiers_bytes["host"] >= shed * (1 - 1e-9)


def test_a_fast_host_link_hides_the_copies_and_a_slow_one_exposes_them_by_the_formula():
    """GB200's NVLink-C2C (346 GB/s reached) carries a micro-batch's offloaded activations within its passes:
    nothing exposed. At 1 GB/s (0.77 reached) the copies outlast the passes: exposed m [(a/B - T_f) + (a/B - T_b)],
    a the offloaded bytes of one micro-batch; with one stage exactly what the host holds (one micro-batch in
    flight). tp 1: a pass is its kernels alone (no TP collectives inside it), as the phases report them."""
    one_stage = dict(tp=1, pp=1, dp=64, global_batch=128, micro_batch=1, recompute="selective")
    fast = comet_dse.estimate("llama3-8b", "gb200-nvl72", 64, activation_offload=0.5, **one_stage)
    assert fast.breakdown_s["offload"] == 0.0
    slow_link = {"host_memory_bandwidth": "1 GB/s"}
    slow = comet_dse.estimate("llama3-8b", "gb200-nvl72", 64, overrides=slow_link, activation_offload=0.5,
                              **one_stage)
    base = comet_dse.estimate("llama3-8b", "gb200-nvl72", 64, overrides=slow_link, **one_stage)
    assert base.breakdown_s["offload"] == 0.0
    m = slow.microbatches
    reached = comet_dse.load_cluster("gb200-nvl72").accelerator.host.efficiency     # the preset's 0.77
    copy = slow.memory_tiers_bytes["host"] / (1e9 * reached)
    fwd, bwd = slow.phases_s["forward"] / m, (slow.phases_s["backward"] + slow.phases_s["recompute"]) / m
    assert slow.breakdown_s["offload"] == pytest.approx(m * (max(copy - fwd, 0) + max(copy - bwd, 0)), rel=1e-9)
    assert slow.breakdown_s["offload"] > 0
    assert slow.step_time_s == pytest.approx(base.step_time_s + slow.breakdown_s["offload"], rel=1e-9)


def test_offloading_needs_host_memory_that_holds_it():
    """The MI300X preset lists no host memory tier (no public figure of its host link): an offloading strategy
    does not fit, and says why; a host too small for the offloaded bytes does not either."""
    amd = comet_dse.estimate("llama3-8b", "mi300x", 64, tp=1, pp=1, dp=64, global_batch=64, micro_batch=1,
                             activation_offload=0.5)
    assert not amd.feasible and any("host memory" in r and "does not list" in r for r in amd.reasons)
    small = _estimate(1.0, overrides={"host_memory_capacity": "1 GiB"})
    assert not small.feasible and any("host memory, which holds 1.0 GiB" in r for r in small.reasons)
    assert _estimate(1.0).feasible


def test_bad_share_is_one_line(capsys):
    args = ("estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--tp", "8",
            "--global-batch", "8", "--activation-offload")
    one_line_error(run(capsys, *args, "1.5"), "--activation-offload", "[0, 1]")
    one_line_error(run(capsys, *args, "-0.1"), "--activation-offload")


def test_a_point_that_offloads_nothing_costs_no_offload_time_beside_one_that_does():
    """In one batch with a point that offloads, a point that offloads nothing and breaks a rule (a fused kernel the
    H100 lists no rate for, its passes NaN) reads 0 offload time, as its own estimate does (it read NaN)."""
    import numpy as np

    from comet_dse.design_space.table import evaluate_columns
    from comet_dse.presets.catalog import load_cluster, load_model
    from comet_dse.strategy.arrays import StrategyArrays
    from comet_dse.strategy.declared import Strategy

    offloading = Strategy(dp=8, global_batch=8, recompute="selective", activation_offload=1.0)
    unlisted = Strategy(dp=8, global_batch=8, flash_attention=True, attention_kernel="aiter")
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    cols = evaluate_columns(model, cluster, 8, StrategyArrays.of([offloading, unlisted]))
    alone = comet_dse.estimate(model, cluster, 8, **unlisted.to_dict())
    assert np.isnan(cols["step_time_s"][1]) and not cols["feasible"][1]
    assert cols["time_offload_s"][1] == alone.breakdown_s["offload"] == 0.0
