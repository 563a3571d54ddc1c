"""comet-dse export --slice replica: one data-parallel replica's ranks of a large job, each the whole job's trace of
that rank less the collectives of the groups that reach other replicas (listed in slice.json)."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from comet_dse.export.chakra_schema import schema
from comet_dse.export.folder import export
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.declared import Strategy

from cli_run import one_line_error, run
from test_export import TINY_MOE, _run_to_completion, attrs, load

pytest.importorskip("google.protobuf")

DGX = load_cluster("dgx-a100-80gb")
CASES = {       # name -> (model, devices, strategy): jobs small enough to export whole, to compare the slice with
    "megatron-1.7b-tp2-pp2-dp8-zero1": (load_model("megatron-1.7b"), 32, Strategy(
        tp=2, pp=2, dp=8, global_batch=16, micro_batch=1, zero=1, sequence_parallel=True)),
    "megatron-1.7b-cp2-pp2-dp4-zero3": (load_model("megatron-1.7b"), 16, Strategy(
        cp=2, pp=2, dp=4, global_batch=8, micro_batch=1, zero=3)),
    "tiny-moe-pp2-dp8-ep2-zero1": (TINY_MOE, 16, Strategy(pp=2, dp=8, ep=2, global_batch=16, micro_batch=1, zero=1)),
}
DP_NAMES = ("dp_gradient", "dp_weight_all_gather", "expert_gradient", "expert_weight_all_gather")


@pytest.fixture(scope="module", params=list(CASES))
def both(request, tmp_path_factory):
    model, devices, strategy = CASES[request.param]
    root = tmp_path_factory.mktemp("slice")
    whole = export(model, DGX, devices, strategy, root / "whole")
    part = export(model, DGX, devices, strategy, root / "slice", part="replica")
    return model, devices, strategy, (whole, load(whole)), (part, load(part))


def _key(n) -> tuple:
    """What a node is, ids aside: name, type, duration, FLOPs and every attribute."""
    a = attrs(n)
    return (n.name, n.type, n.duration_micros, tuple(sorted((k, v) for k, v in a.items() if k != "pg_name")))


def test_the_slice_holds_one_replicas_ranks(both):
    """Its ranks are the job's first tp cp pp (x ep for a MoE model) ranks, DP index 0 (or the first EP block),
    every TP index, CP index and stage; slice.json says which."""
    model, devices, strategy, _, (folder, traces) = both
    block = strategy.ep if model.moe else 1
    n = strategy.tp * strategy.cp * strategy.pp * block
    assert sorted(traces) == list(range(n))
    table = json.loads((folder / "chakra" / "ranks.json").read_text())
    assert {v["dp"] for v in table.values()} == set(range(block))
    meta = json.loads((folder / "slice.json").read_text())
    assert meta["slice"] == "replica" and meta["ranks"] == n and meta["job_devices"] == devices
    assert "left out" in meta["note"]


def test_each_slice_rank_is_the_jobs_less_the_collectives_with_other_replicas(both):
    """Node for node, a slice rank's trace is the whole job's trace of that rank without its DP-group (and expert
    DP) collectives: the same compute durations and FLOPs, the same bytes for every collective and transfer
    that stays; the left-out collectives are exactly those, listed in slice.json with the whole job's bytes
    and group sizes."""
    model, devices, strategy, (whole_folder, whole), (folder, part) = both
    s = schema()
    meta = json.loads((folder / "slice.json").read_text())
    table = json.loads((folder / "chakra" / "ranks.json").read_text())
    whole_groups = json.loads((whole_folder / "astrasim2" / "comm_groups.json").read_text())
    for rank, (_, nodes) in part.items():
        job = whole[rank][1]
        kept = [n for n in job if not any(x in n.name for x in DP_NAMES)]
        left = [n for n in job if any(x in n.name for x in DP_NAMES)]
        assert [_key(n) for n in nodes] == [_key(n) for n in kept]
        compute = sum(n.duration_micros for n in nodes if n.type == s.COMP_NODE)
        assert compute == sum(n.duration_micros for n in job if n.type == s.COMP_NODE)
        listed = Counter()
        for entry in meta["omitted_per_rank_by_stage"].get(str(table[str(rank)]["pp"]), []):
            listed[(entry["job_group_members"], entry["comm_type"], entry["comm_size"])] += entry["per_step"]
        name = {getattr(s, k): k for k in ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL")}
        expected = Counter((len(whole_groups[attrs(n)["pg_name"]]), name[attrs(n)["comm_type"]], attrs(n)["comm_size"])
                           for n in left)
        assert listed == expected
        assert bool(left) == (strategy.dp * strategy.cp > (strategy.ep if model.moe else 1) or strategy.cp > 1)


def test_the_slice_runs_to_completion_on_its_own_groups(both):
    """The slice's communicator groups are the whole job's groups it holds whole (TP, CP, EP); with free
    communication every rank finishes, no later than the whole job's step (which also waits for the DP
    collectives of the optimizer)."""
    _, _, _, (whole_folder, whole), (folder, part) = both
    groups = json.loads((folder / "astrasim2" / "comm_groups.json").read_text())
    whole_groups = json.loads((whole_folder / "astrasim2" / "comm_groups.json").read_text())
    assert {tuple(v) for v in groups.values()} <= {tuple(v) for v in whole_groups.values()}
    assert all(r in part for v in groups.values() for r in v)
    end = _run_to_completion(part, groups)
    assert end <= _run_to_completion(whole, whole_groups) + 1.0


def test_a_16384_gpu_job_exports_as_one_replica(tmp_path, capsys):
    """llama3-8b on 16,384 H100s, tp 8 pp 4 dp 512: whole, its traces exceed a bound of 1,000,000 nodes and the
    refusal (one line) points to --slice replica; the replica's 32 ranks fit in it, the network file sized for
    them, each rank's DP all-reduce (over 512 ranks in the job) listed, not written."""
    args = ("export", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", 16384, "--tp", 8, "--pp", 4,
            "--global-batch", 1024, "--max-nodes", 1_000_000)
    one_line_error(run(capsys, *args, "-o", tmp_path / "whole"), "max-nodes", "--slice replica")
    assert not (tmp_path / "whole").exists()
    code, text, err = run(capsys, *args, "--slice", "replica", "-o", tmp_path / "out")
    assert code == 0, err
    assert "replica slice: 32 of the job's 16,384 ranks" in text and "slice.json" in text
    out = tmp_path / "out"
    assert len(list((out / "chakra").glob("*.et"))) == 32
    assert "npus_count: [ 8, 4 ]" in (out / "astrasim2" / "network.yml").read_text()
    meta = json.loads((out / "slice.json").read_text())
    for stage in range(4):
        entries = meta["omitted_per_rank_by_stage"][str(stage)]
        assert [(e["group"], e["job_group_members"], e["comm_type"]) for e in entries] == [("dp", 512, "ALL_REDUCE")]
    assert json.loads((out / "estimate.json").read_text())["inputs"]["devices"] == 16384


@pytest.mark.parametrize("extra, needles", [
    (("--max-nodes", 10), ("max-nodes", "replica slice", "nodes")),
    (("--placement", "dp-pp-tp"), ("slice", "outermost")),
    (("--model", "dlrm-dcnv2", "--tp", 1, "--pp", 1, "--global-batch", 65536), ("slice", "transformers")),
])
def test_slice_refusals_are_one_line(tmp_path, capsys, extra, needles):
    args = ("export", "--model", "megatron-1.7b", "--cluster", "dgx-h100", "--devices", 64, "--tp", 2, "--pp", 2,
            "--global-batch", 16, "--slice", "replica", *extra, "-o", tmp_path / "out")
    one_line_error(run(capsys, *args), *needles)
    assert not (tmp_path / "out").exists()
