"""``export``: one estimate as a folder of simulator inputs, written whole or not at all.

    OUTPUT/
      estimate.json          comet-dse's estimate of the same point (the figures to compare a run with)
      chakra/workload.R.et   one Chakra ET per rank R (ASTRA-sim reads workload.<rank>.et)
      chakra/ranks.json      rank -> its TP index, pipeline stage, DP index and node count (a recommendation
                             model: its DP index and node count)
      astrasim2/             network.yml, system.json, remote_memory.json, comm_groups.json, run.sh
      astrasim1/             workload.txt, system.txt, network.json (transformers, pure MP x DP splits only: pp 1)
      slice.json             with --slice: which ranks the folder holds and the collectives it leaves out
                             (slicing.py)

A model's traces come from its layout: ``members`` (communicator group id -> ranks), ``node_count()``,
``traces()`` ((rank, its ranks.json entry, its TraceNodes) of every rank), ``v1`` (whether the ASTRA-sim 1.0
workload describes it) and ``fewer`` (what shortens its traces, for the --max-nodes refusal): a transformer's
from plan.py and schedule.py (``TransformerLayout``), a recommendation model's from recommendation.py.

The folder is built under a temporary name beside OUTPUT, sealed with a manifest (written.seal) and
renamed into place; an existing OUTPUT is replaced only when it is an export comet-dse wrote and nobody
changed since (written.check_folder), or empty.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from comet_dse.answers.estimate import estimate
from comet_dse.base import jsonout, written
from comet_dse.base.errors import InputError
from comet_dse.export import astrasim_inputs as asi
from comet_dse.export import recommendation
from comet_dse.export.chakra import encode_rank
from comet_dse.export.chakra_schema import schema
from comet_dse.export.plan import Plan, Where, plan_of
from comet_dse.export.schedule import groups_of, rank_trace
from comet_dse.export.slicing import SLICES, ReplicaSlice, replica_ranks
from comet_dse.hardware.spec import Cluster
from comet_dse.model.recommendation import Recommendation
from comet_dse.model.spec import Transformer
from comet_dse.strategy.declared import Strategy

MARKER = ".comet-dse-export"
KIND = "simulator export"
MAX_NODES = 20_000_000       # nodes over all ranks before an export is refused (--max-nodes)
# Ranks an export writes: one trace and one communicator-list entry per group each; 10 M ranks with --no-traces
# ran 112 s into 3.9 GB. Beyond 2^20 (with --no-traces about 5 s and 22 MB for llama3-8b at TP 8, and far past
# the tens of thousands of NPUs ASTRA-sim runs are reported at) it is refused before any work.
MAX_RANKS = 2**20
WORKLOAD = "workload"        # the ET files' prefix: chakra/workload.<rank>.et


def node_count(plan: Plan, groups) -> int:
    """Nodes over all ranks: each stage's trace length times the ranks that run it (a trace's length depends
    on its stage only)."""
    per_stage = sum(len(rank_trace(plan, groups, Where(0, 0, s, 0))) for s in range(plan.pp))
    return per_stage * plan.tp * plan.cp * plan.dp


class TransformerLayout:
    """A transformer's export: its Plan and groups (schedule.py); the 1.0 workload where pp and cp are 1 and the
    model is dense (the fork's workload describes dense transformer blocks only)."""

    fewer = "fewer devices, micro-batches or layers"     # what makes its traces shorter (the --max-nodes refusal)

    def __init__(self, plan: Plan):
        self.plan, self.groups = plan, groups_of(plan)
        self.v1 = plan.strategy.pp == 1 and plan.strategy.cp == 1 and not plan.model.moe

    @property
    def devices(self) -> int:
        return self.plan.devices

    @property
    def members(self) -> dict:
        return self.groups.members

    def node_count(self) -> int:
        return node_count(self.plan, self.groups)

    def traces(self):
        """(rank, {"tp", "cp", "pp", "dp"}, its TraceNodes) of every rank, by rank."""
        for w in self.plan.places():
            yield (self.plan.rank(w), {"tp": w.tp, "cp": w.cp, "pp": w.pp, "dp": w.dp},
                   rank_trace(self.plan, self.groups, w))


def layout_of(model, cluster: Cluster, devices: int, strategy: Strategy, part: str | None = None):
    """The export layout of ``model``'s family: recommendation.layout_of or a TransformerLayout; with ``part``
    ("replica") a transformer's slice (slicing.py)."""
    if isinstance(model, Recommendation):
        if part is not None:
            raise InputError("slice", "--slice lays out transformers only; a recommendation model's step is one "
                             "data-parallel exchange over every device")
        return recommendation.layout_of(model, cluster, devices, strategy)
    plan = plan_of(model, cluster, devices, strategy)
    return TransformerLayout(plan) if part is None else ReplicaSlice(plan)


def export(model: Transformer | Recommendation, cluster: Cluster, devices: int, strategy: Strategy, output, inputs=(),
           max_nodes: int = MAX_NODES, traces: bool = True, part: str | None = None) -> Path:
    """Write the export of one point to ``output``; every refusal is an InputError raised before anything is
    written. ``traces`` False: no chakra/ folder (the ASTRA-sim configurations and the 1.0 workload only,
    e.g. for the paper's 4,096-device splits). ``part``: None (every rank) or a slice of SLICES ("replica":
    slicing.py). Returns the folder."""
    output = Path(os.path.abspath(output))
    if part is not None and part not in SLICES:
        raise InputError("slice", f"must be one of {', '.join(SLICES)}, got {part!r}")
    ranks = devices if part is None or isinstance(model, Recommendation) else replica_ranks(model, strategy)
    if ranks > MAX_RANKS:
        raise InputError("devices", f"an export writes every rank's trace and communicator groups; {ranks:,} ranks "
                         f"is more than {MAX_RANKS:,} (ASTRA-sim simulations run tens of thousands): export a smaller "
                         "job of the same strategy" + ("" if part else ", or one replica of it (--slice replica)"))
    result = estimate(model, cluster, devices, strategy)
    if not result.runnable:
        raise InputError("strategy", "this strategy cannot run, so there is no step to export: "
                         + "; ".join(r for r, code in zip(result.reasons, result.broken_rules) if code != "memory"))
    layout = layout_of(model, cluster, devices, strategy, part)
    written_ranks = getattr(layout, "devices", devices)
    total = layout.node_count() if traces else 0
    if total > max_nodes:
        replicas = not (part or isinstance(model, Recommendation)) and layout.plan.dp > replica_ranks(
            model, strategy) // (strategy.tp * strategy.cp * strategy.pp)
        whole = ", export one replica (--slice replica)" if replicas else ""
        raise InputError("max-nodes", f"the traces would hold {total:,} nodes over {written_ranks:,} ranks"
                         + (f" (a {part} slice of {devices:,})" if part else "") + f", more than {max_nodes:,}; "
                         f"{layout.fewer}{whole}, or raise --max-nodes")
    if traces:
        schema()                              # the export extra is installed: checked before writing
    written.check_folder(output, MARKER, KIND, inputs=inputs)
    written.remove_stale_temps(output, MARKER)
    tmp = written.result_temp_folder(output)     # private, at a name nobody can predict (never through a link)
    try:
        try:
            (tmp / MARKER).write_text("{}")   # an export being written: stale-temporary cleaning may remove it
            _write_all(tmp, layout, model, cluster, devices, strategy, result, traces)
            written.seal(tmp, MARKER, KIND, devices=devices, nodes=total, ranks=written_ranks, slice=part)
        except OSError as exc:                # a full disk: one line naming the folder asked for, not the temporary
            raise written.failure("output", "write", output, exc) from None
        written.replace_folder(tmp, output, lambda: written.check_folder(output, MARKER, KIND, inputs=inputs))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return output


def _write_all(root: Path, layout, model, cluster, devices, strategy, result, traces: bool) -> None:
    """estimate.json, chakra/ (with ``traces``), astrasim2/ and, where ``layout.v1``, astrasim1/ under ``root``;
    a slice's slice.json, and its network and system files for the ranks it holds."""
    (root / "estimate.json").write_text(jsonout.dumps(result.to_dict(), indent=2) + "\n")
    if hasattr(layout, "metadata"):
        (root / "slice.json").write_text(jsonout.dumps(layout.metadata(), indent=1) + "\n")
        devices = layout.devices
    if traces:
        chakra = root / "chakra"
        chakra.mkdir()
        acc = cluster.accelerator
        peak, bandwidth = acc.flops(strategy.dtype.value), acc.hbm.achievable_bandwidth
        table = {}
        for rank, entry, nodes in layout.traces():
            (chakra / f"{WORKLOAD}.{rank}.et").write_bytes(encode_rank(nodes, rank, peak, bandwidth))
            table[str(rank)] = dict(entry, nodes=len(nodes))
        (chakra / "ranks.json").write_text(jsonout.dumps(table, indent=1) + "\n")
    v2 = root / "astrasim2"
    v2.mkdir()
    (v2 / "network.yml").write_text(asi.network_v2(cluster, devices))
    (v2 / "system.json").write_text(asi.system_v2(cluster, devices, strategy.dtype.value))
    (v2 / "remote_memory.json").write_text(asi.REMOTE_MEMORY_V2)
    (v2 / "comm_groups.json").write_text(asi.comm_groups_v2(layout.members))
    (v2 / "run.sh").write_text(RUN_V2)
    if layout.v1:
        v1 = root / "astrasim1"
        v1.mkdir()
        (v1 / "workload.txt").write_text(asi.workload_v1(model, cluster, strategy.tp, strategy.dp,
                                                         strategy.global_batch))
        (v1 / "system.txt").write_text(asi.system_v1(cluster, len(asi.used_dims(cluster, devices))))
        (v1 / "network.json").write_text(asi.network_v1(cluster, devices))


RUN_V2 = """#!/bin/sh
# Run this export in ASTRA-sim 2.0 (analytical, congestion-unaware backend); docs/export.md.
# ASTRA_SIM: the binary built by astra-sim's build/astra_analytical/build.sh.
set -e
here=$(cd "$(dirname "$0")" && pwd)
"${ASTRA_SIM:?set ASTRA_SIM to AstraSim_Analytical_Congestion_Unaware}" \\
  --workload-configuration="$here/../chakra/workload" \\
  --comm-group-configuration="$here/comm_groups.json" \\
  --system-configuration="$here/system.json" \\
  --remote-memory-configuration="$here/remote_memory.json" \\
  --network-configuration="$here/network.yml"
"""
