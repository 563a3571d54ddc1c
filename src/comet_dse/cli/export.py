"""``comet-dse export``: one estimate as simulator inputs (Chakra execution traces, ASTRA-sim 2.0 and 1.0
configurations) in a folder (docs/export.md); transformers and recommendation models (no 1.0 workload for these)."""
from __future__ import annotations

import json
from pathlib import Path

from comet_dse.answers.overrides import add_override_options
from comet_dse.cli.options import add_knob_options, add_model_inputs, bounded_int, load_inputs, strategy_from


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write Chakra execution traces and ASTRA-sim inputs for one strategy")
    add_model_inputs(p)
    add_knob_options(p, many=False)
    add_override_options(p)
    p.add_argument("--output", "-o", required=True, metavar="FOLDER",
                   help="folder to write (created; replaced only when it is an earlier export left unchanged)")
    p.add_argument("--max-nodes", type=bounded_int("integer"), default=None, metavar="N",
                   help="refuse traces of more nodes over all ranks (default 20,000,000)")
    p.add_argument("--no-traces", dest="traces", action="store_false",
                   help="write no Chakra traces: the ASTRA-sim configurations and the 1.0 workload only")
    p.add_argument("--slice", choices=("replica",), default=None,
                   help="write one data-parallel replica's ranks only (a MoE model's first EP block), each the whole "
                        "job's trace of that rank less the collectives that reach other replicas (slice.json lists "
                        "them): a large job under --max-nodes")


def run(args) -> int:
    from comet_dse.export.folder import MAX_NODES, export
    from comet_dse.model.recommendation import Recommendation

    inputs = [Path(ref) for ref in (args.model, args.cluster) if Path(ref).suffix.lower() in (".yaml", ".yml", ".json")]
    model, cluster = load_inputs(args)
    cluster.dim_sizes(args.devices)
    strategy = strategy_from(args, args.devices)
    folder = export(model, cluster, args.devices, strategy, args.output, inputs=inputs,
                    max_nodes=args.max_nodes or MAX_NODES, traces=args.traces, part=args.slice)
    parts = (["chakra/ (one ET per rank)"] if args.traces else []) + ["astrasim2/"]
    parts += ["astrasim1/"] if (folder / "astrasim1").exists() else []
    skipped = ""
    if isinstance(model, Recommendation):
        skipped = " (no astrasim1/: the ASTRA-sim 1.0 workload describes transformers only)"
    elif model.moe:
        skipped = " (no astrasim1/: the ASTRA-sim 1.0 workload describes dense transformer blocks only)"
    if args.slice:
        meta = json.loads((folder / "slice.json").read_text())
        parts.append("slice.json")
        skipped += (f"; a {args.slice} slice: {meta['ranks']:,} of the job's {meta['job_devices']:,} ranks, each the "
                    "job's trace of that rank less the collectives with other replicas (DP gradient reductions and "
                    "gathers; slice.json lists them), estimate.json the whole job's")
    print(f"wrote {folder}: {', '.join(parts)}, estimate.json{skipped}; run astrasim2/run.sh (docs/export.md)")
    return 0
