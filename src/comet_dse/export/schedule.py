"""One training step of one rank as a graph of Chakra nodes: the pipeline schedule, the collectives, the overlap.

Plain data (``TraceNode``); chakra.py encodes it. Per rank (TP index i, pipeline stage s, DP index d) and
its m micro-batches, in Megatron-LM's order (Narayanan et al. 2021, Sec. 2.2; Megatron-LM
schedules.py): 1F1B, warm-up min(p - s - 1, m) forwards; interleaved with v chunks, warm-up
min(2 (p - s - 1) + (v - 1) p, m v) forwards of virtual micro-batch j = chunk (j mod p v) // p,
micro-batch (j // p v) p + j mod p (backward chunks counted from the last).

Dependencies (``data_deps``, the only ones ASTRA-sim's feeder follows) form one stream per rank: every
compute node waits for the node before it; a blocking collective (TP, the loss's, DP without
dp_overlap) is waited for by the next compute; a non-blocking one (DP with dp_overlap: the gradient
reduction of a chunk once its last micro-batch's backward is done) only by the optimizer. A receive
blocks what follows it; a send blocks it unless pp_overlap. Per layer: its forward kernels, then its
TP collectives (Megatron's g: all-reduces of b s h e bytes; with sequence parallelism an all-gather per
f and a reduce-scatter per g); its backward (and recomputation: full recomputation repeats the
forward's collectives first), then the backward's (f all-reduces, or reduce-scatters per f and
all-gathers per g). Without sequence parallelism a pipeline receive is followed by the TP all-gather of
the 1/t each rank received (Megatron's scatter-gather), unless the DeepSpeed engine sends it whole.
ZeRO 3 (FSDP) replaces the chunk's reduction: each layer's weights are all-gathered before its forward
(and again before its backward with reshard_after_forward), the next layer's gather issued beside the
current layer's compute (prefetch depth 1, as cost/data_parallel.py: _sharded_layers), and each layer's
gradients reduce-scattered after its backward, every micro-batch (grad_sync micro-batch) or in the
last one (step), waited for only by the optimizer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from comet_dse.export.plan import Plan, Work
from comet_dse.strategy.choices import GradSync, PipelineEngine, Recompute, Zero

COMP, COLL, SEND, RECV = "COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = "ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER"
TAG_SPACE = 2**31 - 1       # comm_tag is an int32


@dataclass
class TraceNode:
    """One Chakra node before encoding (seconds, FLOP, bytes; ``group``: a communicator group id)."""

    id: int
    name: str
    type: str
    deps: list
    seconds: float = 0.0
    flops: float = 0.0
    part: str = ""
    comm: str = ""
    size: float = 0.0
    group: int = 0
    peer: int = -1
    tag: int = 0


@dataclass
class Groups:
    """Communicator groups: id (from 1) -> member ranks, and the TP and DP group of each rank."""

    members: dict = field(default_factory=dict)
    tp: dict = field(default_factory=dict)
    dp: dict = field(default_factory=dict)


def groups_of(plan: Plan) -> Groups:
    """The TP groups (one per stage and DP index) and DP groups (one per TP index and stage) of size > 1."""
    out = Groups()
    kinds = (("tp", plan.tp, lambda a, s, b: plan.rank(b, s, a), plan.dp),
             ("dp", plan.dp, lambda a, s, b: plan.rank(a, s, b), plan.tp))
    for kind, size, rank_of, other in kinds:
        if size == 1:
            continue
        for s in range(plan.pp):
            for a in range(other):
                gid = len(out.members) + 1
                ranks = [rank_of(a, s, b) for b in range(size)]
                out.members[gid] = ranks
                for r in ranks:
                    getattr(out, kind)[r] = gid
    return out


def comm_size(kind: str, tensor_bytes: float, members: int) -> float:
    """comm_size of a collective on the tensor of ``tensor_bytes`` bytes (the whole of it, as comet-dse's cost
    terms count it) over ``members`` ranks, in ASTRA-sim's sense: the input each rank contributes. All-reduce
    and reduce-scatter: the whole tensor; all-gather: its 1/n piece (ASTRA-sim's Ring all-gather sends
    comm_size per step and ends with n comm_size, astra-sim/system/astraccl/.../Ring.cc)."""
    return tensor_bytes / members if kind == ALL_GATHER else tensor_bytes


def order(plan: Plan, stage: int) -> list:
    """(phase "F" or "B", micro-batch, chunk) in the order stage ``stage`` runs them."""
    p, v, m = plan.pp, plan.chunks, plan.microbatches
    total = m * v
    if v == 1:
        warm = min(p - stage - 1, m)
    else:
        warm = total if m == p else min(2 * (p - stage - 1) + (v - 1) * p, total)

    def item(phase: str, j: int) -> tuple:
        chunk = (j % (p * v)) // p
        return phase, (j // (p * v)) * p + j % p, chunk if phase == "F" else v - 1 - chunk

    out = [item("F", j) for j in range(warm)]
    for j in range(total - warm):
        out += [item("F", warm + j), item("B", j)]
    return out + [item("B", j) for j in range(total - warm, total)]


class _Stream:
    """The nodes of one rank, and the node the next blocking one waits for."""

    def __init__(self):
        self.nodes, self.last = [], None

    def add(self, node_type: str, name: str, blocking: bool = True, extra_deps=(), **fields) -> TraceNode:
        deps = ([self.last.id] if self.last is not None else []) + list(extra_deps)
        node = TraceNode(id=len(self.nodes), name=name, type=node_type, deps=deps, **fields)
        self.nodes.append(node)
        if blocking:
            self.last = node
        return node

    def compute(self, name: str, work: Work, part: str, extra_deps=()) -> None:
        self.add(COMP, name, extra_deps=extra_deps, seconds=work.seconds, flops=work.flops, part=part)


def rank_trace(plan: Plan, groups: Groups, tp_index: int, stage: int, dp_index: int) -> list:
    """The TraceNodes of one rank's step, in an order where every node follows its dependencies."""
    st = plan.strategy
    p, v, m = plan.pp, plan.chunks, plan.microbatches
    me = plan.rank(tp_index, stage, dp_index)
    tp_group, dp_group = groups.tp.get(me, 0), groups.dp.get(me, 0)
    f_ops, g_ops = plan.model.tp_operators
    sp, whole = st.sequence_parallel and st.tp > 1, st.pipeline_engine is PipelineEngine.DEEPSPEED
    s = _Stream()
    if plan.weight_cast > 0:
        s.compute("fp8_weight_cast", Work(plan.weight_cast, 0.0), "weight_cast")
    first_layer = _first_layers(plan)

    def tp_collectives(label: str, forward: bool) -> None:
        if not tp_group:
            return
        if sp:    # forward: an all-gather per f, a reduce-scatter per g; backward the other way round
            kinds = [ALL_GATHER] * f_ops + [REDUCE_SCATTER] * g_ops
            if not forward:
                kinds = [REDUCE_SCATTER] * f_ops + [ALL_GATHER] * g_ops
        else:
            kinds = [ALL_REDUCE] * (g_ops if forward else f_ops)
        for n, kind in enumerate(kinds):
            s.add(COLL, f"{label}.tp_{kind.lower()}{n}", comm=kind, size=comm_size(kind, plan.tp_bytes, plan.tp),
                  group=tp_group)

    def peer_rank(virtual: int) -> int:
        return plan.rank(tp_index, virtual % p, dp_index)

    def tag(k: int, boundary: int, backward: bool) -> int:
        return ((k * p * v + boundary) * 2 + backward) % TAG_SPACE

    def p2p(kind: str, name: str, virtual_peer: int, k: int, boundary: int, backward: bool) -> None:
        blocking = kind == RECV or not st.pp_overlap
        s.add(kind, name, blocking=blocking, size=plan.p2p_bytes, peer=peer_rank(virtual_peer),
              tag=tag(k, boundary, backward))
        if kind == RECV and not sp and not whole and tp_group:     # Megatron's scatter-gather: re-gather 1/t
            s.add(COLL, f"{name}.tp_regather", comm=ALL_GATHER, size=plan.tp_bytes / plan.tp, group=tp_group)

    zero3 = bool(dp_group) and st.zero >= Zero.PARAMETERS

    def gathers(label: str, chunk: int, units: list) -> dict:
        """ZeRO 3: the all-gather of each of ``units``' 16-bit weights (a chunk's parameters, its embedding or head
        included, in equal units of a layer, as cost/layout.py splits a stage's), issued without blocking the
        stream; unit -> the node its compute waits for."""
        if not zero3 or not units:
            return {}
        size = 2.0 * plan.chunk_params(stage, chunk) / plan.chunk_layers[stage][chunk] / plan.dp
        return {u: s.add(COLL, f"{label}.layer{u}.dp_weight_all_gather", blocking=False, comm=ALL_GATHER,
                         size=size, group=dp_group) for u in units}

    def layer_pass(label: str, chunk: int, units: list, forward: bool, gather: bool, k: int) -> None:
        """The units' compute in order, each with its TP collectives (and, backward, ZeRO 3's reduce-scatter)."""
        waits = {}
        for n, unit in enumerate(units):
            if gather and zero3:
                if n == 0:                                    # the first unit's weights: now
                    waits.update(gathers(label, chunk, units[:1]))
                waits.update(gathers(label, chunk, units[n + 1:n + 2]))    # the next unit's, beside this one
            extra = [waits[unit].id] if unit in waits else []
            if forward:
                s.compute(f"{label}.layer{unit}.fwd", plan.layer_f, "forward", extra)
                tp_collectives(f"{label}.layer{unit}.fwd", True)
                continue
            if st.recompute is Recompute.FULL:
                tp_collectives(f"{label}.layer{unit}.recompute", True)
            s.compute(f"{label}.layer{unit}.bwd", plan.layer_b, "backward", extra)
            tp_collectives(f"{label}.layer{unit}.bwd", False)
            if zero3 and (st.grad_sync is GradSync.MICRO_BATCH or k == m - 1):
                size = plan.chunk_params(stage, chunk) / plan.chunk_layers[stage][chunk] * plan.grad_bytes_per_param
                dp_pending.append(s.add(COLL, f"{label}.layer{unit}.dp_gradient_reduce_scatter", blocking=False,
                                        comm=REDUCE_SCATTER, size=size, group=dp_group))

    dp_pending = []
    for phase, k, c in order(plan, stage):
        g = c * p + stage                       # virtual stage
        last_virtual = p * v - 1
        layers = range(first_layer[stage][c], first_layer[stage][c] + plan.chunk_layers[stage][c])
        head = f"mb{k}.chunk{c}"
        if phase == "F":
            if g > 0:
                p2p(RECV, f"{head}.recv_activation", g - 1, k, g - 1, False)
            if g == 0:
                s.compute(f"mb{k}.embedding.fwd", plan.emb_f, "forward")
                if tp_group:
                    s.add(COLL, f"mb{k}.embedding.tp_{'reduce_scatter' if sp else 'all_reduce'}",
                          comm=REDUCE_SCATTER if sp else ALL_REDUCE, size=plan.tp_bytes, group=tp_group)
            layer_pass(f"mb{k}", c, list(layers), True, True, k)
            if g == last_virtual:
                if sp and tp_group:
                    s.add(COLL, f"mb{k}.head.tp_all_gather", comm=ALL_GATHER, size=plan.tp_bytes / plan.tp,
                          group=tp_group)
                s.compute(f"mb{k}.head_loss.fwd", plan.head_f, "forward")
                for n in range(3 if tp_group else 0):
                    s.add(COLL, f"mb{k}.loss.tp_all_reduce{n}", comm=ALL_REDUCE, size=plan.loss_bytes,
                          group=tp_group)
            else:
                p2p(SEND, f"{head}.send_activation", g + 1, k, g, False)
        else:
            if g < last_virtual:
                p2p(RECV, f"{head}.recv_gradient", g + 1, k, g, True)
            else:
                s.compute(f"mb{k}.head_loss.bwd", plan.head_b, "backward")
                if tp_group:
                    s.add(COLL, f"mb{k}.head.tp_{'reduce_scatter' if sp else 'all_reduce'}",
                          comm=REDUCE_SCATTER if sp else ALL_REDUCE, size=plan.tp_bytes, group=tp_group)
            layer_pass(f"mb{k}", c, list(reversed(layers)), False, st.reshard_after_forward, k)
            if g == 0:
                s.compute(f"mb{k}.embedding.bwd", plan.emb_b, "backward")
            if plan.accumulate > 0:
                s.compute(f"{head}.grad_accumulate", Work(plan.accumulate / v, 0.0), "backward")
            if g > 0:
                p2p(SEND, f"{head}.send_gradient", g - 1, k, g - 1, True)
            if k == m - 1 and dp_group and not zero3:    # the chunk's gradients are final: reduce them over DP
                kind = REDUCE_SCATTER if st.zero >= Zero.OPTIMIZER else ALL_REDUCE
                dp_pending.append(s.add(COLL, f"chunk{c}.dp_gradient_{kind.lower()}", blocking=not st.dp_overlap,
                                        comm=kind, size=plan.chunk_params(stage, c) * plan.grad_bytes_per_param,
                                        group=dp_group))
    s.add(COMP, "optimizer", extra_deps=[n.id for n in dp_pending if n is not s.last],
          seconds=plan.optimizer, part="optimizer")
    if dp_group and st.zero >= Zero.OPTIMIZER and not zero3:
        params = sum(plan.chunk_params(stage, c) for c in range(v))
        s.add(COLL, "dp_weight_all_gather", comm=ALL_GATHER, size=2.0 * params / plan.dp, group=dp_group)
    return s.nodes


def _first_layers(plan: Plan) -> list:
    """[stage][chunk] -> the global index of the chunk's first layer (virtual stage c p + s holds the
    c p + s'th block of layers)."""
    p, v = plan.pp, plan.chunks
    starts, at = [[0] * v for _ in range(p)], 0
    for c in range(v):
        for stage in range(p):
            starts[stage][c] = at
            at += plan.chunk_layers[stage][c]
    return starts
