"""``comet-dse plan``: the cheapest design (cluster, size, strategy) that trains a token budget within a number
of days, and the fastest within a budget in dollars, across cluster presets and sizes (answers/planner.py)."""
from __future__ import annotations

import argparse

from comet_dse.base import jsonout
from comet_dse.base.bounds import BOUNDS
from comet_dse.base.errors import InputError
from comet_dse.cli.options import (
    add_goodput_options, add_physical_option, bounded_int, positive_int, positive_ints, token_count,
)

BASES = ("rent", "own")


def add_parser(sub) -> None:
    from comet_dse.answers.planner import DEFAULT_DEVICES

    p = sub.add_parser("plan", help="the cheapest design that trains N tokens within D days, or the fastest "
                                    "within $B, across cluster presets and sizes")
    p.add_argument("--model", required=True, help="preset name, model YAML, or Hugging Face config.json")
    p.add_argument("--global-batch", required=True, type=bounded_int("global_batch"), help="sequences per step (samples for a recommendation model)")
    p.add_argument("--seq-len", type=bounded_int("seq_len"), default=None, help="sequence length (overrides the model's)")
    p.add_argument("--tokens", required=True, type=token_count, metavar="N", help="tokens to train on, e.g. 15T (samples for a recommendation model)")
    p.add_argument("--days", type=_days, default=None, metavar="D", help="the deadline: the cheapest design "
                   "whose time to train (goodput included) is at most D days")
    p.add_argument("--budget", type=_usd, default=None, metavar="USD",
                   help="the budget: the fastest design whose cost is at most this, e.g. 50M or 5e7 (k, M, G)")
    p.add_argument("--clusters", type=_names, default=None, metavar="NAME[,...]",
                   help="cluster presets or files to compare (default: every cluster preset)")
    p.add_argument("--devices", type=positive_ints, default=DEFAULT_DEVICES, metavar="N[,...]",
                   help="device counts to try; a count a cluster cannot lay out is replaced by the nearest multiple "
                        "of its fixed network dimensions (default " + ",".join(map(str, DEFAULT_DEVICES)) + ")")
    p.add_argument("--basis", choices=BASES, default="rent",
                   help="what every cost is: rent (device-hours x rent) or own (price over lifetime + energy); a "
                        "cluster without that figure is unknown, never costed the other way (default rent)")
    p.add_argument("--slow-end", action="store_true",
                   help="judge the deadline and the budget at the slow end of each design's error band (a design "
                        "without a validated band: of the band assumed for it, docs/accuracy.md)")
    add_physical_option(p)
    p.add_argument("--top", type=positive_int, default=15, help="how many designs to list (default 15)")
    p.add_argument("--all", action="store_true", help="list every design (--top is ignored)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (one is shown after a second)")
    add_goodput_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (SI units)")


def _days(text: str) -> float:
    """A deadline in days, in the number syntax of every other amount (base/units.py: parse_quantity; no
    full-width digits, no 5_0)."""
    from comet_dse.base.units import KIND_COUNT, parse_quantity

    try:
        return BOUNDS["deadline_days"].check("--days", parse_quantity(text, KIND_COUNT, "--days"), text)
    except (ValueError, InputError) as exc:
        raise argparse.ArgumentTypeError(getattr(exc, "message", f"expected a number of days, got {text!r}")) from None


def _usd(text: str) -> float:
    """A budget in USD: a number with an optional k, M or G suffix and an optional $ or USD."""
    from comet_dse.whole_run.economics import usd_amount

    try:
        return BOUNDS["budget_usd"].check("--budget", usd_amount(text, "--budget"), text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(exc.message if "outside" in exc.message
                                         else f"expected USD like 50M or 5e7, got {text!r}") from None


def _names(text: str) -> tuple:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated cluster names, got {text!r}")
    return names


def run(args) -> int:
    from comet_dse.api import plan

    if args.days is None and args.budget is None:
        raise InputError("--days", "give a deadline (--days) or a budget (--budget), or both")
    result = plan(args.model, args.tokens, args.global_batch, days=args.days, budget=args.budget,
                  clusters=args.clusters, devices=args.devices, basis=args.basis, seq_len=args.seq_len,
                  overrides=[tuple(t.split("=", 1)) for t in args.overrides or []], slow_end=args.slow_end,
                  physical=args.physical, progress=not args.no_progress and not args.json)
    if args.json:
        print(jsonout.dumps(result.to_dict(), indent=2))
    else:
        print(render(result, None if args.all else args.top))
    return 0


def _designs(n: int) -> str:
    return f"{n:,} design{'' if n == 1 else 's'}"


def render(result, top: int | None) -> str:
    """The answer lines, then the designs by cost on the plan's basis (unknown costs last; ``top`` of them, None:
    every one), how many of how many are shown, and the designs left out of the cost answers and why."""
    from comet_dse.answers.planner import NO_FIT, left_out
    from comet_dse.base.text import printable, render_table
    from comet_dse.base.units import format_count, format_duration, format_usd

    basis = result.basis
    lines = [f"{result.model}: {format_count(result.tokens)} {result.unit}, global batch {result.global_batch:,}; "
             f"{_designs(sum(1 for c in result.candidates if c.training or c.note == NO_FIT))} "
             f"({len(result.clusters)} cluster{'' if len(result.clusters) == 1 else 's'} x the sizes each takes), "
             "the fastest strategy of each; "
             f"time to train with goodput; cost {basis}ing for all (unknown: "
             f"{'no rent figure' if basis == 'rent' else 'no device price or power'})", ""]
    lines += result.answer_lines()
    ranked = sorted([c for c in result.candidates if c.training],
                    key=lambda c: (c.cost(basis) is None, c.cost(basis) or 0.0, c.training["time_to_train_s"]))
    rows = []
    shown = ranked if top is None else ranked[:top]
    for c in shown:
        t, cost, cr = c.training, c.cost(basis), c.cost_range(basis)
        tr = c.time_range()
        rows.append([c.cluster, f"{c.devices:,}", c.strategy_text, format_duration(t["time_to_train_s"]),
                     (f"{format_duration(tr[0])} .. {format_duration(tr[1])}" + (" (assumed)" if c.band_assumed else ""))
                     if tr else "not validated",
                     f"{t['goodput'] * 100:.1f}%",
                     format_usd(cost) if cost is not None else "unknown",
                     f"{format_usd(cr[0])} .. {format_usd(cr[1])}" if cr and cost is not None else "-"])
    lines += ["", f"The {len(shown)} cheapest of the {len(ranked)} designs that fit"
              + ("" if len(shown) == len(ranked) else " (--all lists every one)") + ":",
              render_table(["cluster", "devices", "strategy", "time to train", "band range", "goodput",
                            f"cost ({basis}ing)", "band range"], rows, left=(0, 2))]
    out = left_out(result.candidates, basis)
    if out:
        lines += ["", f"Left out of the answers, every cost on one basis ({basis}ing): "
                  + "; ".join(f"{c} x {n:,} ({why})" for c, n, why in out)]
    skipped = [c for c in result.candidates if not c.training and c.note == NO_FIT]
    if skipped:
        lines += ["", "No fit: " + ", ".join(f"{c.cluster} x {c.devices:,}" for c in skipped)]
    refused = [c for c in result.candidates if not c.training and c.note != NO_FIT]
    if refused:
        lines += ["", "Sizes not offered: " + "; ".join(f"{c.cluster} x {c.devices:,} ({c.note})" for c in refused)]
    return printable("\n".join(lines))
