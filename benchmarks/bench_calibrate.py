"""How `comet-dse calibrate` scales with the number of runs, as rates: runs per second, fit and
cross-validation together, for 20, 200 and 2,000 runs.

Run:  python benchmarks/bench_calibrate.py [--runs 20,200,2000] [--json FILE]

The runs are the ten rows of examples/calibration/narayanan2021_runs.csv (ten models, 32 to 3,072
A100s), each repeated with its measured time scaled by up to +/-5 % (a seeded draw), written to a
CSV and read back as `comet-dse calibrate` reads it. For each count the benchmark times what the
command does: read the runs, fit the default parameters of dgx-a100-80gb, and cross-validate
(leave-one-out up to 30 runs, 10-fold past that: calibrate.cross_validation). The cost of a fit is
a few calls of the batched cost model per iteration per (model, device count) group, whatever the
number of runs, so the rate should grow with the runs; it used to fall (a call per run, and one fit
per run for leave-one-out: 20 runs 20 s, 100 runs no answer in 300 s).
Timings are single runs; expect some noise on a shared machine.
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import tempfile
import time
from pathlib import Path

from comet_dse.answers.calibrate import cross_validate, cross_validation, default_fit, fit, read_runs
from comet_dse.presets.catalog import load_cluster

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "calibration" / "narayanan2021_runs.csv"


def write_runs(path: Path, n: int, seed: int = 0) -> None:
    """``n`` runs: the example's rows in turn, each measured time scaled by a seeded factor in [0.95, 1.05]."""
    with EXAMPLE.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    rng = random.Random(seed)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        for i in range(n):
            row = dict(rows[i % len(rows)])
            row["id"] = f"run{i}"
            row["measured"] = f"{float(row['measured']) * rng.uniform(0.95, 1.05):.6g}"
            writer.writerow(row)


def timed(n: int) -> dict:
    """Read, fit and cross-validate ``n`` runs: seconds, runs per second, and which cross-validation."""
    cluster = load_cluster("dgx-a100-80gb")
    names = default_fit(cluster)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "runs.csv"
        write_runs(path, n)
        started = time.perf_counter()
        runs = read_runs(path)
        read = time.perf_counter() - started
        result = fit(runs, cluster, names)
        fitted = time.perf_counter() - started - read
        errors = cross_validate(runs, cluster, names, result)
        seconds = time.perf_counter() - started
    return {"runs": n, "seconds": seconds, "runs_per_s": n / seconds, "read_s": read, "fit_s": fitted,
            "cross_validation_s": seconds - read - fitted, "method": cross_validation(n)[1],
            "mean_abs_cv_error": float(abs(errors).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="20,200,2000", help="comma-separated run counts (default 20,200,2000)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()
    results = []
    for n in (int(x) for x in args.runs.split(",")):
        r = timed(n)
        results.append(r)
        print(f"{r['runs']:>6,} runs: {r['seconds']:7.1f} s, {r['runs_per_s']:7.1f} runs/s "
              f"(read {r['read_s']:.1f} s, fit {r['fit_s']:.1f} s, {r['method']} {r['cross_validation_s']:.1f} s; "
              f"mean |CV error| {r['mean_abs_cv_error'] * 100:.1f} %)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
