"""comet-dse export of a recommendation model (DLRM-DCNv2, DLRM): every rank's Chakra trace decoded and checked against
the estimate and against byte counts worked out from the model's tables; the groups agree; the step runs through
test_export.py's executor of ASTRA-sim's issue rules; the command writes the folder and refuses with one line."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.cost.recommendation import dense_passes, sharded
from comet_dse.cost.shapes import device_of
from comet_dse.export.chakra_schema import schema
from comet_dse.export.folder import MARKER, export, layout_of
from comet_dse.export.schedule import COLL, COMP
from comet_dse.model.recommendation import STATE_BYTES_PER_ROW
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import Strategy

from cli_run import one_line_error, run
from test_export import _run_to_completion, assert_well_formed, attrs, load

pytest.importorskip("google.protobuf")

DCN = load_model("dlrm-dcnv2")
DLRM = load_model("dlrm-criteo-tb")
H100 = load_cluster("dgx-h100")
BATCH = 65536
CASES = {          # name -> (model, devices, strategy knobs); the dense part data-parallel on every device
    "8-table-wise": (DCN, 8, {"embedding_sharding": "table-wise"}),
    "8-row-wise": (DCN, 8, {"embedding_sharding": "row-wise"}),
    "8-data-parallel": (DCN, 8, {"embedding_sharding": "data-parallel"}),
    "8-planned": (DCN, 8, {"embedding_sharding": "planned"}),
    "8-column-wise": (DCN, 8, {"embedding_sharding": "column-wise"}),
    "16-table-wise": (DCN, 16, {"embedding_sharding": "table-wise"}),
    "16-row-wise-no-dp-overlap": (DCN, 16, {"embedding_sharding": "row-wise", "dp_overlap": False}),
    "16-planned-hierarchical-pipelined": (DCN, 16, {"embedding_sharding": "planned", "embedding_hierarchical": True,
                                                    "embedding_overlap": True}),
    "16-table-row-wise": (DCN, 16, {"embedding_sharding": "table-row-wise"}),
    "8-table-row-wise": (DCN, 8, {"embedding_sharding": "table-row-wise"}),
    "16-data-parallel": (DCN, 16, {"embedding_sharding": "data-parallel"}),
    "dlrm-8-row-wise": (DLRM, 8, {"embedding_sharding": "row-wise"}),
}


def one(x) -> float:
    """The value of a batch of one point."""
    return float(np.asarray(x, dtype=float).reshape(-1)[0])


def strategy_of(devices: int, knobs: dict) -> Strategy:
    return Strategy(dp=devices, global_batch=BATCH, **knobs)


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, tmp_path_factory):
    model, devices, knobs = CASES[request.param]
    strategy = strategy_of(devices, knobs)
    folder = export(model, H100, devices, strategy, tmp_path_factory.mktemp("export") / "out")
    groups = json.loads((folder / "astrasim2" / "comm_groups.json").read_text())
    return model, devices, strategy, folder, load(folder), groups


def _rank0(model, devices, strategy) -> list:
    """Rank 0's TraceNodes, before encoding (every rank's compute is the same)."""
    return next(layout_of(model, H100, devices, strategy).traces())[2]


def _nodes(model, devices, strategy) -> dict:
    """name -> TraceNode of rank 0's step."""
    return {n.name: n for n in _rank0(model, devices, strategy)}


def test_every_rank_decodes_and_the_folder_has_the_astrasim2_files(exported):
    """One ET per rank; metadata first; ids 0..n-1, every dependency on an earlier node; only the node types the
    workload layer issues; ranks.json gives each rank's index and node count; no ASTRA-sim 1.0 workload."""
    _, devices, _, folder, traces, groups = exported
    s = schema()
    assert_well_formed(traces, devices, (s.COMP_NODE, s.COMM_COLL_NODE))
    table = json.loads((folder / "chakra" / "ranks.json").read_text())
    assert table == {str(r): {"dp": r, "nodes": len(t[1])} for r, t in traces.items()}
    assert (folder / MARKER).exists() and not (folder / "astrasim1").exists()
    for name in ("network.yml", "system.json", "remote_memory.json", "comm_groups.json", "run.sh"):
        assert (folder / "astrasim2" / name).exists()
    assert groups["1"] == list(range(devices))


def test_compute_nodes_add_up_to_the_estimates_compute_memory_and_optimizer(exported):
    """Exact durations (before whole microseconds): the compute nodes are the estimate's compute + memory +
    optimizer to 1e-9, forward and backward parts its phases; written, each rank's to 1 us."""
    model, devices, strategy, _, traces, _ = exported
    result = estimate(model, H100, devices, strategy)
    b = result.breakdown_s
    nodes = [n for n in _rank0(model, devices, strategy) if n.type == COMP]
    parts = defaultdict(float)
    for n in nodes:
        parts[n.part] += n.seconds
    total = b["compute"] + b["memory"] + b["optimizer"]
    assert sum(parts.values()) == pytest.approx(total, rel=1e-9)
    assert parts["forward"] == pytest.approx(result.phases_s["forward"], rel=1e-9)
    assert parts["backward"] == pytest.approx(result.phases_s["backward"], rel=1e-9)
    assert parts["optimizer"] == pytest.approx(b["optimizer"], rel=1e-12)
    for _, ranked in traces.values():
        micros = sum(n.duration_micros for n in ranked if n.type == schema().COMP_NODE)
        assert micros == pytest.approx(total * 1e6, abs=1.0)


def test_each_compute_node_is_the_kernels_term(exported):
    """The lookup and the update are the busiest device's B x bytes (cost/recommendation.py: sharded) at one and the
    same gather bandwidth, at most the HBM peak, plus a launch each; the MLP nodes the kernel's dense passes for
    B / N samples."""
    model, devices, strategy, _, _, _ = exported
    nodes = _nodes(model, devices, strategy)
    st = StrategyArrays.of([strategy])
    dev = device_of(H100, st, kind=model.kind)
    per_node = 8 if devices > 8 else devices
    share = sharded(model, devices, per_node)[strategy.embedding_sharding.code]
    rates = [BATCH * share[key] / (nodes[name].seconds - one(dev.overhead))
             for name, key in (("embedding_lookup", "lookup"), ("embedding_update", "update"))]
    assert rates[0] == pytest.approx(rates[1], rel=1e-9) and 0 < rates[0] <= H100.accelerator.hbm.bandwidth
    bottom, whole = dense_passes(model, BATCH / devices, dev)
    assert nodes["bottom_mlp.fwd"].seconds == pytest.approx(one(sum(bottom[0])), rel=1e-12)
    assert nodes["bottom_mlp.bwd"].seconds == pytest.approx(one(sum(bottom[1])), rel=1e-12)
    top = one(sum(whole[0]) - sum(bottom[0])), one(sum(whole[1]) - sum(bottom[1]))
    assert (nodes["interaction_top_mlp.fwd"].seconds, nodes["interaction_top_mlp.bwd"].seconds) == \
        pytest.approx(top, rel=1e-9)


def test_flops_over_all_ranks_are_the_estimates_hardware_flops(exported):
    """Dense FLOPs of b = B / N samples per rank, backward twice the forward; the embedding kernels none (1 each)."""
    model, devices, strategy, _, traces, _ = exported
    total = sum(attrs(n).get("num_ops", 0) for _, nodes in traces.values() for n in nodes)
    assert total == pytest.approx(estimate(model, H100, devices, strategy).hardware_flops_per_step, rel=1e-9)


def _replicated(model, sharding: str) -> list:
    """Tables held whole on every device: all of them (data-parallel); those of at most 8 MB of weights and
    optimizer state (planned, table-row-wise: NVIDIA's DP_SHARDING_THRESHOLD of 0.008 GB); none otherwise."""
    if sharding == "data-parallel":
        return list(model.tables)
    if sharding not in ("planned", "table-row-wise"):
        return []
    per_row, per_element = STATE_BYTES_PER_ROW[model.embedding_optimizer]
    return [t for t in model.tables if t.rows * (t.row_bytes + per_row + per_element * t.dim) <= 8e6]


def _expected(model, devices, strategy) -> dict:
    """name -> (comm_type name, comm_size) of every collective, from the model's tables: B x lookups x 8 B of
    indices, B x sum d x 2 B of pooled vectors (row-wise: reduce-scattered, all-gathered in 1/N pieces; column-wise
    1/N of every table's columns), the dense and the replicated tables' parameters x 4 B; table-wise, planned and
    table-row-wise send the busiest device's share (``sharded``), a whole number of d x 2 B vectors per sample."""
    sharding = strategy.embedding_sharding.value
    n, lookups = devices, sum(t.pooling for t in model.tables)
    pooled = BATCH * sum(t.dim for t in model.tables) * 2
    out = {"dense_gradient_all_reduce": ("ALL_REDUCE", model.dense_params() * 4)}
    small = _replicated(model, sharding)
    if small:
        out["table_gradient_all_reduce"] = ("ALL_REDUCE", sum(t.rows * t.dim for t in small) * 4)
    if sharding == "row-wise":
        out.update({"index_all_to_all": ("ALL_TO_ALL", BATCH * lookups * 8 / n),
                    "pooled_reduce_scatter.fwd": ("REDUCE_SCATTER", pooled),
                    "pooled_gradient_all_gather.bwd": ("ALL_GATHER", pooled / n)})
    elif sharding == "column-wise":
        out.update({"index_all_to_all": ("ALL_TO_ALL", BATCH * lookups * 8),
                    "pooled_all_to_all.fwd": ("ALL_TO_ALL", pooled / n),
                    "pooled_gradient_all_to_all.bwd": ("ALL_TO_ALL", pooled / n)})
    elif sharding != "data-parallel":
        per_node = 8 if devices > 8 else devices
        share = sharded(model, devices, per_node)[strategy.embedding_sharding.code]
        send = BATCH * share["send"]
        vector = BATCH * model.dim * 2 / (per_node if sharding == "table-row-wise" else 1)
        assert send > 0 and send / vector == pytest.approx(round(send / vector))
        out.update({"index_all_to_all": ("ALL_TO_ALL", BATCH * share["index"]),
                    "pooled_all_to_all.fwd": ("ALL_TO_ALL", send),
                    "pooled_gradient_all_to_all.bwd": ("ALL_TO_ALL", send)})
        if sharding == "table-row-wise":
            pool = BATCH * share["pool"]
            out.update({"node_pool_reduce_scatter.fwd": ("REDUCE_SCATTER", pool),
                        "node_pool_all_gather.bwd": ("ALL_GATHER", pool / per_node)})
    return out


def test_every_collective_carries_the_bytes_the_kernel_charges(exported):
    model, devices, strategy, _, traces, groups = exported
    s = schema()
    names = {getattr(s, k): k for k in ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL")}
    expected = _expected(model, devices, strategy)
    node_group = 8 if devices > 8 else devices
    for rank, (_, nodes) in traces.items():
        got = {n.name: (names[attrs(n)["comm_type"]], attrs(n)["comm_size"]) for n in nodes
               if n.type == s.COMM_COLL_NODE}
        assert set(got) == set(expected)
        for name, (kind, size) in expected.items():
            assert got[name] == (kind, round(size)), name
        for n in nodes:
            if n.type == s.COMM_COLL_NODE:
                members = groups[attrs(n)["pg_name"]]
                assert rank in members
                assert len(members) == (node_group if n.name.startswith("node_") else devices)


def test_every_rank_issues_the_same_collectives_in_the_same_order(exported):
    """Per group, every member the same (type, bytes) sequence (ASTRA-sim pairs collectives by order); over all
    ranks the same sequence of (type, bytes, group size), so no rank waits for a collective another never issues."""
    _, _, _, _, traces, groups = exported
    s = schema()
    seq, shape = defaultdict(list), {}
    for rank, (_, nodes) in traces.items():
        colls = [(attrs(n)["pg_name"], attrs(n)["comm_type"], attrs(n)["comm_size"]) for n in nodes
                 if n.type == s.COMM_COLL_NODE]
        for gid, kind, size in colls:
            seq[(gid, rank)].append((kind, size))
        shape[rank] = [(kind, size, len(groups[gid])) for gid, kind, size in colls]
    for gid, members in groups.items():
        assert len({tuple(seq[(gid, r)]) for r in members}) == 1 and seq[(gid, members[0])]
    assert len({tuple(v) for v in shape.values()}) == 1


def test_the_step_runs_to_completion_in_the_compute_chain(exported):
    """ASTRA-sim's issue rules with free communication (test_export.py's executor): every rank finishes, in its
    compute nodes' sum: the compute is one chain and every collective hangs beside it."""
    _, _, _, _, traces, groups = exported
    end = _run_to_completion(traces, groups)
    chain = max(sum(n.duration_micros for n in nodes if n.type == schema().COMP_NODE) for _, nodes in traces.values())
    assert end == chain


def _after(nodes: list, name: str) -> set:
    """Names of every node ``name`` waits for, directly or not."""
    by_id = {n.id: n for n in nodes}
    todo, seen = list(next(n for n in nodes if n.name == name).deps), set()
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo += by_id[d].deps
    return {by_id[d].name for d in seen}


def test_the_overlaps_the_cost_model_assumes_are_expressible(exported):
    """The bottom MLP's forward (backward) waits for no forward (backward) exchange; the dense gradient all-reduce
    waits for the bottom MLP's backward, and with dp_overlap only the optimizer waits for it; the interaction
    waits for the forward exchange, the update for the backward one and the replicated tables' reduction; the
    compute nodes form one chain."""
    model, devices, strategy, _, _, _ = exported
    nodes = list(_nodes(model, devices, strategy).values())
    colls = {n.name for n in nodes if n.type == COLL}
    fwd, bwd = {c for c in colls if c.endswith(".fwd")}, {c for c in colls if c.endswith(".bwd")}
    assert not _after(nodes, "bottom_mlp.fwd") & fwd and fwd <= _after(nodes, "interaction_top_mlp.fwd")
    assert not _after(nodes, "bottom_mlp.bwd") & bwd and bwd <= _after(nodes, "embedding_update")
    assert "bottom_mlp.bwd" in _after(nodes, "dense_gradient_all_reduce")
    assert ("dense_gradient_all_reduce" in _after(nodes, "embedding_update")) == (not strategy.dp_overlap)
    assert colls <= _after(nodes, "optimizer")
    if "table_gradient_all_reduce" in colls:
        assert "table_gradient_all_reduce" in _after(nodes, "embedding_update")
    chain = [n for n in nodes if n.type == COMP]
    assert [c.name for c in chain] == ["embedding_lookup", "bottom_mlp.fwd", "interaction_top_mlp.fwd",
                                       "interaction_top_mlp.bwd", "bottom_mlp.bwd", "embedding_update", "optimizer"]
    assert all(a.id in b.deps for a, b in zip(chain, chain[1:]))


def test_one_device_has_no_collectives(tmp_path):
    folder = export(DCN, H100, 1, strategy_of(1, {"embedding_sharding": "table-wise"}), tmp_path / "one")
    (_, nodes), = load(folder).values()
    assert all(n.type == schema().COMP_NODE for n in nodes)
    assert json.loads((folder / "astrasim2" / "comm_groups.json").read_text()) == {}


# --- the command ---------------------------------------------------------------------------------------------

ARGS = ("export", "--model", "dlrm-dcnv2", "--cluster", "dgx-h100", "--devices", 8, "--global-batch", BATCH)


def test_the_command_writes_a_recommendation_export(tmp_path, capsys):
    out = tmp_path / "out"
    code, text, err = run(capsys, *ARGS, "--embedding-sharding", "row-wise", "-o", out)
    assert code == 0, err
    assert text.startswith(f"wrote {out}: chakra/ (one ET per rank), astrasim2/, estimate.json") and \
        "no astrasim1/" in text and len(text.splitlines()) == 1
    assert len(list((out / "chakra").glob("*.et"))) == 8 and not (out / "astrasim1").exists()
    assert json.loads((out / "estimate.json").read_text())["inputs"]["strategy"]["embedding_sharding"] == "row-wise"
    assert run(capsys, *ARGS, "-o", out)[0] == 0                  # its own export, unchanged: replaced
    code, text, err = run(capsys, *ARGS, "--no-traces", "-o", tmp_path / "bare")
    assert code == 0 and not (tmp_path / "bare" / "chakra").exists(), err


@pytest.mark.parametrize("extra, needles", [
    (("--global-batch", BATCH + 1), ("strategy", "do not divide the global batch")),
    (("--tp", 2), ("strategy", "data-parallel on every device")),
    (("--max-nodes", 10), ("max-nodes", "fewer devices")),
    (("--embedding-sharding", "column-wise", "--devices", 24, "--global-batch", 24 * 1024),
     ("strategy", "column-wise")),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, extra, needles):
    out = tmp_path / "out"
    one_line_error(run(capsys, *ARGS, *extra, "-o", out), *needles)
    assert not out.exists() and not list(tmp_path.iterdir())
