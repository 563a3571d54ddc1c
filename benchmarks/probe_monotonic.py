"""Search for points where a better resource makes a step slower, far beyond what the test suite draws.

For every cluster preset that holds 64 devices (and the same preset with a 512 GiB, 100 GB/s CXL-like tier
with a 20 TFLOP/s compute roof when it has none), a dense model at 8K and at 64K tokens and a MoE model, and N
random strategies over the whole knob space (context parallelism up to 16, every CP algorithm), it evaluates
the batched cost model once as it is and once per improved resource, each by a factor drawn from 1.01 to 10
(FLOP/s, HBM, SRAM and vector rates, HBM, SRAM and tier capacity, tier bandwidth and compute roof, the
sustained tensor rate and the training efficiency toward 1; per network dimension link bandwidth, efficiency
capped at 1, latency divided), over pipelines up to 16 stages, ZeRO 0-3, the expansion tier as memory or as a
roofline, every placement family and each device's attention kernels, and prints each (cluster, resource)
with violations: how many, the worst ratio, and the worst strategy. No output means none was found.
tests/test_physics.py checks the same property on fewer points in CI.

    python benchmarks/probe_monotonic.py [--seed 0] [--points 300]
"""
from __future__ import annotations

import argparse
import dataclasses as dc
import random

import numpy as np

from comet_dse.cost.step import evaluate
from comet_dse.hardware.spec import MemoryTier
from comet_dse.presets.catalog import load_cluster, load_model, preset_names
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import AttentionKernel, CpAlgorithm, Recompute
from comet_dse.strategy.declared import Strategy

DEVICES = 64
CXL = MemoryTier("cxl", 512 * 2**30, 100e9, 0.9, 2e-6, compute=20e12)   # a compute roof that binds (roofline)


def random_strategy(rng: random.Random, moe: bool, kernels=("fa2",)) -> Strategy:
    tp = rng.choice([1, 2, 4, 8])
    cp = rng.choice([c for c in (1, 2, 4, 8, 16) if tp * c <= DEVICES])
    pp = rng.choice([p for p in (1, 2, 4, 8, 16) if tp * cp * p <= DEVICES])
    dp = DEVICES // (tp * cp * pp)
    ep = rng.choice([e for e in (1, 2, 4, 8) if dp % e == 0]) if moe else 1
    coin = lambda: rng.random() < 0.5  # noqa: E731 - a fair coin per switch
    return Strategy(
        tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, global_batch=dp * rng.choice([4, 8]), micro_batch=rng.choice([1, 2]),
        recompute=rng.choice(list(Recompute)), sequence_parallel=tp > 1 and coin(), zero=rng.choice([0, 1, 2, 3]),
        dtype=rng.choice(["bf16", "fp8"]), flash_attention=coin(), tp_overlap=coin(), ep_overlap=coin(),
        cp_algorithm=rng.choice(list(CpAlgorithm)), pp_overlap=coin(), interleave=rng.choice([1, 2]) if pp > 1 else 1,
        dp_overlap=coin(), reshard_after_forward=coin(), hybrid_shard=coin(),
        placement=rng.choice(["tp-pp-dp", "tp-dp-pp", "dp-tp-pp"]), attention_kernel=rng.choice(kernels),
        expansion_overlap=coin(), expansion_roofline=coin(), moe_dispatcher=rng.choice(["alltoall", "flex", "fused"]),
        grad_sync=rng.choice(["micro-batch", "step"]))


def _acc(cluster, **changes):
    return dc.replace(cluster, accelerator=dc.replace(cluster.accelerator, **changes))


def improved(cluster, rng: random.Random):
    """(name, factor, cluster with that resource improved by the factor) for every resource; each factor is
    drawn from 1.01 to 10."""
    acc = cluster.accelerator
    f = lambda: rng.uniform(1.01, 10.0)  # noqa: E731 - one draw per resource
    x = f()
    yield "flops", x, _acc(cluster, peak_flops={k: x * v for k, v in acc.peak_flops.items()})
    x = f()
    yield "hbm_bandwidth", x, _acc(cluster, hbm=dc.replace(acc.hbm, bandwidth=x * acc.hbm.bandwidth))
    x = f()
    yield "hbm_capacity", x, _acc(cluster, hbm=dc.replace(acc.hbm, capacity=x * acc.hbm.capacity))
    x = f()
    yield "sram_bandwidth", x, _acc(cluster, sram=dc.replace(acc.sram, bandwidth=x * acc.sram.bandwidth))
    x = f()
    yield "sram_capacity", x, _acc(cluster, sram=dc.replace(acc.sram, capacity=x * acc.sram.capacity))
    x = f()
    sustained = {d: min(1.0, x * acc.physical_sustained(d)) for d in acc.peak_flops}
    yield "tensor_sustained", x, _acc(cluster, tensor_sustained=sustained, training_efficiency={
        k: dc.replace(a, value=min(1.0, x * a.value)) for k, a in acc.training_efficiency.items()})
    x = f()
    yield "vector_flops", x, _acc(cluster, vector_flops=x * acc.vector_flops)
    if acc.expansion:
        exp = acc.expansion
        x = f()
        yield "expansion_bandwidth", x, _acc(cluster, expansion=dc.replace(exp, bandwidth=x * exp.bandwidth))
        x = f()
        yield "expansion_latency", x, _acc(cluster, expansion=dc.replace(exp, latency=exp.latency / x))
        x = f()
        yield "expansion_capacity", x, _acc(cluster, expansion=dc.replace(exp, capacity=x * exp.capacity))
        if exp.compute is not None:
            x = f()
            yield "expansion_compute", x, _acc(cluster, expansion=dc.replace(exp, compute=x * exp.compute))
    for i, d in enumerate(cluster.network):
        x, y, z = f(), f(), f()
        for what, factor, new in (("link_bandwidth", x, dc.replace(d, link_bandwidth=x * d.link_bandwidth)),
                                  ("efficiency", y, dc.replace(d, efficiency=min(1.0, y * d.efficiency))),
                                  ("latency", z, dc.replace(d, latency=d.latency / z))):
            network = list(cluster.network)
            network[i] = new
            yield f"{d.name}.{what}", factor, dc.replace(cluster, network=tuple(network))


def clusters():
    """(label, cluster) of every preset that holds DEVICES, as it is and with an expansion tier."""
    for name in preset_names("clusters"):
        base = load_cluster(name)
        try:
            base.dim_sizes(DEVICES)
        except ValueError:
            continue
        yield name, base
        if base.accelerator.expansion is None:
            yield f"{name}+tier", _acc(base, expansion=CXL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--points", type=int, default=300, help="random strategies per cluster and model")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    models = {"dense 8K": load_model("llama3-8b").with_seq_len(8192),
              "dense 64K": load_model("llama3-8b").with_seq_len(65536),
              "moe": load_model("mixtral-8x7b").with_seq_len(8192)}
    found = {}
    for label, cluster in clusters():
        for kind, model in models.items():
            kernels = sorted(cluster.accelerator.attention_efficiency) or [AttentionKernel.FA2.value]
            strategies = [random_strategy(rng, kind == "moe", kernels) for _ in range(args.points)]
            strategies = [s if s.dtype.value in cluster.accelerator.peak_flops else dc.replace(s, dtype="bf16")
                          for s in strategies]
            arrays = StrategyArrays.of(strategies)
            with np.errstate(all="ignore"):
                base = evaluate(model, cluster, DEVICES, arrays)
                for resource, factor, better in improved(cluster, rng):
                    step = evaluate(model, better, DEVICES, arrays)
                    ratio = step.step_time / base.step_time
                    worse = np.flatnonzero((ratio > 1 + 1e-9) | (base.fits & ~step.fits))
                    if len(worse):
                        worst = worse[np.argmax(ratio[worse])]
                        count, top, _ = found.get((label, resource), (0, 0.0, None))
                        example = ((kind, factor, strategies[worst]) if ratio[worst] > top or not count
                                   else found[(label, resource)][2])
                        found[(label, resource)] = (count + len(worse), max(top, ratio[worst]), example)
    for (label, resource), (count, top, (kind, factor, strategy)) in sorted(found.items()):
        print(f"{label} {resource} x{factor:.2f}: {count} slower or no longer feasible, worst x{top:.6f} "
              f"({kind}) {strategy}")


if __name__ == "__main__":
    main()
