"""comet-dse export of mixture-of-experts models: the expert all-to-alls' bytes, count and groups, the dense and
MoE layers' kernels, the expert gradients' group (test_export.py's property checks run on the MoE cases too)."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from comet_dse.cost import collectives as coll
from comet_dse.cost.layer_ops import moe_block
from comet_dse.cost.layer_work import expert_exchange_time
from comet_dse.cost.microbatch_pass import microbatch_terms
from comet_dse.cost.shapes import context_of
from comet_dse.export.chakra_schema import schema
from comet_dse.export.folder import export
from comet_dse.export.plan import plan_of
from comet_dse.strategy.arrays import StrategyArrays

from cli_run import run
from test_export import attrs, case, load

pytest.importorskip("google.protobuf")

MOE_CASES = ["mixtral-tp2-pp2-ep4-sp-zero1", "mixtral-fp8-dispatch-ep2-edp2-full", "tiny-moe-dense-first-pp2-ep2-edp2",
             "tiny-moe-tp2-pp3-ep2-overlap", "tiny-moe-dense-first-zero3-ep2-edp2"]


@pytest.fixture(scope="module", params=MOE_CASES)
def moe_export(request, tmp_path_factory):
    devices, strategy, cluster, model = case(request.param)
    folder = export(model, cluster, devices, strategy, tmp_path_factory.mktemp("moe") / "out")
    return devices, strategy, cluster, model, folder, load(folder)


def _a2a(nodes) -> list:
    s = schema()
    return [n for n in nodes if n.type == s.COMM_COLL_NODE and attrs(n)["comm_type"] == s.ALL_TO_ALL]


def test_the_all_to_alls_are_what_the_cost_model_charges(moe_export):
    """A forward pass's dispatch and combine comm_sizes, run through the cost model's all-to-all time on the EP
    group, give expert_exchange_time of the layer (the term ep_communication adds up): the export carries the
    bytes the estimate charges (fp8 dispatch, DeepEP's copies per rank and the imbalance included)."""
    devices, strategy, cluster, model, _, traces = moe_export
    st = StrategyArrays.of([strategy])
    ctx = context_of(model, cluster, devices, st)
    _, a2a_bytes = moe_block(model, ctx.shape, ctx.dev)
    charged = float(expert_exchange_time(model.moe, a2a_bytes, ctx, st)[0])
    forward = [n for n in _a2a(traces[0][1]) if ".fwd." in n.name]
    if strategy.ep == 1:
        assert not forward
        return
    first_layer = forward[:2]
    assert [n.name.rsplit(".", 1)[1] for n in first_layer] == ["ep_dispatch_all_to_all", "ep_combine_all_to_all"]
    ours = sum(float(coll.all_to_all_time(attrs(n)["comm_size"], ctx.dims, ctx.spans["ep"])[0]) for n in first_layer)
    assert ours == pytest.approx(charged, rel=1e-6)


def test_mixtral_all_to_all_bytes_by_hand(tmp_path):
    """Mixtral 8x7B at 4,096 tokens, tp 2, top-2, alltoall dispatcher: each rank sends its 4,096 / 2 tokens'
    2 copies of h e = 8,192 bytes: 33,554,432 bytes per all-to-all, dispatch and combine alike; with fp8
    dispatch through DeepEP (flex) 8 experts on 2 ranks reach 2 (1 - 4/8 x 3/7) = 1.571 ranks per token of 2
    copies: 26,364,197 bytes combined, the dispatch (1 + 4/128) / 2 of that, 13,594,039."""
    devices, strategy, cluster, model = case("mixtral-tp2-pp2-ep4-sp-zero1")
    plan = plan_of(model, cluster, devices, strategy)
    assert plan.dispatch_bytes == plan.combine_bytes == 4096 / 2 * 2 * 4096 * 2 == 33_554_432
    devices, strategy, cluster, model = case("mixtral-fp8-dispatch-ep2-edp2-full")
    plan = plan_of(model, cluster, devices, strategy)
    ranks_per_token = 2 * (1 - 4 / 8 * 3 / 7)
    assert plan.combine_bytes == pytest.approx(4096 / 2 * ranks_per_token * 4096 * 2, rel=1e-12)
    assert round(plan.combine_bytes) == 26_364_197
    assert plan.dispatch_bytes == pytest.approx(plan.combine_bytes * (1 + 4 / 128) / 2, rel=1e-12)


def test_every_moe_layer_exchanges_four_times_a_micro_batch(moe_export):
    """Each MoE layer of a rank's stage, each micro-batch: dispatch and combine forward, their gradients
    backward (combine's first, at the dispatch's bytes), and with full recomputation the forward's again; the
    dense layers none."""
    devices, strategy, cluster, model, folder, traces = moe_export
    table = json.loads((folder / "chakra" / "ranks.json").read_text())
    plan = plan_of(model, cluster, devices, strategy)
    m = plan.microbatches
    per_layer = 4 + 2 * (strategy.recompute.value == "full")
    for rank, (_, nodes) in traces.items():
        stage = table[str(rank)]["pp"]
        moe_layers = sum(plan.is_moe(n) for c in range(plan.chunks) for n in plan.chunk_layer_range(stage, c))
        exchanges = _a2a(nodes)
        assert len(exchanges) == m * moe_layers * per_layer * (strategy.ep > 1)
        for n in exchanges:
            layer = int(n.name.split(".layer")[1].split(".")[0])
            assert plan.is_moe(layer)
            kind = n.name.rsplit(".", 1)[1]
            size = plan.dispatch_bytes if kind in ("ep_dispatch_all_to_all", "ep_combine_gradient_all_to_all") \
                else plan.combine_bytes
            assert attrs(n)["comm_size"] == round(size)


def test_ep_and_expert_dp_groups(moe_export):
    """The all-to-alls run over ep consecutive DP ranks of one TP index and stage; the routed experts'
    gradients over the DP ranks at the same place of every EP block (dp / ep of them), the rest over all DP."""
    _, strategy, _, _, folder, traces = moe_export
    table = {int(r): v for r, v in json.loads((folder / "chakra" / "ranks.json").read_text()).items()}
    groups = json.loads((folder / "astrasim2" / "comm_groups.json").read_text())
    seen = defaultdict(set)
    for rank, (_, nodes) in traces.items():
        for n in nodes:
            if n.type != schema().COMM_COLL_NODE:
                continue
            members = [table[r] for r in groups[attrs(n)["pg_name"]]]
            if "_all_to_all" in n.name:
                kind = "ep"
                assert len(members) == strategy.ep
                assert sorted(x["dp"] for x in members) == list(range(members[0]["dp"], members[0]["dp"] + strategy.ep))
                assert members[0]["dp"] % strategy.ep == 0
            elif "expert_" in n.name:
                kind = "edp"
                assert len(members) == strategy.dp // strategy.ep
                assert len({x["dp"] % strategy.ep for x in members}) == 1
            elif "dp_" in n.name:
                kind = "dp"
                assert len(members) == strategy.dp
            else:
                continue
            assert len({(x["tp"], x["pp"]) for x in members}) == 1
            seen[kind].add(attrs(n)["pg_name"])
    assert bool(seen["ep"]) == (strategy.ep > 1)
    assert bool(seen["edp"]) == (strategy.dp // strategy.ep > 1)


def test_dense_and_moe_layers_carry_their_own_kernels(moe_export):
    """The first dense_layers layers are dense (no all-to-all, the dense terms), the rest MoE (the moe.* terms of
    cost/microbatch_pass.py: forward kernels fwd_math + fwd_mem of one micro-batch)."""
    devices, strategy, cluster, model, folder, traces = moe_export
    st = StrategyArrays.of([strategy])
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = microbatch_terms(model, context_of(model, cluster, devices, st), st)
    fwd = {kind: float(terms[f"{kind}.fwd_math"][0] + terms[f"{kind}.fwd_mem"][0]) for kind in ("dense", "moe")}
    table = json.loads((folder / "chakra" / "ranks.json").read_text())
    stage0 = next(r for r, v in table.items() if v["pp"] == 0)
    nodes = traces[int(stage0)][1]
    first = [n for n in nodes if n.name.startswith("mb0.layer") and n.name.endswith(".fwd")]
    for n in first:
        layer = int(n.name.split(".layer")[1].split(".")[0])
        kind = "moe" if layer >= model.moe.dense_layers else "dense"
        assert abs(n.duration_micros - fwd[kind] * 1e6) <= 1.0
    assert any(int(n.name.split(".layer")[1].split(".")[0]) < model.moe.dense_layers for n in first) == (
        model.moe.dense_layers > 0)


def test_a_moe_export_writes_no_v1_workload_and_says_so(tmp_path, capsys):
    out = tmp_path / "out"
    code, text, err = run(capsys, "export", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--devices", 8,
                          "--tp", 2, "--ep", 4, "--global-batch", 4, "--seq-len", 1024, "-o", out)
    assert code == 0, err
    assert "no astrasim1/" in text and "dense transformer blocks only" in text
    assert not (out / "astrasim1").exists() and len(list((out / "chakra").glob("*.et"))) == 8
