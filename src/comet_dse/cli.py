"""Command line: ``comet-dse estimate | search | whatif | sweep | report | explore | presets | validate``.

A thin layer over the library.

Bad input prints one line ``comet-dse: error: <field>: <what is valid>`` on
stderr and exits with status 2, without a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from comet_dse import whatif_cli
from comet_dse.allocator import keep_freed_memory
from comet_dse.errors import InputError
from comet_dse.overrides import add_override_options, cluster_from_args
from comet_dse.strategy import GIVEN, KNOBS

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
DEFAULT_MAX_POINTS = 10**9       # sweep and report refuse a larger study unless --max-points says otherwise
DRY_RUN_POINTS = 10              # design points --dry-run lists


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit status 2."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        sys.stderr.write(f"comet-dse: error: {message} (see comet-dse {self.prog.split()[-1]} --help)\n")
        raise SystemExit(EXIT_BAD_INPUT)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _point_count(text: str) -> int:
    """A number of design points: an integer, also written like 1e9 or 2_000_000."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of design points like 1e9, got {text!r}") from None
    if not 1 <= value < 1e18 or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a whole number of design points in [1, 1e18), got {text!r}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="comet-dse", description="Analytical model of distributed LLM training (COMET methodology).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    est = sub.add_parser("estimate", help="estimate one training iteration")
    est.add_argument("--model", required=True, help="preset name, model YAML, or Hugging Face config.json")
    est.add_argument("--cluster", required=True, help="preset name or cluster YAML")
    est.add_argument("--devices", required=True, type=_positive_int, help="number of accelerators")
    _add_knob_options(est, many=False)
    est.add_argument("--seq-len", type=_positive_int, default=None, help="sequence length (overrides the model's)")
    add_override_options(est)
    est.add_argument("--json", action="store_true", help="print one JSON object (SI units)")

    sea = sub.add_parser("search", help="evaluate every parallelisation strategy and rank them")
    _add_search_inputs(sea)
    sea.add_argument("--top", type=_positive_int, default=10, help="how many of the fastest to show (default 10)")
    sea.add_argument("--output", default=None, help="write every evaluated point to a .parquet or .csv file")
    sea.add_argument("--json", action="store_true", help="print JSON (top-k and counts)")

    swp = sub.add_parser("sweep", help="run a study: models x cluster variants x strategies")
    swp.add_argument("study", help="study YAML file (see studies/README.md)")
    swp.add_argument("--output", default=None,
                     help="result: a .parquet or .csv file, or a name without a suffix for a dataset folder of "
                          "Parquet parts (fastest); a path or an fsspec URL (default: the study's output)")
    swp.add_argument("--resume", action="store_true", help="continue an interrupted run from its finished chunks")
    swp.add_argument("--engine", choices=("local", "dask"), default="local", help="where chunks run (default local)")
    swp.add_argument("--workers", type=_positive_int, default=1, help="processes (local) or Dask workers (default 1)")
    swp.add_argument("--scheduler", default=None,
                     help="address of a running Dask scheduler (with --engine dask); --output must then be on "
                          "storage every worker reaches")
    swp.add_argument("--top", type=_positive_int, default=5, help="strategies kept per cluster variant (default 5)")
    swp.add_argument("--no-progress", action="store_true", help="no progress bar")
    swp.add_argument("--json", action="store_true", help="print the ranking as JSON")
    swp.add_argument("--max-points", type=_point_count, default=DEFAULT_MAX_POINTS,
                     help="refuse a study of more design points (default 1e9)")
    swp.add_argument("--dry-run", action="store_true",
                     help="print the number of design points and the first ones; evaluate and write nothing")

    rep = sub.add_parser("report", help="run a folder of studies and write figures and an HTML report")
    rep.add_argument("studies", nargs="?", default="studies/comet", help="folder of study files (default studies/comet)")
    rep.add_argument("--output", default="out/comet", help="report folder (default out/comet)")
    rep.add_argument("--workers", type=_positive_int, default=1, help="local worker processes (default 1)")
    rep.add_argument("--no-progress", action="store_true", help="no progress bars")
    rep.add_argument("--max-points", type=_point_count, default=DEFAULT_MAX_POINTS,
                     help="refuse a study of more design points (default 1e9)")
    rep.add_argument("--dry-run", action="store_true",
                     help="print each study's number of design points and first ones; evaluate and write nothing")

    whatif_cli.add_parser(sub, _add_search_inputs)

    exp = sub.add_parser("explore", help="a live explorer in the browser (pip install 'comet-dse[explore]')")
    exp.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1: this machine only)")
    exp.add_argument("--port", type=_positive_int, default=8050, help="port to serve on (default 8050)")
    exp.add_argument("--open", action="store_true", help="open the page in the default web browser")

    pre = sub.add_parser("presets", help="list the built-in models and clusters")
    pre.add_argument("--json", action="store_true", help="print JSON")

    val = sub.add_parser("validate", help="re-predict published measurements and report the error")
    val.add_argument("--data", default=None, help="folder with the validation CSVs (default: ../shared/validation or packaged copy)")
    val.add_argument("--cluster", default="dgx-a100-80gb",
                     help="cluster preset for the A100 datasets (default dgx-a100-80gb); h100_public uses dgx-h100")
    val.add_argument("--json", action="store_true", help="print JSON")

    cal = sub.add_parser("calibrate", help="fit a cluster's physical parameters to measured runs (docs/calibration.md)")
    cal.add_argument("runs", help="CSV of measured runs (docs/calibration.md)")
    cal.add_argument("--cluster", required=True, help="the preset or cluster YAML to start from")
    cal.add_argument("--fit", type=_name_list, default=None,
                     help="parameters to fit, comma-separated (default: gemm, memory, the outermost network "
                          "dimension's efficiency, microbatch_overhead; see docs/calibration.md)")
    cal.add_argument("--holdout", type=_name_list, default=None,
                     help="run ids (the `id` column) left out of the fit and reported as held out")
    cal.add_argument("--output", default=None, help="write the calibrated cluster YAML here")
    cal.add_argument("--no-cv", action="store_true", help="skip the leave-one-out cross-validation")
    cal.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _add_search_inputs(parser: argparse.ArgumentParser) -> None:
    """What `search` and `whatif` search: the model, cluster (with overrides), devices and strategy lists."""
    parser.add_argument("--model", required=True, help="preset name, model YAML, or Hugging Face config.json")
    parser.add_argument("--cluster", required=True, help="preset name or cluster YAML")
    parser.add_argument("--devices", required=True, type=_positive_int, help="number of accelerators")
    parser.add_argument("--seq-len", type=_positive_int, default=None, help="sequence length (overrides the model's)")
    _add_knob_options(parser, many=True)
    parser.add_argument("--mp", type=_positive_ints, default=None, metavar="N[,...]",
                        help="model-parallel degrees MP = TP x PP to try (with --dp: the MP x DP split)")
    parser.add_argument("--max-micro-batch", type=_positive_int, default=16,
                        help="largest micro-batch tried when --micro-batch is not given (default 16)")
    parser.add_argument("--max-interleave", type=_positive_int, default=8,
                        help="most virtual stages tried when --interleave is not given (default 8)")
    add_override_options(parser)


def _positive_ints(text: str) -> tuple:
    """A comma-separated list of positive integers (--mp 32,64)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return tuple(_positive_int(x) for x in items)


def _name_list(text: str) -> tuple:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def _add_knob_options(parser: argparse.ArgumentParser, many: bool) -> None:
    """One option per strategy knob (strategy.KNOBS).

    estimate (many=False): one value each; a switch is a flag (--flash-attention,
    or --no-dp-overlap for one that is on by default). search (many=True): a
    comma-separated list of values to try (--tp 4,8, --recompute none,full); a
    switch alone means on (--flash-attention), or takes values (--flash-attention
    on,off); a switch on by default also has its --no- flag. The global batch
    is one required value for both.
    """
    for knob in KNOBS:
        dashed = knob.name.replace("_", "-")
        values = "" if knob.kind is bool or knob.is_choice else f"; {knob.choices_text()}"
        default = knob.default_text or _shown(knob.default)
        if knob.search == GIVEN:
            parser.add_argument(f"--{dashed}", dest=knob.name, type=_knob_value(knob), required=True,
                                metavar=knob.short.upper() if knob.is_choice else "N", help=f"{knob.help}{values}")
        elif not many and knob.kind is bool:
            parser.add_argument(knob.flag, dest=knob.name, action="store_const", const=not knob.default,
                                default=None, help=f"turn off: {knob.help} (on by default)" if knob.default
                                else f"{knob.help} (default off)")
        elif not many:
            parser.add_argument(f"--{dashed}", dest=knob.name, type=_knob_value(knob), default=None,
                                metavar=_metavar(knob), help=f"{knob.help}{values} (default {default})")
        else:
            tried = "every valid value" if isinstance(knob.search, str) else ",".join(map(_shown, knob.search))
            parser.add_argument(f"--{dashed}", dest=knob.name, type=_knob_values(knob), default=None,
                                nargs="?" if knob.kind is bool else None, const=(True,) if knob.kind is bool else None,
                                metavar=_metavar(knob) + "[,...]",
                                help=f"{knob.help}; values to try{values} (default {tried})")
            if knob.kind is bool and knob.default:
                parser.add_argument(knob.flag, dest=knob.name, action="store_const", const=(False,),
                                    help=f"turn it off: same as --{dashed} off")


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _metavar(knob) -> str:
    if knob.kind is bool:
        return "on|off"
    return "|".join(str(m) for m in knob.kind) if knob.is_choice else ("X" if knob.kind is float else "N")


def _knob_value(knob):
    """argparse type of one value of ``knob``: its text coerced by the knob, or a one-line error."""
    def parse(text: str):
        try:
            return knob.coerce(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _knob_values(knob):
    """argparse type of a comma-separated list of values of ``knob``."""
    one = _knob_value(knob)

    def parse(text: str) -> tuple:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected comma-separated values ({knob.choices_text()}), got {text!r}")
        return tuple(one(x) for x in items)
    return parse


def _strategy_from(args, devices: int):
    from comet_dse.strategy import Strategy

    given = {k.name: getattr(args, k.name) for k in KNOBS if getattr(args, k.name) is not None}
    tp, cp, pp = given.get("tp", 1), given.get("cp", 1), given.get("pp", 1)
    inner = tp * cp * pp
    if "dp" not in given:
        if devices % inner:
            raise InputError("devices", f"{devices} is not a multiple of tp*cp*pp = {inner}; give --dp or change --tp/--cp/--pp")
        given["dp"] = devices // inner
    dp = given["dp"]
    if inner * dp != devices:
        raise InputError("devices", f"tp*cp*pp*dp = {tp}*{cp}*{pp}*{dp} = {inner * dp} "
                         f"must equal --devices {devices}")
    return Strategy(**given)


def _space_from(args):
    """The SearchSpace of `search`'s options: every knob given on the command line, as values to try."""
    from comet_dse.explore.space import SearchSpace

    return SearchSpace({k.name: getattr(args, k.name) for k in KNOBS
                        if k.search != GIVEN and getattr(args, k.name) is not None},
                       max_micro_batch=args.max_micro_batch, max_interleave=args.max_interleave, mp=args.mp)


# Broken rules that make a command-line estimate an input error rather than a result.
SPLIT_RULES = {"ep_experts": "ep", "cp_seq": "cp", "attention_kernel": "attention-kernel"}


def _note_unmodelled(model) -> None:
    """One stderr line naming the config.json keys that were read but are not modelled (model/load.py)."""
    from comet_dse.model.load import unmodelled_note

    note = unmodelled_note(model)
    if note:
        print(note, file=sys.stderr)


def cmd_estimate(args) -> int:
    from comet_dse.estimate import estimate
    from comet_dse.presets import load_cluster, load_model
    from comet_dse.report_text import render_estimate

    model = load_model(args.model)
    _note_unmodelled(model)
    if args.seq_len:
        model = model.with_seq_len(args.seq_len)
    cluster = cluster_from_args(load_cluster(args.cluster), args)
    cluster.dim_sizes(args.devices)
    strategy = _strategy_from(args, args.devices)
    result = estimate(model, cluster, args.devices, strategy)
    reasons = dict(zip(result.broken_rules, result.reasons))   # the two lists run in rule order
    for code, field in SPLIT_RULES.items():
        if code in reasons:
            raise InputError(field, reasons[code])
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        exp = cluster.accelerator.expansion
        print(render_estimate(result, cluster.accelerator.state_capacity, exp.capacity if exp else None))
    return 0


def cmd_search(args) -> int:
    import time

    from comet_dse.estimate import estimate
    from comet_dse.explore.output import to_arrow, write_atomically
    from comet_dse.explore.search import search, strategy_at
    from comet_dse.presets import load_cluster, load_model
    from comet_dse.report_text import render_estimate, render_search

    model = load_model(args.model)
    _note_unmodelled(model)
    if args.seq_len:
        model = model.with_seq_len(args.seq_len)
    cluster = cluster_from_args(load_cluster(args.cluster), args)
    space = _space_from(args)
    started = time.perf_counter()
    result = search(model, cluster, args.devices, args.global_batch, space)
    elapsed = time.perf_counter() - started
    if args.output:
        write_atomically(to_arrow(result.columns), Path(args.output))
    best = None
    if result.feasible:
        best = estimate(model, cluster, args.devices, strategy_at(result.columns, int(result.ranked[0])))
    if args.json:
        top = [{"rank": i + 1, **_row_dict(result.columns, int(r))} for i, r in enumerate(result.ranked[:args.top])]
        print(json.dumps({"evaluated": result.evaluated, "feasible": result.feasible, "seconds": elapsed,
                          "infeasible_by_rule": result.infeasible_by_rule, "top": top,
                          "best": best.to_dict() if best else None}, indent=2))
        return 0
    print(render_search(model.name, cluster.name, args.devices, args.global_batch, result, elapsed, args.top))
    if best:
        exp = cluster.accelerator.expansion
        print("\nThe fastest strategy in detail\n")
        print(render_estimate(best, cluster.accelerator.state_capacity, exp.capacity if exp else None))
    if args.output:
        print(f"\nWrote {result.evaluated:,} rows to {args.output}")
    return 0


def _row_dict(columns: dict, row: int) -> dict:
    from comet_dse.explore.output import CODED

    out = {}
    for name, values in columns.items():
        value = values[row]
        if name in CODED:
            out[name] = CODED[name][int(value)]
        elif isinstance(value, (np.bool_, bool)):
            out[name] = bool(value)
        elif isinstance(value, (np.integer,)):
            out[name] = int(value)
        else:
            out[name] = float(value)
    return out


def cmd_sweep(args) -> int:
    import time

    from comet_dse.explore.engine import first_points, run_study, summary_path
    from comet_dse.explore.study import describe, load_study
    from comet_dse.report_text import printable, render_dry_run, render_sweep

    if args.scheduler and args.engine != "dask":
        raise InputError("scheduler", "needs --engine dask")
    study = load_study(Path(args.study), None if args.dry_run else args.max_points)
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
        print(json.dumps(ranking, indent=2))
        return 0
    print(printable(describe(study)))
    print(render_sweep(ranking, elapsed))
    print(f"\nWrote {ranking['points']:,} rows to {output}; ranking in {summary_path(output)}")
    return 0


def cmd_report(args) -> int:
    from comet_dse.explore.engine import first_points
    from comet_dse.report.build import build_report, load_folder
    from comet_dse.report_text import printable, render_dry_run

    if args.dry_run:
        _, studies = load_folder(Path(args.studies))
        print("\n\n".join(render_dry_run(s, first_points(s, DRY_RUN_POINTS), args.max_points) for s in studies))
        return 0

    def announce(study) -> None:
        sys.stderr.write(printable(f"comet-dse: {study.name}: {study.points:,} design points\n"))

    try:
        page = build_report(Path(args.studies), Path(args.output), workers=args.workers,
                            progress=not args.no_progress, max_points=args.max_points, announce=announce)
    except KeyboardInterrupt:
        sys.stderr.write("comet-dse: interrupted; no report was written\n")
        return EXIT_INTERRUPTED
    print(f"Wrote {page} (figures in {page.parent / 'figures'}, data in {page.parent / 'data'})")
    return 0


def cmd_presets(args) -> int:
    from comet_dse.presets import load_cluster, load_model, preset_names
    from comet_dse.report_text import describe_peak, render_table
    from comet_dse.units import format_bytes, format_rate

    models = [load_model(n) for n in preset_names("models")]
    clusters = [load_cluster(n) for n in preset_names("clusters")]
    if args.json:
        print(json.dumps({
            "models": [{"name": m.name, "params": m.total_params(), "layers": m.layers, "hidden": m.hidden,
                        "description": m.description, "source": m.source} for m in models],
            "clusters": [{"name": c.name, "device": c.accelerator.name, "description": c.description,
                          "source": c.source} for c in clusters],
        }, indent=2))
        return 0
    rows = [[m.name, f"{m.total_params() / 1e9:.1f}B", m.layers, m.hidden, m.attention.heads,
             m.attention.kv_heads, m.mlp.ffn, m.mlp.kind.value, m.seq_len, m.description] for m in models]
    print("Models")
    print(render_table(["name", "params", "layers", "hidden", "heads", "kv", "ffn", "mlp", "seq", "description"], rows,
                       left=(0, 7, 9)))
    rows = []
    for c in clusters:
        acc = c.accelerator
        net = " x ".join(f"{d.name}({d.size or 'n'}, {d.topology.value}, {format_rate(d.link_bandwidth * d.links_per_device, 'B/s')})"
                         for d in c.network)
        rows.append([c.name, acc.name, describe_peak(acc.peak_flops), format_bytes(acc.hbm.capacity),
                     format_rate(acc.hbm.bandwidth, "B/s"), format_bytes(acc.sram.capacity), net])
    print("\nClusters")
    print(render_table(["name", "device", "peak", "HBM", "HBM bw", "SRAM", "network (innermost first)"], rows,
                       left=(0, 1, 6)))
    return 0


def cmd_validate(args) -> int:
    import csv

    from comet_dse.presets import load_cluster
    from comet_dse.report_text import render_table
    from comet_dse.validation import all_comparisons, summary, validation_dir

    directory = Path(args.data) if args.data else validation_dir()
    if not directory.is_dir():
        raise InputError("data", f"{directory} is not a folder")
    cluster = load_cluster(args.cluster)
    try:
        comparisons = all_comparisons(cluster, directory)
    except InputError:
        raise
    except KeyError as exc:
        raise InputError("data", f"a CSV in {directory} lacks the column {exc.args[0]!r}") from None
    except (ValueError, TypeError, ArithmeticError, csv.Error) as exc:     # a malformed measurement file
        raise InputError("data", f"a CSV in {directory} holds a value that is not valid: {exc}") from None
    stats = summary(comparisons)
    if args.json:
        print(json.dumps({
            "data": str(directory),
            "rows": [{"dataset": c.dataset, "label": c.label, "predicted_s": c.predicted, "measured_s": c.measured,
                      "error": c.error} for c in comparisons],
            "summary": stats,
        }, indent=2))
        return 0
    print(f"Validation against published runs in {directory} (cluster preset {args.cluster})\n")
    rows = [[c.dataset.removesuffix(".csv"), c.label, f"{c.predicted:.4g}", f"{c.measured:.4g}", f"{c.error * 100:+.1f}%"]
            for c in comparisons]
    print(render_table(["dataset", "run", "predicted s", "measured s", "error"], rows, left=(0, 1)))
    print()
    rows = [[k.removesuffix(".csv"), v["rows"], f"{v['mean_abs_error'] * 100:.1f}%", f"{v['max_abs_error'] * 100:.1f}%"]
            for k, v in stats.items()]
    print(render_table(["dataset", "rows", "mean |error|", "max |error|"], rows))
    return 0


def cmd_whatif(args) -> int:
    from comet_dse.presets import load_cluster, load_model
    from comet_dse.whatif import run_cli

    model = load_model(args.model)
    _note_unmodelled(model)
    if args.seq_len:
        model = model.with_seq_len(args.seq_len)
    return run_cli(args, model, cluster_from_args(load_cluster(args.cluster), args), _space_from(args))


def cmd_explore(args) -> int:
    from comet_dse.explorer.serve import serve

    return serve(args.host, args.port, args.open)


def cmd_calibrate(args) -> int:
    from comet_dse.calibrate_cli import run_calibrate

    return run_calibrate(args)


COMMANDS = {"estimate": cmd_estimate, "search": cmd_search, "sweep": cmd_sweep, "report": cmd_report,
            "presets": cmd_presets, "validate": cmd_validate, "calibrate": cmd_calibrate,
            "whatif": cmd_whatif, "explore": cmd_explore}


def main(argv: list | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_freed_memory()      # before anything large is allocated: the batched model runs 1.8x as fast
    try:
        return COMMANDS[args.command](args)
    except InputError as exc:
        _error_line(f"comet-dse: error: {exc}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        sys.stderr.write("comet-dse: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as Unix tools do.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        # the machine, not the input (a full disk, a vanished folder): one line, exit status 1
        _error_line(f"comet-dse: error: {f'{exc.filename}: ' if exc.filename else ''}{exc.strerror or exc}")
        return 1


def _error_line(text: str) -> None:
    """``text`` as one line on stderr, without terminal control characters."""
    from comet_dse.report_text import printable

    sys.stderr.write(printable(text.replace("\n", " ")) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
