"""Speed of the recommendation-model kernel (cost/recommendation.py), batched, as points per second per core.

Run:  python benchmarks/bench_recommendation.py [--points 1000000] [--rounds 3]

One batch of design points of the dlrm-dcnv2 preset on 64 DGX H100 GPUs: every embedding sharding, the
exchange pipelined or not, flat or hierarchical, fp16 and bf16, and global batches from 16,384 to 262,144,
repeated to --points; evaluated through the family (evaluate and its validity rules) as a search evaluates a
batch (design_space/table.py: evaluate_columns). Prints the best of --rounds rates (the machine is shared and
noisy): of that batch, of its distinct strategies each once (240: 6 shardings x 2 x 2 x 2 x 5 batches), and of
about --points distinct strategies (the same knobs with every multiple of 64 samples per device as the batch).
"""
from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from comet_dse.design_space.table import evaluate_columns
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import Dtype, EmbeddingSharding
from comet_dse.strategy.declared import KNOBS, Strategy

DEVICES = 64


def distinct_points(batches: int = 5) -> StrategyArrays:
    """Every combination of sharding, overlap, hierarchy, dtype and ``batches`` global batches (multiples of the
    devices: 256 x 2^k samples per device for 5, else every multiple of 64 per device up to ``batches`` x 64)."""
    batches = ([DEVICES * 256 * 2**k for k in range(5)] if batches == 5
               else [DEVICES * 64 * k for k in range(1, batches + 1)])
    points = [Strategy(dp=DEVICES, global_batch=b, micro_batch=b // DEVICES, embedding_sharding=s,
                       embedding_overlap=o, embedding_hierarchical=h, dtype=d)
              for s, o, h, d, b in itertools.product(EmbeddingSharding, (False, True), (False, True),
                                                     (Dtype.FP16, Dtype.BF16), batches)]
    return StrategyArrays.of(points)


def rate(model, cluster, st: StrategyArrays, rounds: int) -> float:
    """Best points/s of evaluate_columns on ``st`` over ``rounds`` runs."""
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        evaluate_columns(model, cluster, DEVICES, st)
        best = max(best, len(st) / (time.perf_counter() - started))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=1_000_000, help="points in the repeated batch")
    parser.add_argument("--rounds", type=int, default=3, help="runs; the best rate is printed")
    args = parser.parse_args()
    model, cluster = load_model("dlrm-dcnv2"), load_cluster("dgx-h100")
    distinct = distinct_points()
    evaluate_columns(model, cluster, DEVICES, distinct)          # the per-(model, devices) plans, cached once
    reps = int(np.ceil(args.points / len(distinct)))
    big = StrategyArrays({k.name: np.tile(getattr(distinct, k.name), reps) for k in KNOBS})
    print(f"dlrm-dcnv2 on {DEVICES} x dgx-h100: {len(distinct)} distinct strategies")
    print(f"  batched, {len(big):,} points: {rate(model, cluster, big, args.rounds) / 1e6:.2f} M points/s on one core")
    print(f"  the {len(distinct)} distinct strategies, each once: "
          f"{rate(model, cluster, distinct, args.rounds) / 1e3:.1f} K points/s")
    many = distinct_points(args.points // 40)
    print(f"  {len(many):,} distinct strategies (every 64-sample step of the batch per device), each once: "
          f"{rate(model, cluster, many, args.rounds) / 1e6:.2f} M points/s")


if __name__ == "__main__":
    main()
