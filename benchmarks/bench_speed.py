"""Speed of comet-dse's batched cost model, search and sweep, as rates and ratios.

Run:  python benchmarks/bench_speed.py [--skip-sweep]

Prints, on this machine:
1. design points per second per core of the full estimate (step time, breakdown,
   memory, every validity rule), batched (a ~1M-point set that repeats 36,750
   strategies, and those strategies each once), next to the same model
   evaluated one point at a time through ``estimate()`` (the ratio is measured
   in this run);
2. the wall time of the exhaustive strategy search for megatron-1t on 4096 TPU v4
   chips;
3. the wall time, rate and peak memory of the ~12.5-million-point sweep
   benchmarks/sweep-10m.yaml on 2 worker processes, into one Parquet file
   (benchmarks/bench_sweep.py measures how sweeps scale: 1 and 2 workers, Dask,
   the driver's CPU time per point, dataset output).
Calculon (calculon-ai/calculon), the best public analytical tool, is not on the
package index, so it is not run here; the figure quoted for it (about 350 points
per second per core on this class of machine) comes from the project's issue.
Timings are the best of several repetitions, because these machines are noisy.
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from comet_dse.answers.estimate import estimate
from comet_dse.base.allocator import keep_freed_memory
from comet_dse.design_space.engine import run_study
from comet_dse.design_space.search import search, strategy_at
from comet_dse.design_space.space import SearchSpace, enumerate_strategies
from comet_dse.design_space.study import load_study
from comet_dse.design_space.table import evaluate_columns
from comet_dse.presets.catalog import load_cluster, load_model

CALCULON_QUOTED = 350.0
HERE = Path(__file__).resolve().parent


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def batched_rate() -> tuple:
    """Points/s of evaluate_columns on one core, on a ~1M-point strategy set (4 chunks of 250k)."""
    model, cluster = load_model("megatron-1t"), load_cluster("tpu-v4")
    st = enumerate_strategies(model, 4096, 2048, SearchSpace(max_micro_batch=64))
    reps = int(np.ceil(1_000_000 / len(st)))
    big = st.take(np.tile(np.arange(len(st)), reps))
    chunks = [big.take(np.arange(i, min(len(big), i + 250_000))) for i in range(0, len(big), 250_000)]

    def run():
        for chunk in chunks:
            evaluate_columns(model, cluster, 4096, chunk)

    seconds = best_of(run, 3)
    scalar_points = 300
    rows = np.linspace(0, len(st) - 1, scalar_points).astype(int)
    cols = evaluate_columns(model, cluster, 4096, st)
    strategies = [strategy_at(cols, int(r)) for r in rows]
    scalar = best_of(lambda: [estimate(model, cluster, 4096, s) for s in strategies], 3)
    return len(big) / seconds, scalar_points / scalar


def distinct_rate() -> float:
    """Points/s of evaluate_columns on one core over distinct strategies only: the 36,750 strategies of
    megatron-1t on 4096 TPU v4 chips (micro-batches up to 64), each once. The ~1M-point set of
    ``batched_rate`` repeats them, which makes the micro-batch and layout groups larger than in a sweep
    chunk; this is the rate without that help."""
    model, cluster = load_model("megatron-1t"), load_cluster("tpu-v4")
    st = enumerate_strategies(model, 4096, 2048, SearchSpace(max_micro_batch=64))
    evaluate_columns(model, cluster, 4096, st)
    return len(st) / best_of(lambda: evaluate_columns(model, cluster, 4096, st), 5)


def search_time() -> tuple:
    model, cluster = load_model("megatron-1t"), load_cluster("tpu-v4")
    result = {}

    def run():
        result["r"] = search(model, cluster, 4096, 2048)

    return best_of(run, 5), result["r"].evaluated


def sweep_time() -> tuple:
    study = load_study(HERE / "sweep-10m.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        ranking = run_study(study, Path(tmp) / "sweep.parquet", workers=2, progress=False)
        seconds = time.perf_counter() - started
    peak_mib = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    return seconds, ranking["points"], peak_mib


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-sweep", action="store_true", help="skip the 10-million-point sweep")
    args = parser.parse_args()
    keep_freed_memory()       # as the command line does before it allocates anything (comet_dse/base/allocator.py)
    rate, scalar_rate = batched_rate()
    print(f"full estimate, batched:    {rate:>12,.0f} points/s on one core")
    print(f"full estimate, distinct:   {distinct_rate():>12,.0f} points/s on one core (36,750 strategies, each once)")
    print(f"full estimate, one by one: {scalar_rate:>12,.0f} points/s (estimate() per point)")
    print(f"  batched / one by one:    {rate / scalar_rate:>12,.0f}x")
    print(f"  batched / Calculon (quoted {CALCULON_QUOTED:.0f}/s/core): {rate / CALCULON_QUOTED:,.0f}x")
    seconds, points = search_time()
    print(f"exhaustive search, megatron-1t on 4096 TPU v4: {points:,} strategies in {seconds:.3f} s")
    if not args.skip_sweep:
        seconds, points, peak = sweep_time()
        print(f"sweep benchmarks/sweep-10m.yaml, 2 workers: {points:,} points in {seconds:.1f} s "
              f"({points / seconds:,.0f} points/s), peak memory per process {peak:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
