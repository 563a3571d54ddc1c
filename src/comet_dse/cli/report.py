"""``comet-dse report``: run a folder of studies and write figures, data and an HTML report."""
from __future__ import annotations

import sys
from pathlib import Path

from comet_dse.cli.options import (
    DEFAULT_MAX_POINTS, DRY_RUN_POINTS, EXIT_INTERRUPTED, note_workers, point_count, positive_int,
)


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="run a folder of studies and write figures and an HTML report")
    p.add_argument("studies", nargs="?", default="studies/comet", help="folder of study files (default studies/comet)")
    p.add_argument("--output", default="out/comet", help="report folder (default out/comet)")
    p.add_argument("--workers", type=positive_int, default=1, help="local worker processes (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--max-points", type=point_count, default=DEFAULT_MAX_POINTS,
                   help="refuse a study of more design points (default 1e9)")
    p.add_argument("--dry-run", action="store_true",
                   help="print each study's number of design points and first ones; evaluate and write nothing")


def run(args) -> int:
    from comet_dse.base.text import printable
    from comet_dse.cli.render import render_dry_run
    from comet_dse.design_space.engine import first_points
    from comet_dse.report.build import build_report, load_folder

    if args.dry_run:
        _, studies = load_folder(Path(args.studies))
        print("\n\n".join(render_dry_run(s, first_points(s, DRY_RUN_POINTS), args.max_points) for s in studies))
        return 0

    def announce(study) -> None:
        sys.stderr.write(printable(f"comet-dse: {study.name}: {study.points:,} design points\n"))

    def step(text: str) -> None:
        sys.stderr.write(printable(f"comet-dse: {text}\n"))

    note_workers(args.workers)
    try:
        page = build_report(Path(args.studies), Path(args.output), workers=args.workers,
                            progress=not args.no_progress, max_points=args.max_points, announce=announce,
                            on_step=step)
    except KeyboardInterrupt:
        sys.stderr.write("comet-dse: interrupted; no report was written\n")
        return EXIT_INTERRUPTED
    print(f"Wrote {page} (figures in {page.parent / 'figures'}, data in {page.parent / 'data'})")
    return 0
