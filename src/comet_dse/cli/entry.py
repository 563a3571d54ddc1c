"""The ``comet-dse`` entry point: the parser of every command, and one place that turns errors into exit
statuses (2 bad input, 74 the operating system refused to store or read a file, 1 a run the machine stopped,
130 interrupted)."""
from __future__ import annotations

import argparse
import sys

from comet_dse.base.allocator import keep_freed_memory
from comet_dse.base.errors import InputError, RunFailed, StorageError
from comet_dse.cli import calibrate, estimate, explore, export, plan, presets, report, search, sweep, validate, whatif
from comet_dse.cli.options import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_RUN_FAILED, EXIT_STORAGE, Parser
from comet_dse.version import __version__

# In the order `comet-dse --help` lists them.
COMMANDS = {"estimate": estimate, "search": search, "whatif": whatif, "plan": plan, "sweep": sweep, "report": report,
            "explore": explore, "presets": presets, "validate": validate, "calibrate": calibrate,
            "export": export}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="comet-dse", description="Analytical model of distributed LLM training (COMET methodology).")
    parser.add_argument("--version", action="version", version=f"comet-dse {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: list | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_freed_memory()      # before anything large is allocated: the batched model runs 1.8x as fast
    try:
        return COMMANDS[args.command].run(args)
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
    except RunFailed as exc:
        # the machine stopped the run (a worker killed): one line, exit status 1
        _error_line(f"comet-dse: error: {exc}")
        return EXIT_RUN_FAILED
    except StorageError as exc:
        # the system would not store a result (a full disk, a read-only file system): its own status
        _error_line(f"comet-dse: error: {exc}")
        return EXIT_STORAGE
    except OSError as exc:
        # any other error the system reports on a file (a vanished folder): the same status, path and cause
        _error_line(f"comet-dse: error: {f'{exc.filename}: ' if exc.filename else ''}{exc.strerror or exc}")
        return EXIT_STORAGE


def _error_line(text: str) -> None:
    """``text`` as one line on stderr, without terminal control characters."""
    from comet_dse.base.text import printable

    sys.stderr.write(printable(text.replace("\n", " ")) + "\n")
