"""The batched cost model's rate (or a sweep's) in this checkout against another git revision, as a ratio.

Run:  python benchmarks/bench_model_ab.py --against REV [--rounds 5] [--points 250000] [--sweep]

Both sides evaluate the same design points (every strategy of megatron-1t on
4096 TPU v4 chips with micro-batches up to 64, repeated to --points, the set
benchmarks/bench_speed.py uses) through ``evaluate_columns``, each in a fresh
process pinned to one core, alternating A and B for --rounds rounds (A first
in odd rounds, B first in even ones) so that the machine's drift and any
advantage of going first hit both alike. Prints each side's median rate, the ratio
of the medians with the median and range of the per-round ratios (each round's A over
its B: a noisy machine shows in the range; an A/A run against HEAD measures it), and whether the two sides' result columns are bit-identical
(NaN equal to NaN). REV is any git revision (a commit, a tag, HEAD~3); its
``src`` tree is exported to a temporary folder with ``git archive``.
With --sweep, each round instead times benchmarks/sweep-10m.yaml on 2 local
worker processes into a dataset folder (as ``comet-dse sweep --workers 2``),
and the ratio is of the sweeps' median times.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _first_module(*names):
    """The first of ``names`` that imports: a module under its name in the revision on the path (the house
    issue moved comet_dse.allocator to comet_dse.base.allocator and comet_dse.presets to
    comet_dse.presets.catalog)."""
    import importlib

    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(" nor ".join(names))


def _design_space():
    """The package of the sweep engine, under its name in the revision on the path: comet_dse.design_space
    (comet_dse.explore before the first house issue), with its space, table, engine and study modules loaded."""
    import importlib
    import types

    package = _first_module("comet_dse.design_space", "comet_dse.explore").__name__
    return types.SimpleNamespace(**{m: importlib.import_module(f"{package}.{m}")
                                    for m in ("space", "table", "engine", "study")})


def child(points: int, out: Path) -> None:
    """Evaluate the benchmark points with whichever comet_dse is first on the path; write rate and columns."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import comet_dse

    keep_freed_memory = _first_module("comet_dse.base.allocator", "comet_dse.allocator").keep_freed_memory
    catalog = _first_module("comet_dse.presets.catalog", "comet_dse.presets")
    load_cluster, load_model = catalog.load_cluster, catalog.load_model
    engine = _design_space()
    SearchSpace, enumerate_strategies = engine.space.SearchSpace, engine.space.enumerate_strategies
    evaluate_columns = engine.table.evaluate_columns
    keep_freed_memory()
    model, cluster = load_model("megatron-1t"), load_cluster("tpu-v4")
    st = enumerate_strategies(model, 4096, 2048, SearchSpace(max_micro_batch=64))
    st = st.take(_earlier_space(model, st))
    big = st.take(np.resize(np.arange(len(st)), points))
    evaluate_columns(model, cluster, 4096, big)           # warm up (imports, allocator)
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        cols = evaluate_columns(model, cluster, 4096, big)
        seconds.append(time.perf_counter() - started)
    np.savez(out, **{k: np.asarray(v) for k, v in cols.items()})
    out.with_suffix(".json").write_text(json.dumps({"rate": points / min(seconds), "module": comet_dse.__file__}))


def _earlier_space(model, st) -> np.ndarray:
    """The points of the default search as it was before both pipeline splits were searched (issue 28): the
    balanced split, and interleaving only where it divides a stage's layers. Newer revisions enumerate more; the
    benchmark keeps the same points on both sides, so the ratio is of the cost model alone."""
    keep = np.ones(len(st), dtype=bool)
    if hasattr(st, "pipeline_split"):
        keep &= np.asarray(st.pipeline_split) == 0            # PipelineSplit.BALANCED
    pp, v = np.asarray(st.pp, dtype=int), np.asarray(st.interleave, dtype=int)
    even = (model.layers % pp == 0) & ((model.layers // pp) % v == 0)
    keep &= (v == 1) | even
    return np.flatnonzero(keep)


def child_sweep(out: Path) -> None:
    """Time the 10-million-point study on 2 local worker processes with whichever comet_dse is first on the path."""
    import comet_dse

    keep_freed_memory = _first_module("comet_dse.base.allocator", "comet_dse.allocator").keep_freed_memory
    engine = _design_space()
    run_study, load_study = engine.engine.run_study, engine.study.load_study
    keep_freed_memory()
    study = load_study(HERE / "sweep-10m.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        ranking = run_study(study, Path(tmp) / "dataset", workers=2, progress=False)
        seconds = time.perf_counter() - started
    out.with_suffix(".json").write_text(json.dumps({"rate": ranking["points"] / seconds, "module": comet_dse.__file__}))


def export(revision: str, into: Path) -> Path:
    """The ``src`` tree of ``revision``, extracted under ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "src.tar"
    with archive.open("wb") as f:
        done = subprocess.run(["git", "archive", revision, "src"], cwd=ROOT, stdout=f, stderr=subprocess.PIPE)
    if done.returncode != 0:
        print(f"bench_model_ab.py: error: --against: git cannot export src at {revision!r} "
              "(give a commit, tag or branch of this repository)", file=sys.stderr)
        raise SystemExit(2)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run_side(src: Path, points: int, out: Path, sweep: bool) -> float:
    env = dict(os.environ, PYTHONPATH=str(src))
    mode = ["--sweep"] if sweep else []
    subprocess.run([sys.executable, __file__, "--child", str(out), "--points", str(points)] + mode, env=env, check=True)
    info = json.loads(out.with_suffix(".json").read_text())
    if not Path(info["module"]).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"the child imported {info['module']}, not the tree under {src}")
    return info["rate"]


def identical(a: Path, b: Path) -> list:
    """Columns that differ between two result files (NaN equals NaN)."""
    x, y = np.load(a), np.load(b)
    differ = sorted(set(x.files) ^ set(y.files))
    for name in set(x.files) & set(y.files):
        u, v = x[name], y[name]
        same = (u == v) | (np.isnan(u) & np.isnan(v)) if u.dtype.kind == "f" else u == v
        if u.shape != v.shape or not np.all(same):
            differ.append(name)
    return differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="the git revision to compare with (B); A is this checkout's src")
    parser.add_argument("--rounds", type=int, default=5, help="A/B rounds (default 5)")
    parser.add_argument("--points", type=int, default=250_000, help="design points per evaluation (default 250000)")
    parser.add_argument("--sweep", action="store_true", help="compare the sweep of benchmarks/sweep-10m.yaml instead")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_sweep(args.child) if args.sweep else child(args.points, args.child)
        return 0
    if not args.against:
        parser.error("--against REV is required")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        other = export(args.against, tmp / "b")
        rates = {"A": [], "B": []}
        sides = (("A", ROOT / "src"), ("B", other))
        for i in range(args.rounds):
            for side, src in (sides if i % 2 == 0 else sides[::-1]):    # A first, then B first: no order bias
                rates[side].append(run_side(src, args.points, tmp / f"{side}.npz", args.sweep))
            print(f"round {i + 1}: A {rates['A'][-1] / 1e6:.2f} M/s, B {rates['B'][-1] / 1e6:.2f} M/s", flush=True)
        differ = None if args.sweep else identical(tmp / "A.npz", tmp / "B.npz")
    a, b = statistics.median(rates["A"]), statistics.median(rates["B"])
    where = "a sweep on 2 worker processes" if args.sweep else "one core"
    print(f"A (this checkout): {a / 1e6:.2f} M points/s, {where} (median of {args.rounds})")
    print(f"B ({args.against}): {b / 1e6:.2f} M points/s, {where}")
    paired = sorted(x / y for x, y in zip(rates["A"], rates["B"]))
    print(f"A / B: {a / b:.2f}x (per round, A over the B beside it: median {statistics.median(paired):.2f}x, "
          f"range {paired[0]:.2f}-{paired[-1]:.2f}x; run --against HEAD for this machine's A/A spread)")
    if differ is not None:
        print("results: bit-identical" if not differ else f"results differ in {len(differ)} columns: {differ[:8]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
