"""Command line: ``comet-dse estimate | search | sweep | report | presets | validate``.

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

from comet_dse.errors import InputError
from comet_dse.strategy import CP_ALGORITHMS, DTYPE_CHOICES, PLACEMENTS

EXIT_BAD_INPUT = 2


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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="comet-dse", description="Analytical model of distributed LLM training (COMET methodology).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    est = sub.add_parser("estimate", help="estimate one training iteration")
    est.add_argument("--model", required=True, help="preset name, model YAML, or Hugging Face config.json")
    est.add_argument("--cluster", required=True, help="preset name or cluster YAML")
    est.add_argument("--devices", required=True, type=_positive_int, help="number of accelerators")
    est.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel degree (default 1)")
    est.add_argument("--pp", type=_positive_int, default=1, help="pipeline-parallel degree (default 1)")
    est.add_argument("--dp", type=_positive_int, default=None, help="data-parallel degree (default devices/(tp*cp*pp))")
    est.add_argument("--cp", type=_positive_int, default=1, help="context-parallel degree (default 1)")
    est.add_argument("--ep", type=_positive_int, default=1, help="expert-parallel degree, MoE models (default 1)")
    est.add_argument("--moe-imbalance", type=float, default=1.0,
                     help="tokens on the busiest expert device relative to a balanced router (default 1.0)")
    est.add_argument("--ep-overlap", action="store_true",
                     help="hide expert all-to-alls behind another micro-batch's compute (DualPipe)")
    est.add_argument("--ep-fp8-dispatch", action="store_true",
                     help="with --dtype fp8: send tokens to their experts in fp8 (DeepSeek-V3)")
    est.add_argument("--cp-algorithm", choices=CP_ALGORITHMS, default="ring",
                     help="how CP ranks exchange K and V: ring (overlapped, default) or all-gather (exposed; Llama 3)")
    est.add_argument("--tp-overlap", action="store_true",
                     help="pipeline TP collectives with the adjacent GEMMs in chunks (Megatron-Core --tp-comm-overlap)")
    est.add_argument("--global-batch", type=_positive_int, required=True, help="sequences per iteration")
    est.add_argument("--micro-batch", type=_positive_int, default=1, help="sequences per micro-batch (default 1)")
    est.add_argument("--interleave", type=_positive_int, default=1, help="virtual pipeline stages per device (default 1)")
    est.add_argument("--recompute", choices=("none", "selective", "full"), default="none", help="activation recomputation")
    est.add_argument("--sequence-parallel", action="store_true", help="shard norms/dropout over the TP group")
    est.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0, help="ZeRO stage over the data-parallel group")
    est.add_argument("--dtype", choices=DTYPE_CHOICES, default="bf16", help="training precision (default bf16)")
    est.add_argument("--seq-len", type=_positive_int, default=None, help="sequence length (overrides the model's)")
    est.add_argument("--flash-attention", action="store_true", help="fused attention that never stores the s x s scores")
    est.add_argument("--no-dp-overlap", action="store_true", help="do not overlap the gradient reduction with backward")
    est.add_argument("--grad-accumulation", choices=("fused", "separate"), default="fused",
                     help="fp32 gradient accumulation fused into the GEMM (default) or a separate add per micro-batch")
    est.add_argument("--placement", choices=PLACEMENTS, default="tp-pp-dp",
                     help="order of the parallel axes on the devices, innermost first (default tp-pp-dp)")
    est.add_argument("--json", action="store_true", help="print one JSON object (SI units)")

    sea = sub.add_parser("search", help="evaluate every parallelisation strategy and rank them")
    sea.add_argument("--model", required=True, help="preset name, model YAML, or Hugging Face config.json")
    sea.add_argument("--cluster", required=True, help="preset name or cluster YAML")
    sea.add_argument("--devices", required=True, type=_positive_int, help="number of accelerators")
    sea.add_argument("--global-batch", required=True, type=_positive_int, help="sequences per iteration")
    sea.add_argument("--seq-len", type=_positive_int, default=None, help="sequence length (overrides the model's)")
    sea.add_argument("--dtype", choices=DTYPE_CHOICES, default="bf16", help="training precision")
    sea.add_argument("--flash-attention", action="store_true", help="fused attention for every strategy")
    sea.add_argument("--tp-overlap", action="store_true", help="TP collectives pipelined with GEMMs for every strategy")
    sea.add_argument("--ep-overlap", action="store_true", help="expert all-to-alls overlapped for every strategy")
    sea.add_argument("--ep-fp8-dispatch", action="store_true", help="with --dtype fp8: fp8 expert dispatch")
    sea.add_argument("--cp-algorithm", choices=CP_ALGORITHMS, default="ring", help="K/V exchange for CP > 1")
    sea.add_argument("--tp", type=_int_list, default=None, help="allowed TP degrees, e.g. 4,8 (default: all)")
    sea.add_argument("--pp", type=_int_list, default=None, help="allowed PP degrees (default: all)")
    sea.add_argument("--cp", type=_int_list, default=None, help="allowed CP degrees (default: keep >= 4096 tokens/device)")
    sea.add_argument("--ep", type=_int_list, default=None, help="allowed EP degrees (default: all valid for MoE)")
    sea.add_argument("--micro-batch", type=_int_list, default=None, help="allowed micro-batches (default: all up to 16)")
    sea.add_argument("--recompute", type=_word_list, default=None, help="allowed recompute modes (default: none,selective,full)")
    sea.add_argument("--zero", type=_int_list, default=None, help="allowed ZeRO stages (default: 0,1,2,3)")
    sea.add_argument("--placement", type=_word_list, default=None,
                     help="placements to try, e.g. tp-pp-dp,dp-tp-pp (default: tp-pp-dp)")
    sea.add_argument("--top", type=_positive_int, default=10, help="how many of the fastest to show (default 10)")
    sea.add_argument("--output", default=None, help="write every evaluated point to a .parquet or .csv file")
    sea.add_argument("--json", action="store_true", help="print JSON (top-k and counts)")

    swp = sub.add_parser("sweep", help="run a study: models x cluster variants x strategies")
    swp.add_argument("study", help="study YAML file (see studies/README.md)")
    swp.add_argument("--output", default=None, help="result file, .parquet or .csv (default: the study's output)")
    swp.add_argument("--resume", action="store_true", help="continue an interrupted run from its finished chunks")
    swp.add_argument("--engine", choices=("local", "dask"), default="local", help="where chunks run (default local)")
    swp.add_argument("--workers", type=_positive_int, default=1, help="processes (local) or Dask workers (default 1)")
    swp.add_argument("--scheduler", default=None, help="address of a running Dask scheduler (with --engine dask)")
    swp.add_argument("--top", type=_positive_int, default=5, help="strategies kept per cluster variant (default 5)")
    swp.add_argument("--no-progress", action="store_true", help="no progress bar")
    swp.add_argument("--json", action="store_true", help="print the ranking as JSON")

    rep = sub.add_parser("report", help="run a folder of studies and write figures and an HTML report")
    rep.add_argument("studies", nargs="?", default="studies/comet", help="folder of study files (default studies/comet)")
    rep.add_argument("--output", default="out/comet", help="report folder (default out/comet)")
    rep.add_argument("--workers", type=_positive_int, default=1, help="local worker processes (default 1)")
    rep.add_argument("--no-progress", action="store_true", help="no progress bars")

    pre = sub.add_parser("presets", help="list the built-in models and clusters")
    pre.add_argument("--json", action="store_true", help="print JSON")

    val = sub.add_parser("validate", help="re-predict published measurements and report the error")
    val.add_argument("--data", default=None, help="folder with the validation CSVs (default: ../shared/validation or packaged copy)")
    val.add_argument("--cluster", default="dgx-a100-80gb", help="cluster preset used for every row (default dgx-a100-80gb)")
    val.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _int_list(text: str) -> tuple:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated non-negative integers, got {text!r}")
    return values


def _word_list(text: str) -> tuple:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _strategy_from(args, devices: int):
    from comet_dse.strategy import GradAccumulation, Recompute, Strategy

    inner = args.tp * args.cp * args.pp
    if args.dp is None:
        if devices % inner:
            raise InputError("devices", f"{devices} is not a multiple of tp*cp*pp = {inner}; give --dp or change --tp/--cp/--pp")
        dp = devices // inner
    else:
        dp = args.dp
    if inner * dp != devices:
        raise InputError("devices", f"tp*cp*pp*dp = {args.tp}*{args.cp}*{args.pp}*{dp} = {inner * dp} "
                         f"must equal --devices {devices}")
    return Strategy(
        tp=args.tp, pp=args.pp, dp=dp, global_batch=args.global_batch, micro_batch=args.micro_batch,
        interleave=args.interleave, recompute=Recompute(args.recompute), sequence_parallel=args.sequence_parallel,
        zero=args.zero, dtype=args.dtype, dp_overlap=not args.no_dp_overlap, flash_attention=args.flash_attention,
        grad_accumulation=GradAccumulation(args.grad_accumulation), placement=args.placement,
        cp=args.cp, ep=args.ep, moe_imbalance=args.moe_imbalance, ep_overlap=args.ep_overlap,
        tp_overlap=args.tp_overlap, cp_algorithm=args.cp_algorithm, ep_fp8_dispatch=args.ep_fp8_dispatch,
    )


# Broken rules that make a command-line estimate an input error rather than a result.
SPLIT_RULES = {"ep_experts": "ep", "cp_seq": "cp"}


def cmd_estimate(args) -> int:
    from comet_dse.estimate import estimate
    from comet_dse.presets import load_cluster, load_model
    from comet_dse.report_text import render_estimate

    model = load_model(args.model)
    if args.seq_len:
        model = model.with_seq_len(args.seq_len)
    cluster = load_cluster(args.cluster)
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
        print(render_estimate(result, cluster.accelerator.hbm.capacity, exp.capacity if exp else None))
    return 0


def cmd_search(args) -> int:
    import time

    from comet_dse.estimate import estimate
    from comet_dse.explore.output import to_arrow, write_atomically
    from comet_dse.explore.search import search, strategy_at
    from comet_dse.explore.space import SearchSpace
    from comet_dse.presets import load_cluster, load_model
    from comet_dse.report_text import render_estimate, render_search

    model = load_model(args.model)
    if args.seq_len:
        model = model.with_seq_len(args.seq_len)
    cluster = load_cluster(args.cluster)
    defaults = SearchSpace()
    space = SearchSpace(tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, micro_batch=args.micro_batch,
                        recompute=args.recompute or defaults.recompute, zero=args.zero or defaults.zero,
                        placement=args.placement or defaults.placement,
                        dtype=args.dtype, flash_attention=args.flash_attention, tp_overlap=args.tp_overlap,
                        ep_overlap=args.ep_overlap, ep_fp8_dispatch=args.ep_fp8_dispatch,
                        cp_algorithm=args.cp_algorithm)
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
        print(render_estimate(best, cluster.accelerator.hbm.capacity, exp.capacity if exp else None))
    if args.output:
        print(f"\nWrote {result.evaluated:,} rows to {args.output}")
    return 0


def _row_dict(columns: dict, row: int) -> dict:
    from comet_dse.explore.table import decode

    out = {}
    for name, values in columns.items():
        value = values[row]
        if name in ("recompute", "dtype", "placement"):
            out[name] = decode(name, int(value))
        elif isinstance(value, (np.bool_, bool)):
            out[name] = bool(value)
        elif isinstance(value, (np.integer,)):
            out[name] = int(value)
        else:
            out[name] = float(value)
    return out


def cmd_sweep(args) -> int:
    import time

    from comet_dse.explore.engine import run_study, summary_path
    from comet_dse.explore.study import describe, load_study
    from comet_dse.report_text import render_sweep

    study = load_study(Path(args.study))
    output = args.output or study.output
    if not output:
        raise InputError("output", "the study names no output file; pass --output results.parquet")
    if args.scheduler and args.engine != "dask":
        raise InputError("scheduler", "needs --engine dask")
    started = time.perf_counter()
    try:
        ranking = run_study(study, Path(output), engine=args.engine, workers=args.workers, scheduler=args.scheduler,
                            resume=args.resume, progress=not args.no_progress, top_k=args.top)
    except KeyboardInterrupt:
        sys.stderr.write(f"comet-dse: interrupted; finished chunks are kept in {output}.parts; "
                         "run the same command with --resume to continue\n")
        return 130
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps(ranking, indent=2))
        return 0
    print(describe(study))
    print(render_sweep(ranking, elapsed))
    print(f"\nWrote {ranking['points']:,} rows to {output}; ranking in {summary_path(Path(output))}")
    return 0


def cmd_report(args) -> int:
    from comet_dse.report.build import build_report

    try:
        page = build_report(Path(args.studies), Path(args.output), workers=args.workers,
                            progress=not args.no_progress)
    except KeyboardInterrupt:
        sys.stderr.write("comet-dse: interrupted; no report was written\n")
        return 130
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
    from comet_dse.presets import load_cluster
    from comet_dse.report_text import render_table
    from comet_dse.validation import all_comparisons, summary, validation_dir

    directory = Path(args.data) if args.data else validation_dir()
    if not directory.is_dir():
        raise InputError("data", f"{directory} is not a folder")
    comparisons = all_comparisons(load_cluster(args.cluster), directory)
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


COMMANDS = {"estimate": cmd_estimate, "search": cmd_search, "sweep": cmd_sweep, "report": cmd_report,
            "presets": cmd_presets, "validate": cmd_validate}


def main(argv: list | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except InputError as exc:
        sys.stderr.write(f"comet-dse: error: {exc}\n")
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as Unix tools do.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
