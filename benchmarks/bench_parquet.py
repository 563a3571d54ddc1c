"""Encoding one sweep chunk as Parquet: comet-dse's settings against dictionary-encoding every column.

Run:  python benchmarks/bench_parquet.py [--study benchmarks/sweep-10m.yaml]

Evaluates the study's first chunk (as a sweep worker does), then writes its
table to memory with (a) zstd and pyarrow's default dictionary encoding of
every column, (b) ``storage.parquet_options`` (dictionary encoding only for
columns that are not floating point), (c) no dictionary encoding at all.
Prints the best of 7 writes of each, their ratio to (a), and the bytes written.
"""
from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from comet_dse.base.allocator import keep_freed_memory
from comet_dse.design_space import engine
from comet_dse.design_space.storage import parquet_options
from comet_dse.design_space.study import load_study

HERE = Path(__file__).resolve().parent


def first_chunk(study_path: Path):
    study = load_study(study_path)
    chunks, _ = engine.plan(study)
    with tempfile.TemporaryDirectory() as tmp:
        store = engine.PartStore(Path(tmp) / "r", study, chunks, resume=False)
        job = engine.Job(study, chunks[0], store.token, store.parts, 5)
        return engine.run_chunk(study, chunks[0], engine.strategies_of(job))


def best_write(table, options: dict, repeat: int = 7) -> tuple:
    best, size = float("inf"), 0
    for _ in range(repeat):
        buffer = io.BytesIO()
        started = time.perf_counter()
        pq.write_table(table, buffer, **options)
        best = min(best, time.perf_counter() - started)
        size = buffer.tell()
    return best, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=HERE / "sweep-10m.yaml")
    args = parser.parse_args()
    keep_freed_memory()
    table = first_chunk(args.study)
    print(f"chunk: {table.num_rows:,} rows x {table.num_columns} columns")
    settings = {"zstd, dictionary on every column": {"compression": "zstd"},
                "zstd, parquet_options (comet-dse)": parquet_options(table.schema),
                "zstd, no dictionary": {"compression": "zstd", "use_dictionary": False}}
    base = None
    for name, options in settings.items():
        seconds, size = best_write(table, options)
        base = base or (seconds, size)
        print(f"{name:36s} {seconds * 1e3:7.1f} ms ({base[0] / seconds:.2f}x)  {size:>10,} bytes "
              f"({size / base[1]:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
