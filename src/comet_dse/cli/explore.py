"""``comet-dse explore``: serve the live explorer page (comet_dse.web) on this machine."""
from __future__ import annotations

from comet_dse.cli.options import positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("explore", help="a live explorer in the browser (pip install 'comet-dse[explore]')")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=positive_int, default=8050, help="port to serve on (default 8050)")
    p.add_argument("--open", action="store_true", help="open the page in the default web browser")


def run(args) -> int:
    from comet_dse.web.serve import serve

    return serve(args.host, args.port, args.open)
