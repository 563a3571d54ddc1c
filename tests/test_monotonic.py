"""More of any resource never slows a step, and more capacity never makes a fitting point unfit,
over the whole knob space (ZeRO 3, CP, EP, every overlap and sharding option) and every cluster preset."""
import dataclasses as dc

from hypothesis import given, settings
from hypothesis import strategies as hs

from comet_dse.answers.estimate import estimate
from comet_dse.presets.catalog import load_cluster, load_model, preset_names
from comet_dse.strategy.choices import AttentionKernel, CpAlgorithm, Recompute
from comet_dse.strategy.declared import Strategy

CLUSTERS = {name: load_cluster(name) for name in preset_names("clusters")}
DENSE = load_model("llama3-8b").with_seq_len(8192)
MOE = load_model("mixtral-8x7b").with_seq_len(8192)
DEVICES = 64


def _devices_ok(cluster) -> bool:
    try:
        cluster.dim_sizes(DEVICES)
        return True
    except ValueError:
        return False


USABLE = sorted(name for name, c in CLUSTERS.items() if _devices_ok(c))


@hs.composite
def points(draw):
    moe = draw(hs.booleans())
    tp = draw(hs.sampled_from([1, 2, 4, 8]))
    cp = draw(hs.sampled_from([1, 2, 4]))
    pp = draw(hs.sampled_from([1, 2]))
    dp = DEVICES // (tp * cp * pp)
    ep = draw(hs.sampled_from([e for e in (1, 2, 4, 8) if dp % e == 0])) if moe else 1
    flash = draw(hs.booleans())
    name = draw(hs.sampled_from(USABLE))
    kernels = sorted(CLUSTERS[name].accelerator.attention_efficiency) or [AttentionKernel.FA2.value]
    strategy = Strategy(
        tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, global_batch=dp * 4, micro_batch=1,
        recompute=draw(hs.sampled_from(list(Recompute))), sequence_parallel=tp > 1 and draw(hs.booleans()),
        zero=draw(hs.sampled_from([0, 1, 2, 3])), dtype=draw(hs.sampled_from(["bf16", "fp8"])),
        flash_attention=flash, tp_overlap=draw(hs.booleans()), ep_overlap=draw(hs.booleans()),
        cp_algorithm=draw(hs.sampled_from(list(CpAlgorithm))), pp_overlap=draw(hs.booleans()),
        interleave=draw(hs.sampled_from([1, 2])) if pp > 1 else 1, dp_overlap=draw(hs.booleans()),
        reshard_after_forward=draw(hs.booleans()), hybrid_shard=draw(hs.booleans()),
        placement=draw(hs.sampled_from(["tp-pp-dp", "dp-tp-pp"])),
        attention_kernel=draw(hs.sampled_from(kernels)),     # a kernel the device has a rate for
    )
    return name, (MOE if moe else DENSE), strategy


def _scaled(cluster, resource, factor):
    acc = cluster.accelerator
    if resource == "flops":
        acc = dc.replace(acc, peak_flops={k: v * factor for k, v in acc.peak_flops.items()})
    elif resource == "hbm_bw":
        acc = dc.replace(acc, hbm=dc.replace(acc.hbm, bandwidth=acc.hbm.bandwidth * factor))
    elif resource == "capacity":
        acc = dc.replace(acc, hbm=dc.replace(acc.hbm, capacity=acc.hbm.capacity * factor))
    else:
        network = tuple(dc.replace(d, link_bandwidth=d.link_bandwidth * factor) for d in cluster.network)
        return dc.replace(cluster, network=network)
    return dc.replace(cluster, accelerator=acc)


@settings(max_examples=150, deadline=None)
@given(points(), hs.sampled_from(["flops", "hbm_bw", "link"]), hs.sampled_from([1.5, 2.0, 4.0]))
def test_more_of_a_resource_never_slows_a_step(point, resource, factor):
    name, model, strategy = point
    cluster = CLUSTERS[name]
    if strategy.dtype.value not in cluster.accelerator.peak_flops:
        strategy = dc.replace(strategy, dtype="bf16")
    base = estimate(model, cluster, DEVICES, strategy)
    more = estimate(model, _scaled(cluster, resource, factor), DEVICES, strategy)
    assert more.step_time_s <= base.step_time_s * (1 + 1e-12), (name, resource, strategy)


@settings(max_examples=60, deadline=None)
@given(points(), hs.sampled_from([1.5, 2.0]))
def test_more_capacity_never_makes_a_fitting_point_unfit(point, factor):
    name, model, strategy = point
    cluster = CLUSTERS[name]
    if strategy.dtype.value not in cluster.accelerator.peak_flops:
        strategy = dc.replace(strategy, dtype="bf16")
    base = estimate(model, cluster, DEVICES, strategy)
    more = estimate(model, _scaled(cluster, "capacity", factor), DEVICES, strategy)
    if base.feasible:
        assert more.feasible
    assert more.step_time_s <= base.step_time_s * (1 + 1e-12)
