"""The command line: ``comet-dse estimate | search | whatif | sweep | report | explore | presets | validate |
calibrate``, a thin layer over the library with one module per command.

Each command module has ``add_parser(sub)`` (its options; importing it stays light) and ``run(args)`` (which
imports what the command needs and returns the exit status). options.py holds what several commands share,
render.py their terminal text. Bad input prints one line ``comet-dse: error: <field>: <what is valid>`` on
stderr and exits with status 2, without a traceback.
"""
from comet_dse.cli.entry import build_parser, main

__all__ = ["main", "build_parser"]
