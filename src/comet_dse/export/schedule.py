"""One training step of one rank as a graph of Chakra nodes: the pipeline schedule, the collectives, the overlap.

Plain data (``TraceNode``); chakra.py encodes it. Per rank (TP index i, pipeline stage s, DP index d) and
its m micro-batches, in Megatron-LM's order (Narayanan et al. 2021, Sec. 2.2; Megatron-LM
schedules.py): 1F1B, warm-up min(p - s - 1, m) forwards; interleaved with v chunks, warm-up
min(2 (p - s - 1) + (v - 1) p, m v) forwards of virtual micro-batch j = chunk (j mod p v) // p,
micro-batch (j // p v) p + j mod p (backward chunks counted from the last).

Dependencies (``data_deps``, the only ones ASTRA-sim's feeder follows) form one stream per rank: every
compute node waits for the node before it; a blocking collective (TP, the loss's, DP without
dp_overlap) is waited for by the next compute; a non-blocking one (DP with dp_overlap: each layer's
gradient reduction as soon as its backward in the last micro-batch has made them final, a chunk's whole once its
last backward is done where the pipeline is interleaved, and with ZeRO 1/2 each layer's weight all-gather beside
the first micro-batch's forward that needs it) only by the optimizer, resp. that forward. A receive
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
A MoE layer (mixture-of-experts models: the layers after the first dense_layers) adds, after its forward
node, the dispatch and the combine all-to-all over its EP group (the ep consecutive DP ranks of the same TP
index, CP index and stage; StrategyArrays.strides) and, after its backward node, their gradients' (the
combine's first, at the dispatch's bytes, then the dispatch's, at the combine's); full recomputation repeats
the forward's first. Its gradients are reduced in two parts: the shared weights over the DP group, the routed
experts over the expert-DP group (the DP ranks of the same place in every EP group), as cost/data_parallel.py:
_dp_groups reduces them, and under ZeRO 3 gathered and reduce-scattered unit by unit in the same two parts.
Context parallelism (cp > 1; each rank holds s / cp tokens of every sequence): with the ring (cp_algorithm
ring) each layer's K and V pass around the CP group (the CP ranks of one TP index, stage and DP index) in
cp - 1 send/receive steps beside the layer's forward node, and K, V and their gradients (two transfers a
step) beside its backward node, with the recomputed forward's beside it too under full recomputation; what
follows the node waits for the last receive (the cost model hides the ring behind the attention and
charges the excess). With all-gather (Llama 3) K and V are all-gathered before the forward node and their
gradients reduce-scattered after the backward node, blocking. The DP gradient group holds the CP ranks too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from comet_dse.export.plan import Plan, Where, Work
from comet_dse.strategy.choices import CpAlgorithm, GradSync, PipelineEngine, Recompute, Zero

COMP, COLL, SEND, RECV = "COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL = "ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL"
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


# Communicator groups by kind: the coordinates its members share (Where's fields), and which kinds a plan has.
GROUP_KINDS = ("tp", "cp", "dp", "ep", "edp")


@dataclass
class Groups:
    """Communicator groups: id (from 1) -> member ranks, its kind (GROUP_KINDS), and per kind each rank's group
    id."""

    members: dict = field(default_factory=dict)
    kind: dict = field(default_factory=dict)
    of: dict = field(default_factory=lambda: {kind: {} for kind in GROUP_KINDS})

    def get(self, kind: str, rank: int) -> int:
        """The id of ``rank``'s group of ``kind`` (0: none, it would have one member)."""
        return self.of[kind].get(rank, 0)


def group_key(plan: Plan, kind: str, w: Where):
    """What the members of ``w``'s group of ``kind`` share: TP the CP index, stage and DP index; CP the TP
    index, stage and DP index; DP (the
    gradient group, CP ranks included, as cost/data_parallel.py: _dp_groups) the TP index and stage; EP the TP
    and CP index, stage and EP block (ep consecutive DP ranks); expert DP the TP index, stage and the DP
    index's place in its EP block."""
    return {"tp": (w.cp, w.pp, w.dp), "cp": (w.tp, w.pp, w.dp), "dp": (w.tp, w.pp),
            "ep": (w.tp, w.cp, w.pp, w.dp // plan.ep), "edp": (w.tp, w.pp, w.dp % plan.ep)}[kind]


def group_sizes(plan: Plan) -> dict:
    """Members of each kind of group (CP only where it gathers, the ring's transfers being sends and receives;
    expert DP only for a mixture-of-experts model)."""
    gathered = plan.strategy.cp_algorithm is CpAlgorithm.ALL_GATHER
    return {"tp": plan.tp, "cp": plan.cp if gathered else 1, "dp": plan.dp * plan.cp,
            "ep": plan.ep if plan.model.moe else 1,
            "edp": plan.dp * plan.cp // plan.ep if plan.model.moe else 1}


def groups_of(plan: Plan, places=None) -> Groups:
    """The groups of more than one member of every kind, ids from 1 in kind order and then by their first
    rank; ``places``: the devices to take them from (default all)."""
    out = Groups()
    sizes = group_sizes(plan)
    places = plan.places() if places is None else places
    for kind in GROUP_KINDS:
        if sizes[kind] == 1:
            continue
        ids = {}
        for w in places:
            key, rank = group_key(plan, kind, w), plan.rank(w)
            if key not in ids:
                ids[key] = len(out.members) + 1
                out.members[ids[key]], out.kind[ids[key]] = [], kind
            out.members[ids[key]].append(rank)
            out.of[kind][rank] = ids[key]
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
    """The nodes of one rank, the node the next one waits for, and the nodes it waits for besides (``joins``:
    transfers that ran beside the last compute), until a blocking one has waited for them."""

    def __init__(self):
        self.nodes, self.last, self.joins = [], None, []

    def add(self, node_type: str, name: str, blocking: bool = True, extra_deps=(), **fields) -> TraceNode:
        deps = ([self.last.id] if self.last is not None else []) + list(extra_deps)
        deps += [n.id for n in self.joins if n.id not in deps]
        node = TraceNode(id=len(self.nodes), name=name, type=node_type, deps=deps, **fields)
        self.nodes.append(node)
        if blocking:
            self.last, self.joins = node, []
        return node

    def compute(self, name: str, work: Work, part: str, extra_deps=()) -> None:
        self.add(COMP, name, extra_deps=extra_deps, seconds=work.seconds, flops=work.flops, part=part)


def rank_trace(plan: Plan, groups: Groups, w: Where) -> list:
    """The TraceNodes of the step of the rank at ``w``, in an order where every node follows its dependencies."""
    st = plan.strategy
    p, v, m = plan.pp, plan.chunks, plan.microbatches
    stage = w.pp
    me = plan.rank(w)
    tp_group, dp_group, cp_group = groups.get("tp", me), groups.get("dp", me), groups.get("cp", me)
    ep_group, edp_group = groups.get("ep", me), groups.get("edp", me)
    f_ops, g_ops = plan.model.tp_operators
    sp, whole = st.sequence_parallel and st.tp > 1, st.pipeline_engine is PipelineEngine.DEEPSPEED
    s = _Stream()
    if plan.weight_cast > 0:
        s.compute("fp8_weight_cast", Work(plan.weight_cast, 0.0), "weight_cast")
    first_layer = plan.first_layers

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

    def expert_exchange(label: str, unit: int, forward: bool) -> None:
        """A MoE layer's all-to-alls over its EP group: dispatch then combine; backward their gradients, the
        combine's (the gradient sent to the experts, at the dispatch's bytes) then the dispatch's."""
        if not (ep_group and plan.is_moe(unit)):
            return
        steps = ((("dispatch", plan.dispatch_bytes), ("combine", plan.combine_bytes)) if forward else
                 (("combine_gradient", plan.dispatch_bytes), ("dispatch_gradient", plan.combine_bytes)))
        for name, size in steps:
            s.add(COLL, f"{label}.ep_{name}_all_to_all", comm=ALL_TO_ALL, size=size, group=ep_group)

    ring = plan.cp > 1 and st.cp_algorithm is CpAlgorithm.RING
    cp_next, cp_prev = (plan.rank(Where(w.tp, (w.cp + d) % plan.cp, w.pp, w.dp)) for d in (1, -1))

    def cp_ring(label: str, unit: int, k: int, passes: tuple):
        """Context parallelism's ring beside the next compute node: per pass in ``passes`` (0 forward, 1 the
        recomputed forward, 2 backward) cp - 1 steps, each sending the K and V it holds to the next CP rank
        and receiving the previous rank's (backward: K and V and their gradients, two transfers a step), of
        cp_kv_bytes each, as cost/layer_work.py charges them. They wait for what the compute waits for, each
        send and receive for the receive before it (a send forwards what arrived). Returns the last receive,
        which what follows the compute waits for too (None without a ring)."""
        if not ring:
            return None
        recv = None
        for pass_ in passes:
            parts = ("kv", "kv_gradient") if pass_ == 2 else ("kv",)
            for step in range(plan.cp - 1):
                for which, part in enumerate(parts):
                    tag = ((((k * plan.model.layers + unit) * 3 + pass_) * plan.cp + step) * 2 + which) % TAG_SPACE
                    name = f"{label}.cp_{part}_{('fwd', 'recompute', 'bwd')[pass_]}{step}"
                    s.add(SEND, f"{name}.send", blocking=False, extra_deps=[recv.id] if recv else [],
                          size=plan.kv_bytes, peer=cp_next, tag=tag)
                    recv = s.add(RECV, f"{name}.recv", blocking=False, extra_deps=[recv.id] if recv else [],
                                 size=plan.kv_bytes, peer=cp_prev, tag=tag)
        return recv

    def cp_gather(label: str, forward: bool) -> None:
        """Context parallelism by all-gather (Llama 3): K and V of the whole sequence gathered before the
        attention (comm_size each rank's cp_kv_bytes), their gradients reduce-scattered after its backward
        (the whole cp x cp_kv_bytes), as cost/layer_work.py charges them, blocking."""
        if not cp_group or ring:
            return
        kind = ALL_GATHER if forward else REDUCE_SCATTER
        s.add(COLL, f"{label}.cp_kv_{kind.lower()}", comm=kind,
              size=comm_size(kind, plan.cp * plan.kv_bytes, plan.cp), group=cp_group)

    def peer_rank(virtual: int) -> int:
        return plan.rank(Where(w.tp, w.cp, virtual % p, w.dp))

    def tag(k: int, boundary: int, backward: bool) -> int:
        return ((k * p * v + boundary) * 2 + backward) % TAG_SPACE

    def p2p(kind: str, name: str, virtual_peer: int, k: int, boundary: int, backward: bool) -> None:
        blocking = kind == RECV or not st.pp_overlap
        s.add(kind, name, blocking=blocking, size=plan.p2p_bytes, peer=peer_rank(virtual_peer),
              tag=tag(k, boundary, backward))
        if kind == RECV and not sp and not whole and tp_group:     # Megatron's scatter-gather: re-gather 1/t
            s.add(COLL, f"{name}.tp_regather", comm=ALL_GATHER, size=plan.tp_bytes / plan.tp, group=tp_group)

    zero3 = bool(dp_group) and st.zero >= Zero.PARAMETERS
    sizes = group_sizes(plan)        # the whole job's groups (a slice may hold part of one: export/slicing.py)

    def unit_parts(chunk: int) -> list:
        """ZeRO 3's shards of one unit of ``chunk`` (its parameters in equal units of a layer, the embedding or
        head included, as cost/layout.py splits a stage's): (name, group id, members in the job, parameters per
        device) of the shared weights over DP and, for a MoE model, the routed experts over expert DP
        (cost/data_parallel.py: data_parallel_comm, one unit collective per group)."""
        layers = plan.chunk_layers[stage][chunk]
        parts = (("dp", dp_group, sizes["dp"], plan.chunk_shared_params(stage, chunk) / layers),
                 ("expert", edp_group, sizes["edp"], plan.chunk_expert_params(stage, chunk) / layers))
        return [part for part in parts if part[1] and part[3] > 0]

    # With dp_overlap (Megatron-LM's --overlap-grad-reduce / --overlap-param-gather, bucketed; cost/data_parallel.py:
    # exposed_data_parallel hides them behind the last micro-batch's backward, resp. the first one's forward):
    # without interleaving each unit's gradients are reduced as soon as the last micro-batch's backward has made
    # them final (with v chunks the estimate's window is per chunk, and the chunk's reduction follows its last
    # backward whole: per-unit pieces there queue the pipeline's transfers behind them in a simulator that keeps
    # one communication per rank in flight, docs/export.md); with ZeRO 1/2 each unit's updated weights are
    # gathered beside the forward that needs them, which a one-step trace writes as the step's first
    # micro-batch (the steady state: the gather of the weights the previous step updated).
    overlapped = bool(dp_group) and st.dp_overlap and not zero3
    bucketed = overlapped and v == 1
    gather_step_start = overlapped and st.zero >= Zero.OPTIMIZER

    def gathers(label: str, chunk: int, units: list, k: int = 0) -> dict:
        """ZeRO 3 (every gathering pass), or ZeRO 1/2 with the gather overlapped (the first micro-batch's
        forward): the all-gather of each of ``units``' 16-bit weight shards (``unit_parts``), issued without
        blocking the stream; unit -> the nodes its compute waits for."""
        if not (zero3 or (gather_step_start and k == 0)) or not units:
            return {}
        parts = unit_parts(chunk)
        return {u: [s.add(COLL, f"{label}.layer{u}.{name}_weight_all_gather", blocking=False, comm=ALL_GATHER,
                          size=2.0 * params / members, group=group) for name, group, members, params in parts]
                for u in units}

    def layer_pass(label: str, chunk: int, units: list, forward: bool, gather: bool, k: int) -> None:
        """The units' compute in order, each with its EP and TP collectives (and, backward, ZeRO 3's
        reduce-scatter)."""
        waits = {}
        for n, unit in enumerate(units):
            if gather and (zero3 or (gather_step_start and forward and k == 0)):
                if n == 0:                                    # the first unit's weights: now
                    waits.update(gathers(label, chunk, units[:1], k))
                waits.update(gathers(label, chunk, units[n + 1:n + 2], k))    # the next unit's, beside this one
            extra = [node.id for node in waits.get(unit, [])]
            moe = plan.is_moe(unit)
            name = f"{label}.layer{unit}"
            if forward:
                cp_gather(f"{name}.fwd", True)
                beside = cp_ring(f"{name}.fwd", unit, k, (0,))
                s.compute(f"{name}.fwd", plan.moe_f if moe else plan.layer_f, "forward", extra)
                s.joins += [beside] if beside else []
                expert_exchange(f"{name}.fwd", unit, True)
                tp_collectives(f"{name}.fwd", True)
                continue
            full = st.recompute is Recompute.FULL
            if full:
                cp_gather(f"{name}.recompute", True)
                expert_exchange(f"{name}.recompute", unit, True)
                tp_collectives(f"{name}.recompute", True)
            beside = cp_ring(f"{name}.bwd", unit, k, (1, 2) if full else (2,))
            s.compute(f"{name}.bwd", plan.moe_b if moe else plan.layer_b, "backward", extra)
            s.joins += [beside] if beside else []
            cp_gather(f"{name}.bwd", False)
            expert_exchange(f"{name}.bwd", unit, False)
            tp_collectives(f"{name}.bwd", False)
            if zero3 and (st.grad_sync is GradSync.MICRO_BATCH or k == m - 1):
                for part, group, _, params in unit_parts(chunk):
                    dp_pending.append(s.add(COLL, f"{name}.{part}_gradient_reduce_scatter", blocking=False,
                                            comm=REDUCE_SCATTER, size=params * plan.grad_bytes_per_param, group=group))
            if bucketed and k == m - 1:                       # this unit's gradients are final: reduce them now
                kind = REDUCE_SCATTER if st.zero >= Zero.OPTIMIZER else ALL_REDUCE
                for part, group, _, params in unit_parts(chunk):
                    dp_pending.append(s.add(COLL, f"{name}.{part}_gradient_{kind.lower()}", blocking=False,
                                            comm=kind, size=params * plan.grad_bytes_per_param, group=group))

    def reduce_chunk(c: int) -> None:
        """The chunk's gradients are final: the shared ones reduced over DP, the routed experts' over expert DP."""
        kind = REDUCE_SCATTER if st.zero >= Zero.OPTIMIZER else ALL_REDUCE
        parts = (("dp", dp_group, plan.chunk_shared_params(stage, c)),
                 ("expert", edp_group, plan.chunk_expert_params(stage, c)))
        for name, group, params in parts:
            if group and params > 0:
                dp_pending.append(s.add(COLL, f"chunk{c}.{name}_gradient_{kind.lower()}", blocking=not st.dp_overlap,
                                        comm=kind, size=params * plan.grad_bytes_per_param, group=group))

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
            if k == m - 1 and not zero3 and not bucketed:
                reduce_chunk(c)
    s.add(COMP, "optimizer", extra_deps=[n.id for n in dp_pending if n is not s.last],
          seconds=plan.optimizer, part="optimizer")
    if st.zero >= Zero.OPTIMIZER and not zero3 and not gather_step_start:
        parts = (("dp", dp_group, "dp", sum(plan.chunk_shared_params(stage, c) for c in range(v))),
                 ("expert", edp_group, "edp", sum(plan.chunk_expert_params(stage, c) for c in range(v))))
        for name, group, kind, params in parts:
            if group and params > 0:
                s.add(COLL, f"{name}_weight_all_gather", comm=ALL_GATHER, size=2.0 * params / sizes[kind],
                      group=group)
    return s.nodes
