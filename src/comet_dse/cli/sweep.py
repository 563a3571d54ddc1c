"""``comet-dse sweep``: run a study (models x cluster variants x strategies) to a result file or folder."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from comet_dse.base import jsonout
from comet_dse.base.errors import InputError
from comet_dse.cli.options import (
    DEFAULT_MAX_POINTS, DRY_RUN_POINTS, EXIT_INTERRUPTED, add_tokens_option, note_workers, point_count, positive_int,
)


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run a study: models x cluster variants x strategies")
    p.add_argument("study", help="study YAML file (see studies/README.md)")
    p.add_argument("--output", default=None,
                   help="result: a .parquet or .csv file, or a name without a suffix for a dataset folder of "
                        "Parquet parts (fastest); a path or an fsspec URL (default: the study's output)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run from its finished chunks")
    p.add_argument("--engine", choices=("local", "dask"), default="local", help="where chunks run (default local)")
    p.add_argument("--workers", type=positive_int, default=1, help="processes (local) or Dask workers (default 1)")
    p.add_argument("--scheduler", default=None,
                   help="address of a running Dask scheduler (with --engine dask); --output must then be on "
                        "storage every worker reaches")
    p.add_argument("--top", type=positive_int, default=5, help="strategies kept per cluster variant (default 5)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the ranking as JSON")
    add_tokens_option(p)
    p.add_argument("--max-points", type=point_count, default=DEFAULT_MAX_POINTS,
                   help="refuse a study of more design points (default 1e9)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the number of design points and the first ones; evaluate and write nothing")


def run(args) -> int:
    from comet_dse.base.text import printable
    from comet_dse.cli.render import render_dry_run, render_sweep
    from comet_dse.design_space.engine import first_points, run_study, summary_path
    from comet_dse.design_space.study import describe, load_study

    if args.scheduler and args.engine != "dask":
        raise InputError("scheduler", "needs --engine dask")
    study = load_study(Path(args.study), None if args.dry_run else args.max_points)
    if args.tokens is not None:          # --tokens replaces the study's token_budget (and so its digest)
        study.token_budget = args.tokens
        study.inputs["token_budget"] = args.tokens
    if args.dry_run:
        print(render_dry_run(study, first_points(study, DRY_RUN_POINTS), args.max_points))
        return 0
    output = args.output or study.output
    if not output:
        raise InputError("output", "the study names no output file; pass --output results.parquet")

    def announce(points: int, chunks: int, done: int) -> None:
        resumed = f", {done:,} of them already done" if done else ""
        sys.stderr.write(printable(f"comet-dse: {study.name}: {points:,} design points in {chunks:,} chunks"
                                   f"{resumed}\n"))

    if not args.scheduler:
        note_workers(args.workers)
    started = time.perf_counter()
    try:
        ranking = run_study(study, output, engine=args.engine, workers=args.workers, scheduler=args.scheduler,
                            resume=args.resume, progress=not args.no_progress, top_k=args.top, on_start=announce)
    except KeyboardInterrupt:
        parts = f"{output}.parts"
        kept = f"finished chunks are kept in {parts}; run the same command with --resume to continue" \
            if "://" in str(output) or Path(parts).is_dir() else "nothing was written"
        sys.stderr.write(printable(f"comet-dse: interrupted; {kept}\n"))
        return EXIT_INTERRUPTED
    elapsed = time.perf_counter() - started
    if args.json:
        print(jsonout.dumps(ranking, indent=2))
        return 0
    print(printable(describe(study)))
    print(render_sweep(ranking, elapsed, baseline_named=_names_baseline(study)))
    print(f"\nWrote {ranking['points']:,} rows to {output}; ranking in {summary_path(output)}")
    return 0


def _names_baseline(study) -> bool:
    """Whether the study file says which variant is the baseline (``baseline:``); without it the first variant
    is, which the output then says."""
    import yaml

    try:
        data = yaml.safe_load(study.source_text)
    except yaml.YAMLError:
        return True
    return not isinstance(data, dict) or "baseline" in data
