"""How a sweep scales with workers, as rates and ratios: local processes, Dask, the driver's own cost.

Run:  python benchmarks/bench_sweep.py [--study benchmarks/sweep-10m.yaml] [--skip-scaling] [--json FILE]

Prints, for the ~10-million-point study benchmarks/sweep-10m.yaml written as a
dataset folder (``--output NAME`` without a suffix):
1. design points per second with 1 and 2 local worker processes, and their ratio
   (1 worker runs in the driver process itself, as ``comet-dse sweep`` does);
2. the same with one Parquet file joined from the parts (``--output x.parquet``);
3. the Dask engine on a LocalCluster of 2 worker processes against 2 local processes;
4. the driver's CPU time per point (with Dask's LocalCluster this includes its
   scheduler, which runs in the driver process);
5. a scaling run with 1, 2 and 4 Dask worker processes: rate, driver CPU per
   point, and the bytes a worker sends back per chunk (the pickled result of
   ``engine._task``: the chunk's summary) against the bytes of the chunk's rows,
   which is what went back before workers wrote their own parts (a Dask task
   carries up to 250,000 rows' chunks and sends back their summaries).
On a 2-core machine 4 workers cannot run faster than 2; the scaling run shows
that the driver is not what limits the rate.
Timings are single runs (each is tens of seconds), so expect a few per cent of noise.
"""
from __future__ import annotations

import argparse
import json
import pickle
import sys
import tempfile
import time
from pathlib import Path

from comet_dse.base.allocator import keep_freed_memory
from comet_dse.design_space import engine
from comet_dse.design_space.study import load_study

HERE = Path(__file__).resolve().parent


def timed_sweep(study_path: Path, output: str, **options) -> dict:
    """One sweep into a temporary folder: wall seconds, driver CPU seconds, points."""
    study = load_study(study_path)
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu = time.perf_counter(), time.process_time()
        ranking = engine.run_study(study, Path(tmp) / output, progress=False, **options)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"seconds": wall, "driver_cpu_s": cpu, "points": ranking["points"], "chunks": ranking["chunks"],
            "points_per_s": ranking["points"] / wall, "driver_cpu_us_per_point": 1e6 * cpu / ranking["points"]}


def bytes_per_chunk(study_path: Path) -> dict:
    """Pickled bytes a worker sends back for the first chunk now (its summary), and the chunk's rows
    (what a worker sent back before it wrote its own part)."""
    study = load_study(study_path)
    chunks, _ = engine.plan(study)
    with tempfile.TemporaryDirectory() as tmp:
        store = engine.PartStore(Path(tmp) / "r", study, chunks, resume=False)
        try:
            job = engine.Job(study, chunks[0], store.token, store.parts, 5)
            result = engine._task(job)
            rows = engine.run_chunk(study, chunks[0], engine.strategies_of(job))
        finally:
            store.release()
    return {"rows_per_chunk": chunks[0].stop - chunks[0].start, "sent_back_bytes": len(pickle.dumps(result)),
            "rows_bytes": len(pickle.dumps(rows))}


def line(name: str, r: dict) -> str:
    return (f"{name:<34} {r['points']:>11,} points in {r['seconds']:6.1f} s = {r['points_per_s']:>10,.0f} points/s; "
            f"driver CPU {r['driver_cpu_us_per_point']:.3f} us/point")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=HERE / "sweep-10m.yaml")
    parser.add_argument("--skip-scaling", action="store_true", help="skip the 1/2/4 Dask worker scaling run")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    keep_freed_memory()       # as the command line does before it allocates anything (comet_dse/base/allocator.py)
    out = {}
    out["local_1"] = timed_sweep(args.study, "ds", workers=1)
    print(line("local, 1 worker (in the driver)", out["local_1"]))
    out["local_2"] = timed_sweep(args.study, "ds", workers=2)
    print(line("local, 2 worker processes", out["local_2"]))
    print(f"  2 workers / 1 worker: {out['local_2']['points_per_s'] / out['local_1']['points_per_s']:.2f}x")
    out["local_2_file"] = timed_sweep(args.study, "one.parquet", workers=2)
    print(line("local, 2 workers, one .parquet file", out["local_2_file"]))
    out["dask_2"] = timed_sweep(args.study, "ds", engine="dask", workers=2)
    print(line("Dask LocalCluster, 2 processes", out["dask_2"]))
    print(f"  Dask / local processes (time): {out['dask_2']['seconds'] / out['local_2']['seconds']:.2f}x")
    sizes = bytes_per_chunk(args.study)
    out["bytes"] = sizes
    print(f"sent back per chunk of {sizes['rows_per_chunk']:,} rows: {sizes['sent_back_bytes']:,} bytes "
          f"(the rows themselves: {sizes['rows_bytes']:,} bytes)")
    if not args.skip_scaling:
        for n in (1, 2, 4):
            r = timed_sweep(args.study, "ds", engine="dask", workers=n)
            out[f"dask_scaling_{n}"] = r
            print(line(f"Dask scaling, {n} worker process(es)", r)
                  + f"; {sizes['sent_back_bytes']:,} bytes back per chunk")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
