"""Design-space exploration: the batched rows equal the scalar estimate; sweeps resume; Dask is equivalent."""
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.base.errors import InputError
from comet_dse.cli import main
from comet_dse.design_space import engine
from comet_dse.design_space.search import search, strategy_at
from comet_dse.design_space.space import SearchSpace, enumerate_strategies
from comet_dse.design_space.study import load_study
from comet_dse.presets.catalog import load_cluster, load_model
from cli_run import one_line_error, run
from dask_kill import sweep_killing_a_worker

STUDY = """
name: tiny
models: [megatron-18b]
cluster: dgx-a100-80gb
devices: [64]
global_batch: 256
axes:
  hbm_capacity: {scale: [0.5, 1.0]}
  network.infiniband.link_bandwidth: {values: ["25 GB/s", "50 GB/s"]}
baseline: {hbm_capacity: 1.0, network.infiniband.link_bandwidth: "25 GB/s"}
strategy:
  tp: [2, 4, 8]
  micro_batch: [1, 2]
  zero: [0, 1]
"""


def _study(tmp_path: Path, text: str = STUDY) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def test_enumeration_keeps_degrees_consistent():
    model = load_model("megatron-1t")
    st = enumerate_strategies(model, 4096, 2048, SearchSpace())
    assert np.all(st.tp * st.pp * st.dp == 4096)
    assert not np.any(st.sequence_parallel & (st.tp == 1))     # SP is a no-op without TP
    assert not np.any((st.zero > 0) & (st.dp == 1))            # ZeRO is a no-op without DP
    whole = st.global_batch % st.dp == 0          # other dp values stay, for the batch rule to report
    assert np.all(st.global_batch[whole] % (st.dp * st.micro_batch)[whole] == 0)
    assert np.all(st.micro_batch[~whole] == 1)


def test_search_rows_equal_the_scalar_estimate():
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb")
    result = search(model, cluster, 256, 512)
    cols = result.columns
    rows = list(range(0, result.evaluated, max(1, result.evaluated // 60))) + list(result.ranked[:5])
    for row in rows:
        e = estimate(model, cluster, 256, strategy_at(cols, row))
        assert cols["step_time_s"][row] == e.step_time_s
        assert cols["mfu"][row] == e.mfu
        assert cols["memory_per_device_bytes"][row] == pytest.approx(e.memory_per_device_bytes, abs=1)
        assert bool(cols["feasible"][row]) == e.feasible
        for part, seconds in e.breakdown_s.items():
            assert cols[f"time_{part}_s"][row] == seconds


def test_search_finds_and_counts(capsys):
    assert main(["search", "--model", "megatron-1t", "--cluster", "tpu-v4", "--devices", "4096",
                 "--global-batch", "2048", "--top", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] > 0 and out["evaluated"] > 10_000
    assert out["infeasible_by_rule"]["memory"] > 0
    times = [r["step_time_s"] for r in out["top"]]
    assert times == sorted(times) and len(times) == 3
    assert out["best"]["step_time_s"] == times[0]


def test_sweep_rows_equal_the_scalar_estimate(tmp_path):
    study = load_study(_study(tmp_path))
    out = tmp_path / "r.parquet"
    ranking = engine.run_study(study, out, progress=False)
    table = pq.read_table(out)
    assert table.num_rows == ranking["points"] == len(study.variants) * (ranking["points"] // 4)
    cols = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names
            if name not in ("model", "recompute", "dtype", "placement")}
    codes = {name: np.array([{"none": 0, "selective": 1, "full": 2}.get(v, v) for v in
                             table.column(name).to_pylist()]) for name in ("recompute",)}
    cols["recompute"] = codes["recompute"]
    cols["dtype"] = np.zeros(table.num_rows, dtype=int)
    cols["placement"] = np.zeros(table.num_rows, dtype=int)
    model = study.models[0]
    for row in range(0, table.num_rows, 97):
        variant = study.variants[int(cols["variant"][row])]
        e = estimate(model, variant.cluster, 64, strategy_at(cols, row))
        assert cols["step_time_s"][row] == e.step_time_s
        assert bool(cols["feasible"][row]) == e.feasible


def test_sweep_ranking_and_baseline(tmp_path):
    study = load_study(_study(tmp_path))
    ranking = engine.run_study(study, tmp_path / "r.parquet", progress=False)
    assert ranking["baseline"] == "hbm_capacity=x1, network.infiniband.link_bandwidth=25 GB/s"
    by_label = {g["label"]: g for g in ranking["variants"]}
    base = by_label[ranking["baseline"]]
    assert base["speedup"] == pytest.approx(1.0)
    faster = by_label["hbm_capacity=x1, network.infiniband.link_bandwidth=50 GB/s"]
    assert faster["best"]["step_time_s"] <= base["best"]["step_time_s"]
    half = by_label["hbm_capacity=x0.5, network.infiniband.link_bandwidth=25 GB/s"]
    assert half["feasible"] < base["feasible"]                # less memory, fewer configurations fit
    summary = json.loads(engine.summary_path(tmp_path / "r.parquet").read_text())
    assert summary["points"] == ranking["points"]


def test_interrupted_sweep_resumes_to_an_identical_file(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "CHUNK_ROWS", 200)
    path = _study(tmp_path)
    clean = tmp_path / "clean.parquet"
    engine.run_study(load_study(path), clean, progress=False)

    out = tmp_path / "resumed.parquet"
    seen = []

    def stop_after_three(index):
        seen.append(index)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.run_study(load_study(path), out, progress=False, on_chunk=stop_after_three)
    assert not out.exists()                                      # never half-written under the final name
    parts = sorted((tmp_path / "resumed.parquet.parts").glob("part-*.parquet"))
    assert len(parts) == 3
    with pytest.raises(InputError, match="--resume"):
        engine.run_study(load_study(path), out, progress=False)
    ranking = engine.run_study(load_study(path), out, progress=False, resume=True)
    assert ranking["skipped"] == 3
    assert out.read_bytes() == clean.read_bytes()
    assert not (tmp_path / "resumed.parquet.parts").exists()


def test_process_pool_equals_serial(tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "CHUNK_ROWS", 300)
    path = _study(tmp_path)
    engine.run_study(load_study(path), tmp_path / "a.parquet", progress=False)
    engine.run_study(load_study(path), tmp_path / "b.parquet", progress=False, workers=2)
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_dask_equals_serial_and_survives_a_killed_worker(tmp_path, monkeypatch):
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr(engine, "CHUNK_ROWS", 150)
    path = _study(tmp_path)
    engine.run_study(load_study(path), tmp_path / "serial.parquet", progress=False)
    ranking, killed = sweep_killing_a_worker(distributed, load_study(path), tmp_path / "dask.parquet")
    assert killed
    assert ranking["skipped"] == 0
    assert (tmp_path / "dask.parquet").read_bytes() == (tmp_path / "serial.parquet").read_bytes()


@pytest.mark.parametrize("edit,field", [
    (("  hbm_capacity: {scale: [0.5, 1.0]}", "  hbm_size: {scale: [0.5, 1.0]}"), "axes.hbm_size: unknown axis"),
    (("  hbm_capacity: {scale: [0.5, 1.0]}", "  hbm_capacity: {scale: []}"), "axes.hbm_capacity.scale: is empty"),
    (("  hbm_capacity: {scale: [0.5, 1.0]}", "  hbm_capacity: {values: [80 GB/s]}"),
     "axes.hbm_capacity.values: unit 'GB/s' is not a bytes unit"),
    (("  tp: [2, 4, 8]", "  tp: [3]"), "strategy.tp"),
    (("cluster: dgx-a100-80gb", "cluster: dgx-z900"), "cluster: unknown preset 'dgx-z900'"),
    (("global_batch: 256", "global_batch: -4"), "global_batch: must hold positive integers"),
])
def test_bad_study_is_one_line_exit_2(tmp_path, capsys, edit, field):
    path = _study(tmp_path, STUDY.replace(*edit))
    out = tmp_path / "never.parquet"
    one_line_error(run(capsys, "sweep", path, "--output", out, "--no-progress"), field)
    assert not out.exists() and not Path(str(out) + ".parts").exists()


def test_sweep_cli_csv(tmp_path, capsys):
    path = _study(tmp_path)
    out = tmp_path / "rows.csv"
    assert main(["sweep", str(path), "--output", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "speedup" in text and "1.00x" in text
    lines = out.read_text().splitlines()
    header = lines[0].split(",")
    assert '"step_time_s"' in header and '"model"' in header
    assert len(lines) - 1 == json.loads(engine.summary_path(out).read_text())["points"]


def test_pareto_front_of_time_against_price(tmp_path):
    text = STUDY.replace("devices: [64]", "devices: [32, 64]").replace(
        "  network.infiniband.link_bandwidth: {values: [\"25 GB/s\", \"50 GB/s\"]}\n",
        "  device_price_usd: {values: [10000, 20000]}\n").replace(
        "baseline: {hbm_capacity: 1.0, network.infiniband.link_bandwidth: \"25 GB/s\"}", "token_budget: 1e9")
    ranking = engine.run_study(load_study(_study(tmp_path, text)), tmp_path / "p.parquet", progress=False)
    front = ranking["pareto_cost"]
    assert front, ranking["variants"]
    costs = [p["cost_usd"] for p in front]
    times = [p["time_s"] for p in front]
    assert costs == sorted(costs) and times == sorted(times, reverse=True)   # cheaper is slower along the front
    for g in ranking["variants"]:                                            # nothing dominates a front point
        if g["best"]:
            t = g["best"]["time_to_train_s"]                   # goodput included (whole_run/economics.py)
            assert t >= 1e9 / g["best"]["tokens_per_second"]
            assert not any(g["best"]["cost_usd"] <= p["cost_usd"] and t < p["time_s"] for p in front)
