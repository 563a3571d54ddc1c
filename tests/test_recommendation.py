"""Recommendation models (DLRM, DLRM-DCNv2) on the workload seam: model files, the cost kernel's terms, the
search over embedding shardings, and the commands that do not take them yet (docs/model.md, "Recommendation
models")."""
from __future__ import annotations

import math

import numpy as np
import pytest

import comet_dse
from comet_dse.base.errors import InputError
from comet_dse.cost.recommendation import SECTOR, planned_items, sector_bytes, sharded
from comet_dse.model.recommendation import EmbeddingTable, Recommendation, recommendation_from
from comet_dse.presets.catalog import load_model
from comet_dse.strategy.choices import EmbeddingSharding
from comet_dse.workload.families import family_of

from tests.cli_run import one_line_error, run

TABLES = [{"rows": 1_000_000, "dim": 64, "pooling": 4}, {"rows": 1000, "dim": 64, "pooling": 1, "count": 3}]
BASE = {"name": "toy", "dense_features": 13, "bottom_mlp": [256, 64], "top_mlp": [256, 1], "tables": TABLES}


def toy(**changes) -> Recommendation:
    return recommendation_from({**BASE, **changes})


def test_a_model_file_reads_its_tables_mlps_and_interaction():
    model = toy()
    assert len(model.tables) == 4 and model.features == 5 and model.dim == 64
    assert model.interaction_width == 64 + 5 * 4 // 2
    dense = (13 * 256 + 256) + (256 * 64 + 64) + (74 * 256 + 256) + (256 + 1)
    assert model.dense_params() == dense
    assert model.total_params() == dense + 1_003_000 * 64
    assert family_of(model).name == "recommendation" and model.kind == "recommendation"


@pytest.mark.parametrize("change, field", [
    ({"tables": [{"rows": 10, "dim": 8, "pooling": 0}]}, "pooling"),
    ({"tables": [{"rows": -5, "dim": 8}]}, "rows"),
    ({"tables": [{"rows": 10, "dim": 64}, {"rows": 10, "dim": 32}]}, "tables"),
    ({"interaction": "attention"}, "interaction"),
    ({"bottom_mlp": [256, 32]}, "bottom_mlp"),
    ({"top_mlp": [256, 2]}, "top_mlp"),
    ({"tables": []}, "tables"),
    ({"interaction": "dcn", "cross_layers": 0}, "cross_layers"),
    ({"tables": [{"rows": 10, "dim": 64, "element": "fp64"}]}, "element"),
])
def test_bad_model_files_are_one_line_naming_the_field(change, field):
    with pytest.raises(InputError) as err:
        toy(**change)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_a_random_row_moves_whole_sectors():
    assert sector_bytes(512) == 512 and sector_bytes(8) == SECTOR and sector_bytes(40) == 2 * SECTOR


def test_table_wise_balances_lookups_and_the_shardings_split_what_they_say():
    model = toy()
    share = sharded(model, 4)
    whole = sum(t.table_bytes for t in model.tables)
    assert share[EmbeddingSharding.ROW_WISE.code]["table_bytes"] == pytest.approx(whole / 4)
    assert share[EmbeddingSharding.COLUMN_WISE.code]["table_bytes"] == pytest.approx(whole / 4)
    assert share[EmbeddingSharding.DATA_PARALLEL.code]["table_bytes"] == whole
    assert share[EmbeddingSharding.TABLE_WISE.code]["table_bytes"] == model.tables[0].table_bytes
    # the lookups of one global sample: L x sector(d e) over the devices that do them
    per_sample = sum(t.pooling * sector_bytes(t.row_bytes) for t in model.tables)
    assert share[EmbeddingSharding.ROW_WISE.code]["lookup"] == pytest.approx(per_sample / 4)
    assert share[EmbeddingSharding.DATA_PARALLEL.code]["send"] == 0.0


def test_more_hbm_bandwidth_speeds_the_lookups_and_nothing_else():
    model = toy()
    base = comet_dse.estimate(model, "dgx-h100", 8, global_batch=8192)
    faster = comet_dse.estimate(model, "dgx-h100", 8, global_batch=8192, overrides={"hbm_bandwidth": "x2"})
    assert faster.breakdown_s["memory"] < base.breakdown_s["memory"]
    assert faster.breakdown_s["compute"] == pytest.approx(base.breakdown_s["compute"], rel=0.2)
    assert faster.step_time_s < base.step_time_s


def test_data_parallel_tables_all_reduce_their_whole_gradients():
    """Data-parallel sharding exchanges no pooled embeddings, but all-reduces every table's fp32 gradient: on a
    model with a large table that is the slowest layout, and it holds every table on every device."""
    model = toy()
    dp = comet_dse.estimate(model, "dgx-h100", 8, global_batch=8192, embedding_sharding="data-parallel")
    rows = comet_dse.estimate(model, "dgx-h100", 8, global_batch=8192, embedding_sharding="row-wise")
    assert dp.breakdown_s["embedding_communication"] == 0.0
    assert dp.breakdown_s["dp_communication"] > rows.breakdown_s["dp_communication"]
    assert dp.memory_bytes["weights"] > 7 * rows.memory_bytes["weights"]


def test_tables_larger_than_memory_do_not_fit_and_an_expansion_tier_holds_them_at_its_bandwidth():
    big = toy(tables=[{"rows": 12_000_000_000, "dim": 64, "pooling": 2}])   # 384 GB per device: over HBM and host
    est = comet_dse.estimate(big, "dgx-h100", 8, global_batch=8192, embedding_sharding="row-wise")
    assert not est.feasible and est.broken_rules == ["memory"] and "GiB" in est.reasons[0]
    tiered = comet_dse.estimate(big, "dgx-h100", 8, global_batch=8192, embedding_sharding="row-wise",
                                expansion="2 TiB@64 GB/s")
    assert tiered.feasible and tiered.breakdown_s["offload"] > 0
    slower = comet_dse.estimate(big, "dgx-h100", 8, global_batch=8192, embedding_sharding="row-wise",
                                expansion="2 TiB@32 GB/s")
    assert slower.breakdown_s["offload"] > tiered.breakdown_s["offload"]


def test_the_band_is_the_recommendation_familys_and_the_gemms_run_at_the_physical_reading():
    est = comet_dse.estimate(toy(), "dgx-h100", 8, global_batch=8192)
    assert est.error_band["kind"] == "recommendation" and "recommendation" in est.error_band["text"]
    assert est.error_band["frameworks"] == "HugeCTR (MLPerf)"          # the MLPerf runs, not the transformers'
    other = comet_dse.estimate(toy(), "mi300x", 8, global_batch=8192)
    assert other.error_band["validated"] is False
    assert est.efficiency["status"] == "physical"
    assert est.tokens_per_second == pytest.approx(8192 / est.step_time_s)
    assert math.isclose(sum(est.breakdown_s.values()), est.step_time_s, rel_tol=1e-9)


def test_a_search_tries_each_sharding_the_model_allows_and_no_transformer_knob():
    result = comet_dse.search(toy(), "dgx-h100", 8, 8192)
    shardings = {row["embedding_sharding"] for row in result.rows()}
    assert shardings == {s.value for s in EmbeddingSharding}
    assert len(result.rows()) == 6          # recomputation, ZeRO, flash attention ... are not multiplied in
    on_24 = comet_dse.search(toy(), "dgx-h100", 24, 24 * 512)
    assert {row["embedding_sharding"] for row in on_24.rows()} == {"table-wise", "row-wise", "data-parallel",
                                                                    "planned", "table-row-wise"}


def test_plan_and_estimate_take_a_recommendation_model_file_in_samples(tmp_path, capsys):
    path = tmp_path / "toy.yaml"
    path.write_text("family: recommendation\n" + "\n".join(
        f"{k}: {v}" for k, v in BASE.items() if k != "tables")
        + "\ntables:\n" + "\n".join(f"  - {t}" for t in TABLES).replace("'", "") + "\n", encoding="utf-8")
    assert isinstance(load_model(str(path)), Recommendation)
    code, out, err = run(capsys, "plan", "--model", path, "--tokens", "1e9", "--global-batch", "8192", "--days", "1",
                         "--clusters", "dgx-h100,dgx-a100-80gb", "--devices", "8")
    assert code == 0 and "1G samples" in out and "dp8 bf16 " in out, (out, err)
    assert " tp1 " not in out and "z0" not in out             # a recommendation strategy names its own knobs
    code, out, err = run(capsys, "estimate", "--model", path, "--cluster", "dgx-h100", "--devices", "8",
                         "--global-batch", "8192")
    assert code == 0 and "samples/s" in out and "embedding exchange" in out and "pipeline bubble" not in out
    one_line_error(run(capsys, "estimate", "--model", path, "--cluster", "dgx-h100", "--devices", "8",
                       "--global-batch", "8192", "--tp", "2"), "tp:")


def test_the_transformer_knows_nothing_of_embedding_tables():
    """The new knob stays at its default for a transformer, and its search tables do not show it."""
    result = comet_dse.search("llama3-8b", "dgx-h100", 8, 64)
    assert {row["embedding_sharding"] for row in result.rows()} == {"table-wise"}
    assert np.all(result.result.columns["time_embedding_communication_s"] == 0.0)


def test_a_hierarchical_exchange_spreads_a_nodes_traffic_over_its_interfaces():
    """Across nodes, the busiest device's pooled vectors leave through every interface of its node: slower
    networks gain most, one node gains nothing (there is no outer dimension to cross)."""
    model = load_model("dlrm-dcnv2")
    args = dict(global_batch=135168, embedding_sharding="planned", dtype="fp16")
    flat = comet_dse.estimate(model, "dgx-h100", 64, **args)
    hier = comet_dse.estimate(model, "dgx-h100", 64, embedding_hierarchical=True, **args)
    assert hier.breakdown_s["embedding_communication"] < 0.8 * flat.breakdown_s["embedding_communication"]
    one = [comet_dse.estimate(model, "dgx-h100", 8, global_batch=55296, embedding_hierarchical=h,
                              embedding_sharding="planned") for h in (False, True)]
    assert one[0].step_time_s == pytest.approx(one[1].step_time_s)


def test_whatif_takes_a_recommendation_model_and_says_what_hbm_bandwidth_buys():
    """Lookups and updates are bound by HBM bandwidth: doubling it speeds the step up by far more than doubling
    the network of one node (only the embedding exchange needs it); the family's samples are what the
    throughput counts."""
    result = comet_dse.whatif("dlrm-dcnv2", "dgx-h100", 8, 55296, resources=["hbm_bandwidth", "network_bandwidth"])
    assert result.unit == "samples" and result.baseline.step_time_s is not None
    assert result.speedup("hbm_bandwidth", 2.0) > 1.2 > result.speedup("network_bandwidth", 2.0) >= 1.0


def test_an_expansion_tier_pays_more_the_faster_it_is():
    """Tables four times HBM on an expansion tier: the step gets faster with the tier's bandwidth."""
    big = toy(tables=[{"rows": 6_000_000_000, "dim": 64, "pooling": 4}])
    result = comet_dse.whatif(big, "dgx-h100", 8, 65536, resources=["expansion_bandwidth"], factors=(2.0, 4.0),
                              expansion="2 TiB@64 GB/s")
    assert result.baseline.step_time_s is not None
    assert 1.0 < result.speedup("expansion_bandwidth", 2.0) < result.speedup("expansion_bandwidth", 4.0)


def test_grouping_the_points_changes_no_bit():
    """evaluate computes each distinct combination of the knobs it reads once (cost/distinct.py); the result must
    equal computing every point."""
    import importlib.util
    from pathlib import Path

    from comet_dse.cost.distinct import ungrouped
    from comet_dse.cost.recommendation import evaluate
    from comet_dse.presets.catalog import load_cluster
    from comet_dse.strategy.arrays import StrategyArrays

    spec = importlib.util.spec_from_file_location(
        "bench_recommendation", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_recommendation.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    distinct = bench.distinct_points()
    st = StrategyArrays({k: np.tile(getattr(distinct, k), 8) for k in distinct.__dict__})   # 1/8 distinct: grouped
    model, cluster = load_model("dlrm-dcnv2"), load_cluster("dgx-h100")
    grouped = evaluate(model, cluster, bench.DEVICES, st)
    with ungrouped():
        each = evaluate(model, cluster, bench.DEVICES, st)
    assert np.array_equal(grouped.step_time, each.step_time)
    for key in each.breakdown:
        assert np.array_equal(np.broadcast_to(grouped.breakdown[key], each.step_time.shape),
                              np.broadcast_to(each.breakdown[key], each.step_time.shape)), key
    assert np.array_equal(grouped.memory_total, each.memory_total)


def test_table_row_wise_keeps_partial_pools_inside_the_node():
    """Across nodes, table-row-wise sums the partial pools over the scale-up links and sends only whole pools
    over the network: less exchange than row-wise, whose reduce-scatter spans every device; on one node it is
    row-wise (the node holds every table)."""
    model = load_model("dlrm-dcnv2")
    args = dict(global_batch=135168, dtype="fp16")
    twrw = comet_dse.estimate(model, "dgx-h100", 64, embedding_sharding="table-row-wise", **args)
    rows = comet_dse.estimate(model, "dgx-h100", 64, embedding_sharding="row-wise", **args)
    assert twrw.breakdown_s["embedding_communication"] < rows.breakdown_s["embedding_communication"]
    per_node = sharded(model, 64, 8)[EmbeddingSharding.TABLE_ROW_WISE.code]
    assert per_node["pool"] > 0 and per_node["table_bytes"] < sum(t.table_bytes for t in model.tables) / 8
    one = sharded(model, 8, 8)
    assert one[EmbeddingSharding.TABLE_ROW_WISE.code]["lookup"] == pytest.approx(
        one[EmbeddingSharding.ROW_WISE.code]["lookup"], rel=0.05)


@pytest.mark.parametrize("table, needle", [("{rows: 10, dim: 64, pooling: 0}", "pooling"),
                                           ("{rows: -10, dim: 64}", "rows"),
                                           ("{rows: 10, dim: 64, pooling: 1, count: 0}", "count")])
def test_a_bad_model_file_on_the_command_line_is_one_line(tmp_path, capsys, table, needle):
    path = tmp_path / "bad.yaml"
    path.write_text("family: recommendation\nname: bad\ndense_features: 13\nbottom_mlp: [64]\ntop_mlp: [64, 1]\n"
                    f"tables:\n  - {table}\n", encoding="utf-8")
    one_line_error(run(capsys, "estimate", "--model", path, "--cluster", "dgx-h100", "--devices", "8",
                       "--global-batch", "8192"), "model.tables[0]", needle)
    one_line_error(run(capsys, "search", "--model", path, "--cluster", "dgx-h100", "--devices", "8",
                       "--global-batch", "8192"), needle)


def test_a_sequence_length_for_a_recommendation_model_is_one_line(capsys):
    one_line_error(run(capsys, "estimate", "--model", "dlrm-dcnv2", "--cluster", "dgx-h100", "--devices", "8",
                       "--global-batch", "8192", "--seq-len", "2048"), "seq_len", "transformers only")


def test_a_study_sweeps_a_recommendation_model_over_clusters_and_an_expansion_tier(tmp_path):
    """The DLRM study of studies/comet: on 2 DGX A100s DLRM-DCNv2's tables spill to host memory without a tier
    and a faster tier makes the step faster; on 2 TPU v4 chips (whose host memory takes no row reads: a TPU copies
    whole buffers to the host, MemoryTier.row_reads) nothing fits without one; the summary counts the infeasible
    points by the family's own rules."""
    from pathlib import Path

    study = Path(__file__).resolve().parents[1] / "studies" / "comet" / "rq6-dlrm-expansion.yaml"
    result = comet_dse.sweep(study, output=tmp_path / "rq6.parquet")
    rows = result.to_pandas()
    capacity, bandwidth = "axis_expansion_capacity", "axis_expansion_bandwidth"
    labels = {v["variant"]: v["label"] for v in result.variants}
    rows["cluster"] = [labels[v].split(",")[0].split("=")[1] for v in rows["variant"]]
    two = rows[(rows["devices"] == 2) & (rows["model"] == "dlrm-dcnv2")]
    dgx, tpu = two[two["cluster"] == "dgx-a100-80gb"], two[two["cluster"] == "tpu-v4"]
    host_only = dgx[(dgx[capacity] == 0) & dgx["feasible"]]
    assert len(host_only) and (host_only["host_bytes"] > 0).all()
    tiered = dgx[(dgx[capacity] > 0) & dgx["feasible"]]
    by_bw = tiered.groupby(bandwidth)["step_time_s"].min().sort_index()
    assert list(by_bw) == sorted(by_bw, reverse=True) and by_bw.iloc[-1] < host_only["step_time_s"].min()
    assert not tpu[tpu[capacity] == 0]["feasible"].any() and tpu[tpu[capacity] > 0]["feasible"].any()
    reasons = {code for v in result.variants for code in v.get("infeasible_by_rule", {})}
    assert reasons <= {"rec_degrees", "batch", "column_split", "dtype", "memory"} and "memory" in reasons


def test_a_sample_budget_says_samples_and_small_device_hours_keep_their_digits(capsys):
    code, out, err = run(capsys, "estimate", "--model", "dlrm-dcnv2", "--cluster", "dgx-h100", "--devices", "8",
                         "--global-batch", "55296", "--embedding-sharding", "planned", "--tokens", "3.2G")
    assert code == 0, err
    assert "Training on 3.2G samples" in out
    hours = next(line for line in out.splitlines() if line.strip().startswith("device-hours")).split()[1]
    assert 0.1 < float(hours) < 10


def test_host_memory_holds_the_rows_hbm_cannot_and_the_faster_tier_fills_first():
    """3e9 rows x 64 x 4 B over 8 H100s: 96 GB per device, over HBM; the preset's host memory (256 GiB per GPU
    over PCIe Gen5 at 0.56 x 63 GB/s) holds the rest, and its lookups cost the link's time. An expansion tier
    faster than that link takes the spill first."""
    big = toy(tables=[{"rows": 3_000_000_000, "dim": 64, "pooling": 2}])
    est = comet_dse.estimate(big, "dgx-h100", 8, global_batch=8192, embedding_sharding="row-wise")
    assert est.feasible and est.memory_tiers_bytes["host"] > 0 and est.memory_tiers_bytes["expansion"] == 0
    assert est.breakdown_s["offload"] > 0
    fast = comet_dse.estimate(big, "dgx-h100", 8, global_batch=8192, embedding_sharding="row-wise",
                              expansion="64 GiB@128 GB/s")
    assert fast.memory_tiers_bytes["expansion"] == pytest.approx(est.memory_tiers_bytes["host"])   # all of it
    assert fast.memory_tiers_bytes["host"] == 0
    assert fast.breakdown_s["offload"] < est.breakdown_s["offload"]
    small = comet_dse.estimate(big, "dgx-h100", 8, global_batch=8192, embedding_sharding="row-wise",
                               expansion="4 GiB@128 GB/s")          # the rest goes on to host memory
    assert small.memory_tiers_bytes["expansion"] == 4 * 2**30
    assert small.memory_tiers_bytes["host"] == pytest.approx(est.memory_tiers_bytes["host"] - 4 * 2**30)


def test_a_skewed_access_law_puts_fewer_lookups_on_the_slow_tier():
    """The hottest rows stay in HBM: with a Zipf exponent the rows beyond it serve fewer lookups than their share
    of the rows, so the same spill costs less."""
    tables = [{"rows": 3_000_000_000, "dim": 64, "pooling": 2}]
    flat = comet_dse.estimate(toy(tables=tables), "dgx-h100", 8, global_batch=8192, embedding_sharding="row-wise")
    skewed = comet_dse.estimate(toy(tables=tables, access_skew=1.05), "dgx-h100", 8, global_batch=8192,
                                embedding_sharding="row-wise")
    assert 0 < skewed.breakdown_s["offload"] < 0.5 * flat.breakdown_s["offload"]


@pytest.mark.parametrize("skew, rows, resident", [(0.9, 1000, 0.1), (1.0, 10**6, 0.01), (1.1, 10**6, 0.5),
                                                  (1.5, 1000, 0.1)])
def test_the_hit_rate_is_the_zipf_laws_within_a_few_per_cent_and_uniform_without_skew(skew, rows, resident):
    """h(c) = H(c R, s) / H(R, s) against the exact sums of k^-s; no skew: h(c) = c exactly."""
    from comet_dse.cost.recommendation import hot_share
    k = np.arange(1, rows + 1, dtype=float)
    exact = (k[:int(resident * rows)] ** -skew).sum() / (k ** -skew).sum()
    model = toy(tables=[{"rows": rows, "dim": 64, "pooling": 1}], access_skew=skew)
    assert float(hot_share(model, resident)) == pytest.approx(exact, rel=0.04)
    assert float(hot_share(model, 1.0)) == pytest.approx(1.0) and float(hot_share(model, 0.0)) == 0.0
    assert float(hot_share(toy(tables=[{"rows": rows, "dim": 64}]), resident)) == resident


@pytest.mark.parametrize("skew", [-0.5, 3.5, "high", True, float("nan")])
def test_an_access_skew_outside_the_zipf_range_is_refused_naming_it(skew):
    with pytest.raises(InputError) as err:
        toy(access_skew=skew)
    assert err.value.field == "model.access_skew"


def test_the_explorer_searches_a_recommendation_model_in_its_own_terms():
    """The explorer's view of DLRM-DCNv2: its strategies named by its own knobs, samples as the unit, the rules
    that excluded strategies stated in the family's words."""
    from comet_dse.web.view import Controls, compute

    view = compute(Controls(model="dlrm-dcnv2", cluster="dgx-h100", devices=8, global_batch=65536, resources={},
                            rank=1, tokens=4.2e9, strategy={}, tp_across_nodes=False))
    assert view.unit == "samples" and view.feasible >= 1 and view.top[0]["strategy"].startswith("dp8 ")
    assert "tp" not in view.top[0]["strategy"] and view.chosen["training"]["tokens"] == 4.2e9
    assert set(view.excluded) <= set(family_of(load_model("dlrm-dcnv2")).rule_text.values())
    assert "recommendation" in view.chosen["error_band"]


def test_whatif_scales_the_host_memory_link_a_recommendation_model_spills_to():
    """On 2 A100s DLRM-DCNv2's tables overflow HBM into host memory: the link's bandwidth is a resource whatif
    scales by default for it (and --set takes by the same name), and doubling it speeds the step up."""
    result = comet_dse.whatif("dlrm-dcnv2", "dgx-a100-80gb", 2, 65536)
    cells = {(c.resource, c.factor): c for c in result.cells}
    assert cells[("host_memory_bandwidth", 2.0)].speedup > 1.2
    assert cells[("host_memory_bandwidth", 0.5)].speedup < 1.0
    transformer = comet_dse.whatif("llama3-8b", "dgx-a100-80gb", 8, 64, resources=None)
    assert not any(c.resource.startswith("host_memory_") for c in transformer.cells)
