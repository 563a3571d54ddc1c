"""One training step of a recommendation model (DLRM, DLRM-DCNv2) per rank, as Chakra nodes (schedule.py's TraceNode).

Every one of the N devices runs the dense part data-parallel on b = B / N samples; the embedding tables are laid
out by ``embedding_sharding`` (cost/recommendation.py). A rank's step, in the order it issues the nodes:

    index all-to-all              ALL_TO_ALL, all N ranks, B x index bytes (the row indices to the shards)
    embedding lookup              COMP (forward)
    pooled exchange, forward      ALL_TO_ALL of B x send (table-, column-wise, planned); REDUCE_SCATTER of
                                  B x sum d x 2 B (row-wise); table-row-wise: REDUCE_SCATTER of B x pool inside
                                  the node, then ALL_TO_ALL of B x send; none (data-parallel)
    bottom MLP forward            COMP (forward), waits for the lookup only: it runs beside the exchange
    interaction + top MLP fwd     COMP (forward), waits for the bottom MLP and the exchange
    interaction + top MLP bwd     COMP (backward)
    pooled exchange, backward     the forward's volume back (ALL_GATHER for row-wise and inside the node)
    bottom MLP backward           COMP (backward), waits for the top MLP's backward only: beside the exchange
    table gradient all-reduce     ALL_REDUCE of the replicated tables' elements x 4 B (where some are replicated)
    dense gradient all-reduce     ALL_REDUCE of the dense parameters x 4 B, issued once the bottom MLP's gradients
                                  are final; with dp_overlap only the optimizer waits for it (it runs beside the
                                  embedding update), without it the update does
    embedding update              COMP (backward), waits for the backward exchange and the table reduction
    optimizer                     COMP (optimizer)

Compute times are the cost kernel's own (cost/recommendation.py) for the same point: the MLPs' and the
interaction's passes from ``dense_passes``, the lookups and the updates the estimate's forward and backward
phases (``step_arrays``) less those dense passes (the busiest device's B x lookup and B x update bytes at the
kernel's gather bandwidth, each with its launch overhead), the optimizer the estimate's. Their sum along the
compute chain is the estimate's compute + memory + optimizer. Byte counts are the kernel's (``sharded``: the
busiest device's per-sample bytes times B), written as ``comm_size`` the way schedule.py's comm_size maps a
tensor (the whole tensor for all-reduce, reduce-scatter and all-to-all, each rank's 1/n piece for all-gather;
ASTRA-sim's all-to-all sends 1/n of comm_size to each of the n - 1 others, Ring.cc, as comet-dse's
all_to_all_time charges (n - 1)/n of the bytes a device holds). Every rank carries the busiest device's times
and bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.cost.recommendation import (
    ACTIVATION_BYTES, GRADIENT_BYTES, dense_flops, dense_passes, sharded, step_arrays,
)
from comet_dse.cost.shapes import device_of
from comet_dse.export.plan import Work
from comet_dse.export.schedule import ALL_GATHER, ALL_REDUCE, COLL, COMP, REDUCE_SCATTER, TraceNode, comm_size
from comet_dse.hardware.spec import Cluster
from comet_dse.model.recommendation import Recommendation
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import EmbeddingSharding
from comet_dse.strategy.declared import Strategy

ALL_TO_ALL = "ALL_TO_ALL"
ALL, NODE = "all", "node"        # the group a collective runs on: every rank, or the rank's node (table-row-wise)
BACK = {REDUCE_SCATTER: ALL_GATHER, ALL_TO_ALL: ALL_TO_ALL}    # the backward exchange of each forward collective


@dataclass(frozen=True)
class RecPlan:
    """One DLRM step per device, as the trace writer needs it (seconds, FLOP, bytes).

    lookup, update: the embedding kernels [s]; bottom_f/b, top_f/b: the bottom MLP's and the interaction + top
    MLP's passes (Work); optimizer: the dense optimizer step [s]; per_node: devices per node (the innermost
    network dimension, as the kernel's table-row-wise placement reads it); index, send, pool, pooled: tensor
    bytes of the index all-to-all, the pooled all-to-all, table-row-wise's in-node reduce-scatter and row-wise's
    reduce-scatter; dense_grad, table_grad: the dense and the replicated tables' fp32 gradients [B].
    """

    devices: int
    per_node: int
    sharding: EmbeddingSharding
    dp_overlap: bool
    lookup: float
    update: float
    bottom_f: Work
    bottom_b: Work
    top_f: Work
    top_b: Work
    optimizer: float
    index: float
    send: float
    pool: float
    pooled: float
    dense_grad: float
    table_grad: float


def _scalar(x) -> float:
    """The one value of a batch of one point."""
    return float(np.asarray(x, dtype=float).reshape(-1)[0])


def devices_per_node(cluster: Cluster, devices: int) -> int:
    """Devices per node as cost/recommendation.py's step_arrays reads them for table-row-wise: the innermost
    network dimension's size for ``devices`` on a cluster of more than one dimension, else all devices."""
    return int(cluster.dim_sizes(devices)[0]) if len(cluster.network) > 1 else devices


def bottom_flops(model: Recommendation) -> float:
    """Model FLOPs of one sample's bottom-MLP forward: 2 x in x out per layer (cost/recommendation.py's
    dense_flops, restricted to the bottom MLP's layers)."""
    return sum(2.0 * i * o for i, o in model.mlp_shapes()[:len(model.bottom_mlp)])


def rec_plan_of(model: Recommendation, cluster: Cluster, devices: int, strategy: Strategy) -> RecPlan:
    """The RecPlan of one point: the kernel's step (``step_arrays``), dense passes (``dense_passes`` for
    b = B / N) and busiest-device shares (``sharded``) of ``strategy``'s embedding sharding."""
    st = StrategyArrays.of([strategy])
    big_b, n = float(strategy.global_batch), float(devices)
    with np.errstate(divide="ignore", invalid="ignore"):
        step = step_arrays(model, cluster, devices, st)
        bottom, whole = dense_passes(model, big_b / n, device_of(cluster, st, kind=model.kind))
    per_node = devices_per_node(cluster, devices)
    share = sharded(model, devices, per_node)[strategy.embedding_sharding.code]
    dense_f, dense_b = (sum(_scalar(x) for x in part) for part in whole)
    bot_f, bot_b = (sum(_scalar(x) for x in part) for part in bottom)
    b = big_b / n
    f_bottom, f_all = b * bottom_flops(model), b * dense_flops(model)
    return RecPlan(
        devices=devices, per_node=per_node, sharding=strategy.embedding_sharding, dp_overlap=strategy.dp_overlap,
        lookup=max(_scalar(step.phases["forward"]) - dense_f, 0.0),
        update=max(_scalar(step.phases["backward"]) - dense_b, 0.0),
        bottom_f=Work(bot_f, f_bottom), bottom_b=Work(bot_b, 2.0 * f_bottom),
        top_f=Work(dense_f - bot_f, f_all - f_bottom), top_b=Work(dense_b - bot_b, 2.0 * (f_all - f_bottom)),
        optimizer=_scalar(step.breakdown["optimizer"]),
        index=big_b * float(share["index"]), send=big_b * float(share["send"]), pool=big_b * float(share["pool"]),
        pooled=big_b * sum(t.dim for t in model.tables) * ACTIVATION_BYTES,
        dense_grad=model.dense_params() * GRADIENT_BYTES, table_grad=float(share["dp_params"]) * GRADIENT_BYTES,
    )


def forward_exchange(plan: RecPlan) -> list:
    """(name, collective, tensor bytes, group) of the pooled embeddings' forward exchange, in order (the kernel's
    exchange_f: cost/recommendation.py, step_arrays)."""
    s = plan.sharding
    if s is EmbeddingSharding.DATA_PARALLEL:
        return []
    if s is EmbeddingSharding.ROW_WISE:
        return [("pooled_reduce_scatter", REDUCE_SCATTER, plan.pooled, ALL)]
    out = [("node_pool_reduce_scatter", REDUCE_SCATTER, plan.pool, NODE)] if plan.pool > 0 else []
    return out + [("pooled_all_to_all", ALL_TO_ALL, plan.send, ALL)]


def backward_exchange(plan: RecPlan) -> list:
    """The forward exchange run back for the pooled gradients: reversed, each reduce-scatter an all-gather of the
    same tensor (row-wise: the kernel's all-gather; table-row-wise: its in-node step charged at the forward's)."""
    return [(name.replace("reduce_scatter", "all_gather").replace("pooled_", "pooled_gradient_"), BACK[kind],
             size, group) for name, kind, size, group in reversed(forward_exchange(plan))]


@dataclass(frozen=True)
class RecGroups:
    """Communicator groups: 1 = every rank; 2 + k = the k-th node's ranks (table-row-wise over several nodes)."""

    devices: int
    per_node: int
    nodes: bool

    @property
    def members(self) -> dict:
        """Group id -> its ranks (groups of more than one rank only)."""
        if self.devices == 1:
            return {}
        out = {1: list(range(self.devices))}
        if self.nodes:
            for k in range(self.devices // self.per_node):
                out[2 + k] = list(range(k * self.per_node, (k + 1) * self.per_node))
        return out

    def group(self, kind: str, rank: int) -> int:
        """The id of ``rank``'s group of ``kind`` (ALL or NODE)."""
        return 2 + rank // self.per_node if (kind == NODE and self.nodes) else 1


def groups_of(plan: RecPlan) -> RecGroups:
    """The all-ranks group, and node groups where table-row-wise spans more than one node."""
    nodes = plan.sharding is EmbeddingSharding.TABLE_ROW_WISE and 1 < plan.per_node < plan.devices
    return RecGroups(plan.devices, plan.per_node, nodes)


class _Nodes:
    """One rank's nodes with explicit data dependencies."""

    def __init__(self, groups: RecGroups, rank: int):
        self.nodes, self.groups, self.rank = [], groups, rank

    def comp(self, name: str, seconds: float, flops: float, part: str, deps) -> TraceNode:
        """A compute node of ``seconds`` and ``flops`` (``part``: forward, backward or optimizer)."""
        return self._add(TraceNode(id=len(self.nodes), name=name, type=COMP, deps=_ids(deps), seconds=seconds,
                                   flops=flops, part=part))

    def work(self, name: str, work: Work, part: str, deps) -> TraceNode:
        """A compute node of one Work (seconds, FLOP)."""
        return self.comp(name, work.seconds, work.flops, part, deps)

    def coll(self, name: str, kind: str, tensor_bytes: float, group: str, deps):
        """A collective on ``tensor_bytes`` (comm_size as schedule.comm_size maps it), or None where there is
        nothing to exchange (one device, or no bytes)."""
        if self.groups.devices == 1 or tensor_bytes <= 0:
            return None
        members = self.groups.per_node if group == NODE else self.groups.devices
        return self._add(TraceNode(id=len(self.nodes), name=name, type=COLL, deps=_ids(deps), comm=kind,
                                   size=comm_size(kind, tensor_bytes, members),
                                   group=self.groups.group(group, self.rank)))

    def chain(self, items: list, suffix: str, deps) -> list:
        """The collectives ``items`` (name, kind, bytes, group) each waiting for the one before; the last, or
        ``deps`` where none is written."""
        last = list(deps)
        for name, kind, size, group in items:
            node = self.coll(f"{name}.{suffix}", kind, size, group, last)
            last = [node] if node is not None else last
        return last

    def _add(self, node: TraceNode) -> TraceNode:
        self.nodes.append(node)
        return node


def _ids(deps) -> list:
    """The ids of ``deps`` (TraceNodes; None skipped), each once, in order."""
    out = []
    for d in deps:
        if d is not None and d.id not in out:
            out.append(d.id)
    return out


def rank_trace(plan: RecPlan, groups: RecGroups, rank: int) -> list:
    """The TraceNodes of one rank's step (module docstring), every dependency on an earlier node."""
    r = _Nodes(groups, rank)
    index = r.coll("index_all_to_all", ALL_TO_ALL, plan.index, ALL, [])
    lookup = r.comp("embedding_lookup", plan.lookup, 0.0, "forward", [index])
    exchanged = r.chain(forward_exchange(plan), "fwd", [lookup])
    bottom_f = r.work("bottom_mlp.fwd", plan.bottom_f, "forward", [lookup])
    top_f = r.work("interaction_top_mlp.fwd", plan.top_f, "forward", [bottom_f] + exchanged)
    top_b = r.work("interaction_top_mlp.bwd", plan.top_b, "backward", [top_f])
    returned = r.chain(backward_exchange(plan), "bwd", [top_b])
    bottom_b = r.work("bottom_mlp.bwd", plan.bottom_b, "backward", [top_b])
    tables = r.coll("table_gradient_all_reduce", ALL_REDUCE, plan.table_grad, ALL, [bottom_b])
    dense = r.coll("dense_gradient_all_reduce", ALL_REDUCE, plan.dense_grad, ALL, [bottom_b])
    update = r.comp("embedding_update", plan.update, 0.0, "backward",
                    [bottom_b, tables] + returned + ([] if plan.dp_overlap else [dense]))
    r.comp("optimizer", plan.optimizer, 0.0, "optimizer", [update, dense])
    return r.nodes


@dataclass(frozen=True)
class Layout:
    """A recommendation model's export (folder.py's layout): its plan and groups; no ASTRA-sim 1.0 workload (the
    fork's HYBRID_TRANSFORMER_FWD_IN_BCKWD format describes transformer blocks only)."""

    plan: RecPlan
    groups: RecGroups
    v1 = False
    fewer = "fewer devices"      # a rank's trace has a dozen nodes whatever the model

    @property
    def members(self) -> dict:
        return self.groups.members

    def node_count(self) -> int:
        """Nodes over all ranks: every rank's trace has the same length."""
        return len(rank_trace(self.plan, self.groups, 0)) * self.plan.devices

    def traces(self):
        """(rank, its ranks.json entry without the node count, its TraceNodes) of every rank: the rank's index
        in the data-parallel group of all N devices."""
        for rank in range(self.plan.devices):
            yield rank, {"dp": rank}, rank_trace(self.plan, self.groups, rank)


def layout_of(model: Recommendation, cluster: Cluster, devices: int, strategy: Strategy) -> Layout:
    """The export layout of one recommendation point (``estimate``'s inputs)."""
    plan = rec_plan_of(model, cluster, devices, strategy)
    return Layout(plan, groups_of(plan))
