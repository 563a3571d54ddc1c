"""``export --slice replica``: the traces of one data-parallel replica of a job too large to write whole.

The slice is the ranks of DP index 0 (every TP index, CP index and stage), or, for a mixture-of-experts
model with ep > 1, of the first EP block (DP indices 0 .. ep - 1), so that every TP, CP, pipeline and
expert all-to-all exchange of its ranks stays inside it, whole. Each of its ranks' traces is the whole
job's trace of that rank (the same Plan: kernels, FLOPs, bytes sized for the whole job), less the
collectives of the groups that reach ranks outside the slice (the DP gradient reductions and ZeRO
gathers, and a MoE model's expert-DP reductions): a simulator cannot run a collective whose other
members it does not hold, so those are left out of the traces (their dependants wait for what they
waited for) and listed, with their whole-job group sizes and bytes, in ``slice.json``. The slice's ranks
keep their job numbers: it needs the DP block outermost in the placement (tp-pp-dp or pp-tp-dp), where
they are the job's first ranks and sit on the network as they do in the whole job.
"""
from __future__ import annotations

from collections import Counter

from comet_dse.base.errors import InputError
from comet_dse.export.plan import Plan
from comet_dse.export.schedule import COLL, group_sizes, groups_of, rank_trace

SLICES = ("replica",)


def replica_block(plan: Plan) -> int:
    """DP indices in the replica slice: the EP block (ep) of a MoE model, else 1."""
    return plan.ep if plan.model.moe else 1


def replica_ranks(model, strategy) -> int:
    """Ranks of the replica slice of ``strategy`` (tp cp pp x the EP block), before any Plan is made."""
    return strategy.tp * strategy.cp * strategy.pp * (strategy.ep if getattr(model, "moe", None) else 1)


def replica_places(plan: Plan) -> list:
    """The Where of every rank of the replica slice, by rank; an InputError where the DP block is not outermost
    in the placement (the slice's ranks would not be the job's first ones)."""
    inner = plan.tp * plan.cp * plan.pp
    if plan.dp > 1 and plan.strides["dp"] != inner:
        raise InputError("slice", f"--slice replica needs the data-parallel block outermost in the placement "
                         f"(tp-pp-dp or pp-tp-dp), got {plan.strategy.placement.value}")
    block = replica_block(plan)
    return [w for w in plan.places() if w.dp < block]


def without(nodes: list, dropped: set) -> list:
    """``nodes`` less those whose id is in ``dropped``, renumbered 0..n-1 in order; a kept node that waited for
    a dropped one waits for what that one waited for instead."""
    new_id, resolved, out = {}, {}, []
    for n in nodes:
        deps = []
        for d in n.deps:
            for x in resolved[d]:
                if x not in deps:
                    deps.append(x)
        if n.id in dropped:
            resolved[n.id] = deps
            continue
        new_id[n.id] = len(out)
        resolved[n.id] = [new_id[n.id]]
        n.id, n.deps = new_id[n.id], deps
        out.append(n)
    return out


class ReplicaSlice:
    """The replica slice's layout (folder.py's layout interface): its ranks, their groups held whole, their
    traces less the collectives of the groups it holds only part of (``omitted``)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.places = replica_places(plan)
        self.groups = groups_of(plan, self.places)
        sizes = group_sizes(plan)
        self.partial = {gid for gid, ranks in self.groups.members.items()
                        if len(ranks) < sizes[self.groups.kind[gid]]}
        self.whole_size = {gid: sizes[self.groups.kind[gid]] for gid in self.groups.members}
        self.v1 = False
        self.fewer = "fewer micro-batches or layers, or a smaller tp x cp x pp"
        self.job_devices = plan.devices

    @property
    def devices(self) -> int:
        return len(self.places)

    @property
    def members(self) -> dict:
        return {gid: ranks for gid, ranks in self.groups.members.items() if gid not in self.partial}

    def trace(self, w) -> tuple:
        """(the rank's TraceNodes in the slice, the collectives left out: [TraceNode])."""
        nodes = rank_trace(self.plan, self.groups, w)
        out = [n for n in nodes if n.type == COLL and n.group in self.partial]
        return without(nodes, {n.id for n in out}), out

    def node_count(self) -> int:
        per_stage = {}
        for w in self.places:
            if w.pp not in per_stage:
                per_stage[w.pp] = len(self.trace(w)[0])
        return sum(per_stage[w.pp] for w in self.places)

    def traces(self):
        """(rank, {"tp", "cp", "pp", "dp"}, its TraceNodes) of every rank of the slice, by rank."""
        for w in self.places:
            yield self.plan.rank(w), {"tp": w.tp, "cp": w.cp, "pp": w.pp, "dp": w.dp}, self.trace(w)[0]

    def metadata(self) -> dict:
        """slice.json: what the slice is and, per stage, the collectives it leaves out (each rank of a stage the
        same: kind of group, its members in the whole job, comm type, comm_size in bytes, how many a step)."""
        left = {}
        for w in self.places:
            if w.pp in left or w.tp or w.cp or w.dp:
                continue
            counts = Counter((self.groups.kind[n.group], self.whole_size[n.group], n.comm, round(n.size))
                             for n in self.trace(w)[1])
            left[w.pp] = [{"group": kind, "job_group_members": members, "comm_type": comm, "comm_size": size,
                           "per_step": count} for (kind, members, comm, size), count in sorted(counts.items())]
        block = replica_block(self.plan)
        return {
            "slice": "replica",
            "job_devices": self.job_devices,
            "ranks": self.devices,
            "dp_indices": list(range(block)),
            "note": ("the ranks of data-parallel replica 0" + (f" (the first EP block, DP indices 0-{block - 1})"
                     if block > 1 else "") + f" of a {self.job_devices}-device job, numbered as in the job; every "
                     "node is the whole job's for that rank (compute, FLOPs, bytes), but the collectives of the "
                     "groups that reach other replicas (DP gradient reductions and weight gathers, expert-DP "
                     "reductions) are left out of the traces, listed here per stage; estimate.json is the whole "
                     "job's (docs/export.md, 'Slices')"),
            "omitted_per_rank_by_stage": {str(stage): left[stage] for stage in sorted(left)},
        }
