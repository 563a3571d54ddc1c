"""``comet-dse search``: every parallelisation strategy of one model on one cluster, ranked."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from comet_dse.base import jsonout
from comet_dse.cli.options import (
    add_goodput_options, add_search_inputs, add_tokens_option, load_inputs, positive_int, space_from,
)


def add_parser(sub) -> None:
    p = sub.add_parser("search", help="evaluate every parallelisation strategy and rank them")
    add_search_inputs(p)
    p.add_argument("--top", type=positive_int, default=10, help="how many of the fastest to show (default 10)")
    p.add_argument("--output", default=None, help="write every evaluated point to a .parquet or .csv file")
    add_tokens_option(p)
    add_goodput_options(p)
    p.add_argument("--json", action="store_true", help="print JSON (top-k and counts)")


def run(args) -> int:
    from comet_dse.answers.estimate import estimate
    from comet_dse.cli.render import attention_note, render_estimate, render_search
    from comet_dse.design_space.output import to_arrow, write_atomically
    from comet_dse.design_space.search import search, strategy_at
    from comet_dse.strategy.declared import runs_fused_attention
    from comet_dse.workload.families import family_of

    model, cluster = load_inputs(args)
    load_lazy_imports()
    started = time.perf_counter()
    result = search(model, cluster, args.devices, args.global_batch, space_from(args, cluster), tokens=args.tokens)
    elapsed = time.perf_counter() - started
    if args.tokens:
        result = expected(result, cluster, model)
    if args.output:
        write_atomically(to_arrow(result.columns), Path(args.output))
    best = None
    if result.feasible:
        from comet_dse.api import with_band

        best = with_band(estimate(model, cluster, args.devices, strategy_at(result.columns, int(result.ranked[0])),
                                  tokens=args.tokens), cluster, model)
    per_dtype = best_by(result, "dtype")
    note = attention_note(cluster.accelerator, runs_fused_attention(result.columns))
    if args.json:
        top = [{"rank": i + 1, **row_dict(result.columns, int(r))} for i, r in enumerate(result.ranked[:args.top])]
        print(jsonout.dumps({"evaluated": result.evaluated, "feasible": result.feasible, "seconds": elapsed,
                          "infeasible_by_rule": result.infeasible_by_rule, "top": top,
                          "best_by_dtype": {name: {"rank": rank, **row_dict(result.columns, row)}
                                            for name, (rank, row) in per_dtype.items()},
                          "best": best.to_dict() if best else None, "notes": [note] if note else []}, indent=2))
        return 0
    from comet_dse.whole_run.economics import cost_basis

    family = family_of(model)
    print(render_search(model.name, cluster.name, args.devices, args.global_batch, result, elapsed, args.top,
                        cost_basis(cluster), notes=(note,) if note else (), family=family))
    if len(per_dtype) > 1:
        print(render_best_by(result, per_dtype, "precision"))
    if best:
        exp = cluster.accelerator.expansion
        print("\nThe fastest strategy in detail\n")
        print(render_estimate(best, cluster.accelerator.state_capacity, exp.capacity if exp else None,
                              model.tied_embeddings, family))
    if args.output:
        print(f"\nWrote {result.evaluated:,} rows to {args.output}")
    return 0


def expected(result, cluster, model):
    """``result`` with its training columns as their error band's expected values (economics.expected_columns;
    each row's band is its precision's), as the fastest strategy's block below shows them."""
    from dataclasses import replace

    from comet_dse.answers.errorband import band_of_cluster
    from comet_dse.strategy.declared import KNOB
    from comet_dse.whole_run.economics import band_mean, expected_columns

    codes = np.asarray(result.columns["dtype"])
    mean = np.full(len(codes), np.nan)                 # NaN: no band, the model's own figure (expected_columns)
    for code in np.unique(codes):
        value = band_mean(band_of_cluster(cluster, str(KNOB["dtype"].decode(code)), bool(model.moe), kind=model.kind))
        mean[codes == code] = np.nan if value is None else value
    return replace(result, columns=expected_columns(result.columns, mean))


def load_lazy_imports() -> None:
    """Import now what the first evaluation would import lazily, so that "evaluated in" times the search
    alone: pyarrow's first conversion of an array imports pandas where it is installed (0.2-0.4 s on this
    project's machine, more than the search of 17,610 strategies takes)."""
    import pyarrow as pa

    pa.array(np.zeros(1))


def best_by(result, knob: str) -> dict:
    """The fastest feasible row for each value a knob takes among the feasible rows (e.g. the best bf16 and the
    best fp8 strategy of ``--dtype bf16,fp8``): value name -> (rank in the whole ranking, row)."""
    from comet_dse.strategy.declared import KNOB

    out = {}
    codes = result.columns[knob]
    for rank, row in enumerate(result.ranked, start=1):
        name = str(KNOB[knob].decode(codes[int(row)]))
        out.setdefault(name, (rank, int(row)))
    return out


def render_best_by(result, per_value: dict, what: str) -> str:
    """One line per value of ``best_by``: its best strategy's rank, step time, MFU and compact text."""
    from comet_dse.base.text import printable
    from comet_dse.base.units import format_time
    from comet_dse.strategy.declared import KNOBS
    from comet_dse.strategy.text import compact_text

    cols = result.columns
    lines = [f"\nBest per {what}"]
    for name, (rank, row) in per_value.items():
        values = {k.name: k.decode(cols[k.name][row]) for k in KNOBS}
        lines.append(f"  {name:5s} rank {rank:>4}  {format_time(cols['step_time_s'][row]):>10s}  "
                     f"MFU {cols['mfu'][row] * 100:.1f}%  {compact_text(values)}")
    return printable("\n".join(lines))


def row_dict(columns: dict, row: int) -> dict:
    """One row of a result table as plain JSON values, coded knobs as their names."""
    from comet_dse.design_space.output import CODED

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
