"""Properties that must hold for every design point (hypothesis draws the points)."""
import dataclasses as dc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as hs

from comet_dse.answers.estimate import estimate
from comet_dse.cost.step import evaluate
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import Recompute
from comet_dse.strategy.declared import Strategy

A100 = load_cluster("dgx-a100-80gb")
MODELS = {name: load_model(name) for name in ("megatron-18b", "gpt3-175b", "llama3-70b")}
DEVICES = 256


@hs.composite
def design_points(draw):
    model = draw(hs.sampled_from(sorted(MODELS)))
    tp = draw(hs.sampled_from([1, 2, 4, 8]))
    pp = draw(hs.sampled_from([1, 2, 4, 8, 16]))
    dp = DEVICES // (tp * pp)
    mb = draw(hs.sampled_from([1, 2, 4]))
    gb = dp * mb * draw(hs.sampled_from([1, 4, 16]))
    return model, Strategy(
        tp=tp, pp=pp, dp=dp, global_batch=gb, micro_batch=mb,
        recompute=draw(hs.sampled_from(list(Recompute))), sequence_parallel=draw(hs.booleans()),
        zero=draw(hs.sampled_from([0, 1, 2, 3])), dtype=draw(hs.sampled_from(["bf16", "fp16"])),
        dp_overlap=draw(hs.booleans()), flash_attention=draw(hs.booleans()), tp_overlap=draw(hs.booleans()),
    )


def _scaled(cluster, flops=1.0, hbm_bw=1.0, link=1.0):
    acc = cluster.accelerator
    acc = dc.replace(acc, peak_flops={k: v * flops for k, v in acc.peak_flops.items()},
                     hbm=dc.replace(acc.hbm, bandwidth=acc.hbm.bandwidth * hbm_bw))
    net = tuple(dc.replace(d, link_bandwidth=d.link_bandwidth * link) for d in cluster.network)
    return dc.replace(cluster, accelerator=acc, network=net)


@settings(max_examples=60, deadline=None)
@given(design_points())
def test_breakdown_adds_up_and_utilisation_is_bounded(point):
    name, strategy = point
    result = estimate(MODELS[name], A100, DEVICES, strategy)
    assert abs(sum(result.breakdown_s.values()) - result.step_time_s) <= 1e-9 * result.step_time_s
    assert all(v >= 0 for v in result.breakdown_s.values())
    assert 0 < result.mfu <= result.hfu <= 1.0
    assert abs(sum(result.memory_bytes.values()) - result.memory_per_device_bytes) <= len(result.memory_bytes)


@settings(max_examples=40, deadline=None)
@given(design_points(), hs.sampled_from(["flops", "hbm_bw", "link"]))
def test_more_resources_never_slower(point, resource):
    name, strategy = point
    base = estimate(MODELS[name], A100, DEVICES, strategy).step_time_s
    faster = estimate(MODELS[name], _scaled(A100, **{resource: 2.0}), DEVICES, strategy).step_time_s
    assert faster <= base * (1 + 1e-12)


def _memory(model, strategies):
    with np.errstate(divide="ignore", invalid="ignore"):
        return evaluate(model, A100, DEVICES, StrategyArrays.of(strategies)).memory_total


@settings(max_examples=40, deadline=None)
@given(design_points())
def test_memory_never_grows_with_zero_stage(point):
    name, strategy = point
    mem = _memory(MODELS[name], [dc.replace(strategy, zero=z) for z in (0, 1, 2, 3)])
    assert np.all(np.diff(mem) <= 1e-6 * mem[0])


@settings(max_examples=40, deadline=None)
@given(design_points())
def test_memory_never_grows_with_tp(point):
    name, strategy = point
    total = strategy.tp * strategy.dp
    tps = [t for t in (1, 2, 4, 8) if total % t == 0]
    m = strategy.global_batch // (strategy.dp * strategy.micro_batch)
    # Same micro-batches per pipeline (the global batch follows dp), ZeRO 0 so that the
    # data-parallel degree does not enter: only the TP split changes.
    mem = _memory(MODELS[name], [dc.replace(strategy, tp=t, dp=total // t, zero=0,
                                            global_batch=(total // t) * strategy.micro_batch * m) for t in tps])
    assert np.all(np.diff(mem) <= 1e-6 * mem[0])


MIXTRAL = load_model("mixtral-8x7b").with_seq_len(4096)
H100 = load_cluster("dgx-h100")


@hs.composite
def moe_points(draw):
    tp = draw(hs.sampled_from([1, 2, 4, 8]))
    pp = draw(hs.sampled_from([1, 2, 4]))
    dp = DEVICES // (tp * pp)
    ep = draw(hs.sampled_from([e for e in (1, 2, 4, 8) if dp % e == 0]))
    return Strategy(
        tp=tp, pp=pp, dp=dp, ep=ep, global_batch=dp * 4, micro_batch=1,
        recompute=draw(hs.sampled_from(list(Recompute))), sequence_parallel=tp > 1 and draw(hs.booleans()),
        zero=draw(hs.sampled_from([0, 1])), dtype=draw(hs.sampled_from(["bf16", "fp8"])), flash_attention=True,
        ep_overlap=draw(hs.booleans()), tp_overlap=draw(hs.booleans()),
        placement=draw(hs.sampled_from(["tp-pp-dp", "dp-tp-pp"])),
    )


@settings(max_examples=40, deadline=None)
@given(moe_points(), hs.sampled_from(["flops", "hbm_bw", "link"]))
def test_moe_more_resources_never_slower(strategy, resource):
    base = estimate(MIXTRAL, H100, DEVICES, strategy).step_time_s
    faster = estimate(MIXTRAL, _scaled(H100, **{resource: 2.0}), DEVICES, strategy).step_time_s
    assert faster <= base * (1 + 1e-12)
