"""``comet-dse explore``: serve the explorer page on this machine."""
from __future__ import annotations

import logging
import socket
import sys
import threading
import webbrowser

from comet_dse.base.errors import InputError


def serve(host: str = "127.0.0.1", port: int = 8050, open_browser: bool = False) -> int:
    """Serve the page until Ctrl-C; print its address first (one line on stdout)."""
    try:
        import dash  # noqa: F401 - only to check it is installed
    except ImportError:
        raise InputError("explore", "needs Dash: pip install 'comet-dse[explore]'") from None
    from comet_dse.web.app import build_app

    if not 1 <= port <= 65535:
        raise InputError("port", f"must be in [1, 65535], got {port}")
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):      # '[::1]', as a URL writes it: the address inside
        host = host[1:-1]
    _check_free(host, port)
    app = build_app()
    url = page_url(host, port)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)     # no line per request
    print(f"comet-dse explore: open {url} in a browser (Ctrl-C stops it)", flush=True)
    if open_browser:
        threading.Timer(1.0, webbrowser.open, [url]).start()
    try:
        app.run(host=host, port=port, debug=False)
    except SystemExit as exc:       # werkzeug exits when it cannot bind the port
        if exc.code not in (0, None):
            raise InputError("port", f"cannot serve on {host}:{port} (in use?); choose another with --port") from None
    sys.stdout.flush()
    return 0


def page_url(host: str, port: int) -> str:
    """The address a browser opens for a server bound to ``host``: a wildcard address (0.0.0.0, ::, empty)
    as this machine's loopback, an IPv6 address in brackets (RFC 3986: ``http://[::1]:8050/``)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def _check_free(host: str, port: int) -> None:
    """An InputError naming --port when ``host:port`` cannot be bound (in use, or not this machine's)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, port))
    except OSError as exc:
        raise InputError("port", f"cannot serve on {host}:{port} ({exc.strerror or exc}); choose another with "
                         "--port") from None
