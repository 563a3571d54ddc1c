"""comet-dse export with context parallelism: the K/V ring's transfers (count, bytes, peers, beside the compute)
or the all-gather and reduce-scatter, as cost/layer_work.py charges them (test_export.py's property checks run
on the CP cases too: durations, FLOPs, bytes, matched transfers, the step to completion)."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from comet_dse.cost import collectives as coll
from comet_dse.cost.layer_ops import layer_cost
from comet_dse.cost.microbatch_pass import microbatch_terms
from comet_dse.cost.shapes import context_of
from comet_dse.export.chakra_schema import schema
from comet_dse.export.folder import export
from comet_dse.export.plan import plan_of
from comet_dse.strategy.arrays import StrategyArrays

from test_export import attrs, case, load

pytest.importorskip("google.protobuf")

CP_CASES = ["cp2-ring-tp2-dp2", "cp4-all-gather-pp2-full", "cp4-ring-full-placement-dp-pp-tp",
            "tiny-moe-cp2-ep2-sp-zero1"]


@pytest.fixture(scope="module", params=CP_CASES)
def cp_export(request, tmp_path_factory):
    devices, strategy, cluster, model = case(request.param)
    folder = export(model, cluster, devices, strategy, tmp_path_factory.mktemp("cp") / "out")
    table = {int(r): v for r, v in json.loads((folder / "chakra" / "ranks.json").read_text()).items()}
    return devices, strategy, cluster, model, folder, load(folder), table


def _kv_bytes(model, cluster, devices, strategy) -> float:
    """The cost model's K and V bytes per CP step (cost/layer_ops.py: LayerCost.cp_kv_bytes)."""
    st = StrategyArrays.of([strategy])
    ctx = context_of(model, cluster, devices, st)
    return float(layer_cost(model, ctx.shape, ctx.dev).cp_kv_bytes[0]), ctx


def test_kv_bytes_by_hand():
    """megatron-1.7b (h 2,304, 24 heads of 96), 2,048 tokens: at cp 2 and tp 2 a rank holds 1,024 tokens and 12
    K and 12 V heads, 1,024 x 2 x 1,152 x 2 = 4,718,592 bytes a step; at cp 4, tp 1, 512 tokens of 24 + 24
    heads, the same; the all-gather's whole tensor 4 x that, 18,874,368."""
    for name in ("cp2-ring-tp2-dp2", "cp4-all-gather-pp2-full"):
        devices, strategy, cluster, model = case(name)
        assert plan_of(model, cluster, devices, strategy).kv_bytes == 4_718_592


def test_ring_transfers_per_layer_and_their_bytes(cp_export):
    """Ring: per layer and micro-batch cp - 1 sends forward, 2 (cp - 1) backward (K, V and their gradients) and,
    with full recomputation, cp - 1 more; each of cp_kv_bytes to the next CP rank (same TP index, stage and DP
    index), each receive from the previous one. All-gather: per layer an ALL_GATHER of the 1/cp piece (again
    before backward under full recomputation) and a REDUCE_SCATTER of the whole after backward, over the CP
    group; the cost model's gather time of either is what it charges per pass."""
    devices, strategy, cluster, model, folder, traces, table = cp_export
    kv, ctx = _kv_bytes(model, cluster, devices, strategy)
    plan = plan_of(model, cluster, devices, strategy)
    full = strategy.recompute.value == "full"
    s = schema()
    groups = json.loads((folder / "astrasim2" / "comm_groups.json").read_text())
    for rank, (_, nodes) in traces.items():
        me = table[rank]
        layers = sum(plan.chunk_layers[me["pp"]])
        per_layer = Counter()
        for n in nodes:
            if ".cp_" not in n.name:
                continue
            a = attrs(n)
            if n.type in (s.COMM_SEND_NODE, s.COMM_RECV_NODE):
                assert a["comm_size"] == round(kv)
                peer = table[a["comm_dst"] if n.type == s.COMM_SEND_NODE else a["comm_src"]]
                step = 1 if n.type == s.COMM_SEND_NODE else -1
                assert peer["cp"] == (me["cp"] + step) % strategy.cp
                assert (peer["tp"], peer["pp"], peer["dp"]) == (me["tp"], me["pp"], me["dp"])
                per_layer["send" if n.type == s.COMM_SEND_NODE else "recv"] += 1
            else:
                assert n.type == s.COMM_COLL_NODE
                members = [table[r] for r in groups[a["pg_name"]]]
                assert sorted(x["cp"] for x in members) == list(range(strategy.cp))
                assert len({(x["tp"], x["pp"], x["dp"]) for x in members}) == 1
                whole = a["comm_size"] * (strategy.cp if a["comm_type"] == s.ALL_GATHER else 1)
                assert whole == round(strategy.cp * kv)
                per_layer[a["comm_type"]] += 1
        m = plan.microbatches
        if strategy.cp_algorithm.value == "ring":
            assert per_layer["send"] == per_layer["recv"] == m * layers * (strategy.cp - 1) * (1 + 2 + full)
        else:
            assert per_layer[s.ALL_GATHER] == m * layers * (1 + full)
            assert per_layer[s.REDUCE_SCATTER] == m * layers
            # the layer's exposed CP seconds (the dense.cp term) are these collectives at the cost model's gather time
            gather = float(coll.all_gather_time(strategy.cp * kv, ctx.dims, ctx.spans["cp"])[0])
            st = StrategyArrays.of([strategy])
            charged = float(microbatch_terms(model, ctx, st)["dense.cp"][0])
            assert (per_layer[s.ALL_GATHER] + per_layer[s.REDUCE_SCATTER]) / (m * layers) * gather == \
                pytest.approx(charged, rel=1e-12)


def test_the_ring_runs_beside_the_compute(cp_export):
    """No ring transfer waits for the layer's compute node it runs beside; the next node that waits for that
    compute waits for the ring's last receive too (the transfers are overlapped with the attention, as the cost
    model assumes, and a layer starts once the one before it and its ring are done)."""
    _, strategy, _, _, _, traces, _ = cp_export
    if strategy.cp_algorithm.value != "ring":
        pytest.skip("all-gather: blocking collectives")
    s = schema()
    nodes = traces[0][1]
    computes = [n for n in nodes if n.type == s.COMP_NODE and ".layer" in n.name]
    checked = 0
    for comp in computes:
        ring = [n for n in nodes if n.name.startswith(comp.name + ".cp_")]
        assert ring, comp.name
        assert all(comp.id not in n.data_deps and n.id < comp.id for n in ring)
        last_recv = max((n for n in ring if n.type == s.COMM_RECV_NODE), key=lambda n: n.id)
        after = next(n for n in nodes if n.id > comp.id and comp.id in n.data_deps)
        assert last_recv.id in after.data_deps, (comp.name, after.name)
        checked += 1
    assert checked == len(computes) > 0


def test_dp_groups_hold_the_cp_ranks(cp_export):
    """Gradients are reduced over DP x CP (cost/data_parallel.py: _dp_groups): dp cp members of one TP index and
    stage."""
    _, strategy, _, _, folder, traces, table = cp_export
    groups = json.loads((folder / "astrasim2" / "comm_groups.json").read_text())
    found = 0
    for rank, (_, nodes) in traces.items():
        for n in nodes:
            if "dp_gradient" in n.name:
                members = [table[r] for r in groups[attrs(n)["pg_name"]]]
                assert len(members) == strategy.dp * strategy.cp
                assert len({(x["tp"], x["pp"]) for x in members}) == 1
                found += 1
    assert found
