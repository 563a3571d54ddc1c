"""``comet-dse whatif``: what scaling each cluster resource buys the best strategy, and the smallest capacity
at which a split fits; as a table, JSON or a figure."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from comet_dse.answers.whatif import CAPACITY_RESOURCES, DEFAULT_FACTORS, CapacityFit, Cell, WhatIf
from comet_dse.base import jsonout, written
from comet_dse.base.errors import InputError
from comet_dse.base.units import format_bytes, format_time
from comet_dse.base.vocabulary import BANDWIDTH_CONVENTION, ERROR_BAND_LABEL, resource as described
from comet_dse.cli.options import add_goodput_options, add_search_inputs, add_tokens_option, load_inputs, space_from
from comet_dse.strategy.text import legend


def add_parser(sub) -> None:
    """The ``whatif`` subcommand: the options of ``search`` and the resources and factors to scale."""
    p = sub.add_parser("whatif", help="speedup of the best strategy when each cluster resource is scaled, "
                       "and the smallest capacity that makes a split fit")
    add_search_inputs(p)
    p.add_argument("--resources", type=_names, default=None,
                   help="resources to scale, comma-separated, named as --set takes them (default: peak_flops, "
                        "hbm_capacity, hbm_bandwidth, sram_capacity, network_bandwidth, each network dimension's "
                        "bandwidth per device per direction (network.<dim>.bandwidth), the expansion tier's "
                        "capacity and bandwidth)")
    p.add_argument("--scale", type=_factors, default=DEFAULT_FACTORS, metavar="F[,...]",
                   help="factors to scale each resource by (default 0.5,2)")
    p.add_argument("--capacity", default="hbm_capacity", choices=CAPACITY_RESOURCES,
                   help="the capacity whose smallest fitting value is reported for the searched split "
                        "(default hbm_capacity)")
    p.add_argument("--no-fit", action="store_true", help="skip the smallest-capacity search")
    p.add_argument("--figure", default=None, metavar="F.png|F.svg", help="also draw the speedups to this file")
    add_tokens_option(p)
    add_goodput_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (SI units)")


def _names(text: str) -> tuple:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated resource names, got {text!r}")
    return names


def _factors(text: str) -> tuple:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive numbers like 0.5,2, got {text!r}") from None
    if not values or not all(0 < v < math.inf for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive numbers like 0.5,2, got {text!r}")
    return values


def run(args) -> int:
    """``comet-dse whatif``: print the table (or JSON) and draw the figure when asked."""
    from comet_dse.answers.whatif import whatif

    if args.figure:          # refused before the search, not after
        if Path(args.figure).suffix.lower() not in (".png", ".svg"):
            raise InputError("--figure", f"{args.figure} must end in .png or .svg")
        written.check_file(args.figure, "--figure", _file_inputs(args))
    from comet_dse.api import whatif_with_band

    model, cluster = load_inputs(args)
    space = space_from(args, cluster)
    result = whatif_with_band(whatif(model, cluster, args.devices, args.global_batch, space,
                                     args.resources, args.scale, None if args.no_fit else args.capacity,
                                     tokens=args.tokens), cluster, model)
    if args.figure:
        written.write_file(args.figure, lambda tmp: figure(result, tmp, Path(args.figure).suffix[1:].lower()),
                           "--figure", _file_inputs(args))
    band = _band(cluster, result, model)
    if args.json:
        print(jsonout.dumps({**result.to_dict(), "error_band": band}, indent=2))
    else:
        from comet_dse.cli.render import attention_note
        from comet_dse.strategy.declared import runs_fused_attention

        note = attention_note(cluster.accelerator, runs_fused_attention(space.values))
        print(render(result) + (f"\n\n{note}" if note else ""))
        if band:
            print(f"\n{ERROR_BAND_LABEL} of the baseline: {band['text']}")
        if args.figure:
            print(f"\nWrote {args.figure}")
    return 0


def _band(cluster, result: WhatIf, model) -> dict | None:
    """The error band (errorband.band_for) of the baseline's best strategy, None when nothing fits."""
    from comet_dse.answers.errorband import band_of_cluster

    strategy = result.baseline.strategy
    return band_of_cluster(cluster, strategy.get("dtype", "bf16"), bool(model.moe), kind=model.kind) if strategy else None


def render(result: WhatIf) -> str:
    """The text table of ``comet-dse whatif``."""
    from comet_dse.base.text import render_table
    b = result.baseline
    lines = [f"What if: {result.model} on {result.devices:,} x {result.cluster}, global batch {result.global_batch:,} "
             f"({b.evaluated:,} strategies per variant)"]
    if b.step_time_s is not None:
        lines.append(f"As it is: {format_time(b.step_time_s)} per step, {b.tokens_per_second:,.0f} {result.unit}/s, "
                     f"with {b.strategy_text}")
        if b.training:
            from comet_dse.cli.render import training_lines

            lines += ["", *training_lines(b.training, result.unit)[:-1]]
    else:
        lines.append(f"As it is: {b.note}")
    if result.cells:
        headers = ["resource", "what", "now"] + [f"x{f:g}" for f in result.factors]
        rows = []
        for resource in dict.fromkeys(c.resource for c in result.cells):
            cells = [c for c in result.cells if c.resource == resource]
            rows.append([resource, _label(resource), _shown(resource, _present_value(cells))]
                        + [_speedup_text(c) for c in cells])
        lines += ["", "Speedup of the best strategy over the cluster as it is:", "",
                  render_table(headers, rows, left=(0, 1)), BANDWIDTH_CONVENTION]
        lines += per_added_lines(result)
    if result.fit is not None:
        lines += ["", fit_text(result.fit)]
    fit = [result.fit.strategy_text] if result.fit else []
    key = legend([b.strategy_text, *(c.strategy_text for c in result.cells), *fit])
    return "\n".join(lines + (["", key] if key else []))


def per_added_lines(result: WhatIf) -> list:
    """The cells ranked by speedup per added dollar (then per added watt): what each change adds to the
    cluster's price and draw (per-unit prices and powers, docs/economics.md), the speedup gain per $1M and
    per kW, and with a token budget the time to train and cost. '-' where the resource has no per-unit figure."""
    from comet_dse.base.text import render_table
    from comet_dse.base.units import format_count, format_duration, format_usd
    from comet_dse.base.vocabulary import training_label

    def key(c: Cell):
        return (c.speedup_per_musd is None, -(c.speedup_per_musd or 0.0), c.speedup_per_kw is None,
                -(c.speedup_per_kw or 0.0))

    tokens = result.tokens
    headers = ["resource", "scale", "speedup", "added price", training_label("speedup_per_musd"),
               "saved per 1 % slower", "added power", training_label("speedup_per_kw"), "saved per 1 % slower"]
    if tokens:
        basis = (result.baseline.training or {}).get("cost_basis", "rent")
        headers += [training_label("time_to_train_s"), f"{training_label('training_cost_usd')} ({basis}ing)"]
    rows = []
    for c in sorted(result.cells, key=key):
        row = [c.resource, f"x{c.factor:g}", f"{c.speedup:.2f}x" if c.speedup is not None else "-",
               format_usd(c.added_usd) if c.added_usd is not None else "-",
               f"{c.speedup_per_musd:+.3g}" if c.speedup_per_musd is not None else "-",
               _saved(c.usd_saved_per_slowdown_pct, format_usd),
               f"{c.added_w / 1e3:+,.1f} kW" if c.added_w is not None else "-",
               f"{c.speedup_per_kw:+.3g}" if c.speedup_per_kw is not None else "-",
               _saved(c.w_saved_per_slowdown_pct, lambda w: f"{w / 1e3:,.2f} kW")]
        if tokens:
            row += [format_duration(c.time_to_train_s) if c.time_to_train_s is not None else "unknown",
                    format_usd(c.training_cost_usd) if c.training_cost_usd is not None else "unknown"]
        rows.append(row)
    head = ("Per added dollar and watt (speedup - 1 per $1M / per kW a scale-up adds; a scale-down: what it saves per "
            "1 % of speed it costs; '-': no per-unit price or power, or not that direction")
    head += f"; training on {format_count(result.tokens)} tokens):" if tokens else "):"
    return ["", head, "", render_table(headers, rows, left=(0,))]


def _saved(value: float | None, shown) -> str:
    """A scale-down's saving per 1 % slower, 'free' where it costs no speed, '-' where there is none."""
    if value is None:
        return "-"
    return "no slowdown" if math.isinf(value) else shown(value)


def _label(resource: str) -> str:
    """A resource's label (vocabulary), or its name when the vocabulary does not know it."""
    try:
        return described(resource).label
    except KeyError:
        return resource


def _present_value(cells: list) -> float | None:
    """A resource's present value, recovered from one of its scaled cells (value / factor)."""
    for c in cells:
        if c.value is not None:
            return c.value / c.factor
    return None


def _shown(resource: str, value: float | None) -> str:
    """The present value in the resource's display unit (vocabulary)."""
    try:
        return described(resource).text(value)
    except KeyError:
        return "-" if value is None else f"{value:g}"


def _speedup_text(cell: Cell) -> str:
    if cell.speedup is not None:
        return f"{cell.speedup:.2f}x"
    if cell.step_time_s is not None:      # fits only when scaled: the baseline had nothing
        return f"fits ({cell.step_time_s:.3g} s)"
    return "out of range" if cell.value is None else "no fit"


def fit_text(fit: CapacityFit) -> str:
    """One line: the smallest capacity at which the constrained space fits."""
    if fit.smallest is None:
        return f"{fit.constraint}: {fit.note}."
    now = "fits now" if fit.fits_now else "does not fit now"
    return (f"Smallest {fit.resource} at which {fit.constraint} has a strategy that fits: {format_bytes(fit.smallest)} "
            f"({fit.smallest:,.0f} B; the cluster has {format_bytes(fit.current)}, {now}), with "
            + (f"{fit.split}: " if fit.split else "") + f"{fit.strategy_text}")


def _file_inputs(args) -> list:
    """The files this whatif reads (a model or cluster given as a path): never an output."""
    return [Path(ref) for ref in (args.model, args.cluster) if Path(ref).suffix.lower() in (".yaml", ".yml", ".json")]


def figure(result: WhatIf, path, fmt: str = "png") -> None:
    """Bars of each resource's speedup per factor, written to ``path`` as ``fmt`` (png or svg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    resources = list(dict.fromkeys(c.resource for c in result.cells))
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(resources) * len(result.factors)))
    height = 0.8 / len(result.factors)
    for i, factor in enumerate(result.factors):
        values = [next((c.speedup or 0.0) for c in result.cells if c.resource == r and c.factor == factor)
                  for r in resources]
        ys = [k + i * height for k in range(len(resources))]
        ax.barh(ys, values, height=height, label=f"x{factor:g}")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks([k + height * (len(result.factors) - 1) / 2 for k in range(len(resources))],
                  [_label(r) for r in resources])
    ax.invert_yaxis()
    ax.set_xlabel("speedup of the best strategy (1 = the cluster as it is; 0 = nothing fits)")
    ax.set_title(f"{result.model} on {result.devices} x {result.cluster}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format=fmt)
    plt.close(fig)
