"""The ``comet-dse whatif`` options (kept apart from whatif.py so that building the parser stays light)."""
from __future__ import annotations

import argparse
import math

DEFAULT_FACTORS = (0.5, 2.0)
CAPACITY_RESOURCES = ("hbm_capacity", "sram_capacity", "expansion_capacity")


def add_parser(sub, add_search_inputs) -> None:
    """The ``whatif`` subcommand; ``add_search_inputs(parser)`` adds the model, cluster and strategy options
    that ``search`` takes (cli.py)."""
    p = sub.add_parser("whatif", help="speedup of the best strategy when each cluster resource is scaled, "
                       "and the smallest capacity that makes a split fit")
    add_search_inputs(p)
    p.add_argument("--resources", type=_names, default=None,
                   help="resources to scale, comma-separated, named as --set takes them (default: peak_flops, "
                        "hbm_capacity, hbm_bandwidth, sram_capacity, network_bandwidth, each network dimension's "
                        "link_bandwidth, the expansion tier's capacity and bandwidth)")
    p.add_argument("--scale", type=_factors, default=DEFAULT_FACTORS, metavar="F[,...]",
                   help="factors to scale each resource by (default 0.5,2)")
    p.add_argument("--capacity", default="hbm_capacity", choices=CAPACITY_RESOURCES,
                   help="the capacity whose smallest fitting value is reported for the searched split "
                        "(default hbm_capacity)")
    p.add_argument("--no-fit", action="store_true", help="skip the smallest-capacity search")
    p.add_argument("--figure", default=None, metavar="F.png|F.svg", help="also draw the speedups to this file")
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
