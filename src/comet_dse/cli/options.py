"""What the commands share: the argument parser, option types, the strategy and search options, and the
inputs every model-and-cluster command loads.

Bad input prints one line ``comet-dse: error: <field>: <what is valid>`` on stderr and exits with status 2,
without a traceback.
"""
from __future__ import annotations

import argparse
import sys

from comet_dse.answers.overrides import add_override_options, cluster_from_args
from comet_dse.base.bounds import BOUNDS, shown
from comet_dse.base.errors import InputError
from comet_dse.strategy.declared import KNOBS
from comet_dse.strategy.knob import GIVEN

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1          # the machine stopped a run (a worker killed): errors.RunFailed
EXIT_STORAGE = 74            # the system would not store or read a file (EX_IOERR of sysexits.h): errors.StorageError
EXIT_INTERRUPTED = 130
DEFAULT_MAX_POINTS = 10**9       # sweep and report refuse a larger study unless --max-points says otherwise
DRY_RUN_POINTS = 10              # design points --dry-run lists


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit status 2.

    ``prog`` is "comet-dse" for the top-level parser and "comet-dse COMMAND" for a command's, so the hint
    names the right help page once.
    """

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        sys.stderr.write(f"comet-dse: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_BAD_INPUT)


def bounded_int(bound: str):
    """argparse type: an integer in the row ``bound`` of bounds.BOUNDS (the same bound a file or the API
    is held to), or a one-line error."""
    row = BOUNDS[bound]

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {row.integer_text()}, got {shown(text)}") from None
        if not row.low <= value <= row.high:
            raise argparse.ArgumentTypeError(f"expected {row.integer_text()}, got {shown(value)}")
        return value
    return parse


positive_int = bounded_int("integer")


def positive_ints(text: str) -> tuple:
    """A comma-separated list of positive integers (--mp 32,64)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return tuple(positive_int(x) for x in items)


def point_count(text: str) -> int:
    """A number of design points: an integer, also written like 1e9 or 2_000_000."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of design points like 1e9, got {text!r}") from None
    if not 1 <= value < 1e18 or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a whole number of design points in [1, 1e18), got {text!r}")
    return int(value)


def note_workers(requested: int) -> None:
    """One stderr line when ``--workers`` asks for more processes than this machine has CPUs: the run uses
    one per CPU (design_space.engine.local_workers)."""
    from comet_dse.design_space.engine import local_workers

    used = local_workers(requested)
    if used < requested:
        print(f"comet-dse: note: --workers {requested:,} is more than this machine's {used} CPUs; "
              f"running {used} worker processes", file=sys.stderr)


def name_list(text: str) -> tuple:
    """A comma-separated list of names (--fit gemm,memory)."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def add_model_inputs(parser: argparse.ArgumentParser) -> None:
    """The model, cluster, device count and sequence length every estimating command takes."""
    parser.add_argument("--model", required=True, help="preset name, model YAML, or Hugging Face config.json")
    parser.add_argument("--cluster", required=True, help="preset name or cluster YAML")
    parser.add_argument("--devices", required=True, type=bounded_int("devices"), help="number of accelerators")
    parser.add_argument("--seq-len", type=bounded_int("seq_len"), default=None,
                        help="sequence length (overrides the model's)")
    add_physical_option(parser)


def add_physical_option(parser: argparse.ArgumentParser) -> None:
    """``--physical``: the burn-test tensor rate instead of the training efficiency measured on public runs."""
    parser.add_argument("--physical", action="store_true",
                        help="run tensor kernels at the physical (burn-test) sustained rate instead of the "
                             "training efficiency measured on public runs of the accelerator (docs/hardware.md, "
                             "'Training efficiency'); for hardware that does not exist yet")


def add_search_inputs(parser: argparse.ArgumentParser) -> None:
    """What `search` and `whatif` search: the model, cluster (with overrides), devices and strategy lists."""
    add_model_inputs(parser)
    add_knob_options(parser, many=True)
    parser.add_argument("--mp", type=positive_ints, default=None, metavar="N[,...]",
                        help="model-parallel degrees MP = TP x PP to try (with --dp: the MP x DP split)")
    parser.add_argument("--max-micro-batch", type=positive_int, default=16,
                        help="largest micro-batch tried when --micro-batch is not given (default 16)")
    parser.add_argument("--max-interleave", type=positive_int, default=8,
                        help="most virtual stages tried when --interleave is not given (default 8)")
    parser.add_argument("--tp-across-nodes", action="store_true",
                        help="also try TP degrees beyond the scale-up domain (the innermost network dimension, "
                             "e.g. 8 NVLink GPUs); by default TP stays inside it unless --tp or --mp names more")
    add_override_options(parser)


def add_knob_options(parser: argparse.ArgumentParser, many: bool) -> None:
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
            tried = knob.cluster_default_text or ("every valid value" if isinstance(knob.search, str)
                                                  else ",".join(map(_shown, knob.search)))
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


def strategy_from(args, devices: int):
    """The one Strategy `estimate`'s options name; dp defaults to what the devices leave."""
    from comet_dse.strategy.declared import Strategy

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


def space_from(args, cluster=None):
    """The SearchSpace of `search`'s options: every knob given on the command line, as values to try; with
    ``cluster``, the defaults that depend on it (flash attention where it has a fused-attention rate, TP
    inside the scale-up domain unless --tp-across-nodes: design_space.space.with_cluster_defaults)."""
    from comet_dse.design_space.space import SearchSpace, with_cluster_defaults

    space = SearchSpace({k.name: getattr(args, k.name) for k in KNOBS
                         if k.search != GIVEN and getattr(args, k.name) is not None},
                        max_micro_batch=args.max_micro_batch, max_interleave=args.max_interleave, mp=args.mp)
    if cluster is None:
        return space
    return with_cluster_defaults(space, cluster, args.devices, getattr(args, "tp_across_nodes", False))


def load_inputs(args) -> tuple:
    """The model (with --seq-len) and the cluster (with --set and --expansion) the options name.

    A Hugging Face config.json's keys that are read but not modelled are named on one stderr line.
    """
    from comet_dse.model.load import unmodelled_note
    from comet_dse.presets.catalog import load_cluster, load_model

    model = load_model(args.model)
    note = unmodelled_note(model)
    if note:
        print(note, file=sys.stderr)
    if args.seq_len:
        model = model.with_seq_len(args.seq_len)
    return model, cluster_from_args(load_cluster(args.cluster, efficiency=efficiency_option(args)), args)


def efficiency_option(args) -> str | None:
    """The `training_efficiency:` setting --physical gives (hardware/efficiency.py), or None: the file's."""
    from comet_dse.hardware.efficiency import PHYSICAL

    return PHYSICAL if getattr(args, "physical", False) else None


def token_count(text: str) -> float:
    """argparse type: a token budget (``15T`` = 1.5e13; economics.token_budget, naming --tokens), or a
    one-line error."""
    from comet_dse.whole_run.economics import token_budget

    try:
        return token_budget(text, "--tokens")
    except InputError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def add_tokens_option(parser: argparse.ArgumentParser) -> None:
    """``--tokens``: the token budget whose time to train, device-hours, energy and cost are reported."""
    parser.add_argument("--tokens", type=token_count, default=None, metavar="N",
                        help="tokens to train on, e.g. 15T: also print time to train, device-hours, energy and "
                             "cost (docs/economics.md)")


# The goodput settings with an option of their own (each is also ``--set <name>=...``): option -> (setting, help).
GOODPUT_OPTIONS = {
    "--goodput": ("goodput", "on|off", "count failures, restarts and checkpoints in the time to train (default on; "
                                       "off: a perfect run)"),
    "--mtbf": ("mtbf", "T", "mean time between failures per device, e.g. 50000h (default: Llama 3's 16,384 GPUs x "
                            "54 days / 419 unexpected interruptions = 50,677 h)"),
    "--restart-time": ("restart_time", "T", "from a failure to training again, re-load aside (default 10min)"),
    "--checkpoint": ("checkpoint", "sync|async", "sync: training waits for the write; async: for the copy to host "
                                                 "memory only (default sync)"),
    "--checkpoint-interval": ("checkpoint_interval", "T", "time between checkpoints (default: the best interval, "
                                                          "Young's sqrt(2 x stall x job MTBF) printed beside it)"),
    "--storage-bandwidth": ("storage_bandwidth", "BW", "checkpoint write and read bandwidth per device (default "
                                                       "122MB/s: Llama 3's 2 TB/s over 16,384 GPUs)"),
}


def add_goodput_options(parser: argparse.ArgumentParser) -> None:
    """The goodput settings (whole_run/goodput.py, docs/economics.md "Goodput") as options of their own: each adds
    ``<setting>=<value>`` to ``--set``, so it is checked and applied the same way."""
    group = parser.add_argument_group("goodput (with --tokens; docs/economics.md)")
    for option, (setting, metavar, text) in GOODPUT_OPTIONS.items():
        group.add_argument(option, dest="overrides", action="append", type=_setting_text(setting),
                           metavar=metavar, help=text)


def _setting_text(setting: str):
    """argparse type: the option's value as ``--set``'s ``<setting>=<value>``."""
    def text(value: str) -> str:
        return f"{setting}={value}"
    return text
