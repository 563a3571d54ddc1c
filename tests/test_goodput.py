"""Goodput (whole_run/goodput.py, docs/economics.md "Goodput"): failures, restarts and checkpoints, by hand; Young's
interval; the settings through --set, the API and a cluster file; the error band carried into every
derived figure (economics.with_ranges)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import comet_dse
from comet_dse.answers.overrides import apply_overrides
from comet_dse.presets.catalog import load_cluster
from comet_dse.whole_run import economics, goodput
from comet_dse.whole_run.economics import band_range, with_ranges
from cli_run import one_line_error, run

HOUR, DAY = 3600.0, 86400.0
SMALL = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "64", "--global-batch", "512"]


def test_defaults_are_the_sourced_figures():
    # Llama 3 (arXiv:2407.21783, Sec. 3.3.4): 419 unexpected interruptions in 54 days on 16,384 GPUs
    assert goodput.DEFAULT_MTBF == pytest.approx(16_384 * 54 * 24 * HOUR / 419)
    assert goodput.DEFAULT_MTBF / HOUR == pytest.approx(50_677, rel=1e-4)
    # the cluster MTBF of that job is the observed mean time between unexpected interruptions: 54 days / 419
    assert goodput.cluster_mtbf(goodput.DEFAULT_MTBF, 16_384) == pytest.approx(54 * DAY / 419)
    # Tectonic's 2 TB/s sustained over 16,384 GPUs; 14 bytes per parameter; PCIe 4.0 x16 at 128b/130b
    assert goodput.DEFAULT_STORAGE_BANDWIDTH * 16_384 == pytest.approx(2e12)
    assert goodput.DEFAULT_CHECKPOINT_BYTES == 2 + 4 + 4 + 4
    assert goodput.DEFAULT_HOST_BANDWIDTH == pytest.approx(31.5e9, rel=1e-3)


def test_goodput_of_one_run_by_hand():
    # 1,000 devices, MTBF 1e7 s per device -> job MTBF M = 1e4 s; 1e9 parameters x 10 B = 1e10 B checkpoint;
    # storage 1e7 B/s per device -> C = 1e10 / (1e3 x 1e7) = 1 s; restart 99 s + 1 s re-load = R = 100 s
    rel = goodput.Reliability(mtbf_s=1e7, restart_s=99.0, storage_bandwidth=1e7, checkpoint_bytes_per_parameter=10.0)
    out = goodput.run(rel, 1000, 1e9, 1e6)
    assert out["mtbf_s"] == pytest.approx(1e4)
    assert out["checkpoint_stall_s"] == pytest.approx(1.0)
    assert out["restart_s"] == pytest.approx(100.0)
    # Young: sqrt(2 x 1 x 1e4) = 141.42 s; the interval used: sqrt(1 + 2 x 1 x (1e4 - 100)) - 1 = 139.71 s
    assert out["young_interval_s"] == pytest.approx(math.sqrt(2e4))
    tau = math.sqrt(1 + 2 * 9900) - 1
    assert tau == pytest.approx(139.71, abs=0.01)
    assert out["interval_s"] == pytest.approx(tau)
    # g = (1 - (R + tau/2) / M) / (1 + C / tau) = (1 - (100 + 69.86) / 1e4) / (1 + 1 / 139.71) = 0.98301 / 1.00716
    g = (1 - (100 + tau / 2) / 1e4) / (1 + 1 / tau)
    assert g == pytest.approx(0.97603, abs=1e-5)
    assert out["goodput"] == pytest.approx(g)
    assert out["wall_s"] == pytest.approx(1e6 / g)
    # the wall time is the productive time, the stalls and, per failure, the restart and half an interval
    parts = 1e6 + out["checkpoint_time_s"] + out["restart_time_s"] + out["lost_work_s"]
    assert parts == pytest.approx(out["wall_s"])
    assert out["checkpoint_time_s"] == pytest.approx(1e6 / tau)
    assert out["failures"] == pytest.approx(out["wall_s"] / 1e4)
    assert out["lost_work_s"] == pytest.approx(out["failures"] * tau / 2)


def test_the_best_interval_maximises_goodput_and_young_is_close():
    """best_interval_s is where the goodput peaks (a scan finds the same); Young's sqrt(2 C M) is within a few
    per cent of it while C and R are small against M, and costs almost nothing in goodput."""
    stall, restart, mtbf = 30.0, 600.0, 5e4
    best = float(goodput.best_interval_s(stall, mtbf, restart))
    young = float(goodput.young_interval_s(stall, mtbf))
    scan = np.linspace(best * 0.3, best * 3, 20001)
    g = goodput.goodput_fraction(scan, stall, restart, mtbf)
    assert scan[int(np.argmax(g))] == pytest.approx(best, rel=1e-3)
    assert young == pytest.approx(math.sqrt(2 * 30 * 5e4)) and young == pytest.approx(best, rel=0.05)
    at_best, at_young = (float(goodput.goodput_fraction(t, stall, restart, mtbf)) for t in (best, young))
    assert at_best >= at_young > at_best - 1e-4


def test_async_checkpoints_stall_for_the_host_copy_only():
    sync = goodput.Reliability(storage_bandwidth=1e8)
    asyn = goodput.Reliability(storage_bandwidth=1e8, checkpoint="async", host_bandwidth=2e10)
    a, b = goodput.run(sync, 512, 7e10, 1e6), goodput.run(asyn, 512, 7e10, 1e6)
    # 7e10 x 14 B / 512 devices = 1.914e9 B per device: sync at 1e8 B/s, async at 2e10 B/s
    assert a["checkpoint_stall_s"] == pytest.approx(7e10 * 14 / 512 / 1e8)
    assert b["checkpoint_stall_s"] == pytest.approx(7e10 * 14 / 512 / 2e10)
    assert b["checkpoint_write_s"] == a["checkpoint_write_s"]       # the re-load still reads at storage speed
    assert b["goodput"] > a["goodput"]
    assert b["interval_s"] >= b["checkpoint_write_s"]               # one async write ends before the next
    fast = goodput.run(goodput.Reliability(checkpoint="async", host_bandwidth=1e12, storage_bandwidth=1e7), 512, 7e10,
                       1e6)                                          # the best interval (37 s) < the write (191 s)
    assert fast["interval_s"] == pytest.approx(fast["checkpoint_write_s"])


def test_more_devices_fail_more_often():
    rel = goodput.Reliability()
    g = goodput.run(rel, np.array([64, 1024, 16384, 131072]), 4.05e11, 1e6)["goodput"]
    assert np.all(np.diff(g) < 0)
    assert 0.85 < g[2] < 0.95          # Llama 3 reports > 90 % effective training time on 16K GPUs


def test_failures_faster_than_the_work_never_finish():
    rel = goodput.Reliability(mtbf_s=600.0 * 1000, restart_s=1200.0)     # job MTBF 600 s < the restart
    out = goodput.run(rel, 1000, 1e9, 1e6)
    assert out["goodput"] == 0 and math.isinf(out["wall_s"])


def test_goodput_off_is_a_perfect_run():
    out = goodput.run(goodput.Reliability(enabled=False), 16384, 4e11, 1e6)
    assert out["goodput"] == 1 and out["wall_s"] == 1e6 and out["lost_work_s"] == 0


def test_energy_charges_stalls_and_restarts_at_the_idle_draw():
    cluster = apply_overrides(load_cluster("dgx-h100"), {"rent": "2 USD/h", "pue": 1.5, "node_power": "1000 W",
                                                         "switch_power": "50 W", "mtbf": "10000 h"})
    r = economics.rates(cluster, 16)
    cols, lost = economics.training_parts(r, np.array([10.0]), np.array([1e5]), {"compute": np.array([10.0])},
                                          1e11, np.array([8e9]))
    busy = 1.5 * (16 * (700 + 50) + 2 * 1000)           # all compute-bound
    idle = 1.5 * (16 * (70 + 50) + 2 * 1000)            # idle: 0.1 x TDP
    steps, redone = 1e6, lost["lost_work_s"][0]
    stalls = lost["checkpoint_time_s"][0] + lost["restart_time_s"][0]
    assert cols["energy_j"][0] == pytest.approx(busy * (steps + redone) + idle * stalls)
    assert cols["time_to_train_s"][0] == pytest.approx(steps + redone + stalls)
    assert cols["device_time_s"][0] == pytest.approx(16 * cols["time_to_train_s"][0])
    assert cols["training_cost_rent_usd"][0] == pytest.approx(cols["device_time_s"][0] / HOUR * 2)


def test_settings_through_set_the_api_and_a_cluster_file(capsys, tmp_path):
    base = comet_dse.estimate("llama3-8b", "dgx-h100", 64, tp=2, global_batch=512, tokens="1T").training
    worse = comet_dse.estimate("llama3-8b", "dgx-h100", 64, tp=2, global_batch=512, tokens="1T",
                               overrides={"mtbf": "500 h", "restart_time": "1 h"}).training
    assert worse["goodput"] < base["goodput"]
    assert worse["goodput_terms"]["mtbf_s"] == pytest.approx(500 * HOUR / 64)
    fixed = comet_dse.estimate("llama3-8b", "dgx-h100", 64, tp=2, global_batch=512, tokens="1T",
                               overrides={"checkpoint_interval": "2 h", "checkpoint": "async"}).training
    assert fixed["goodput_terms"]["interval_s"] == 2 * HOUR and fixed["goodput_terms"]["checkpoint"] == "async"
    code, out, err = run(capsys, "estimate", *SMALL, "--tp", "2", "--tokens", "1T", "--set", "goodput=off", "--json")
    assert code == 0, err
    t = json.loads(out)["training"]
    assert t["goodput"] == 1 and t["time_to_train_s"] == t["productive_time_s"]
    one_line_error(run(capsys, "estimate", *SMALL, "--tp", "2", "--tokens", "1T", "--set", "checkpoint=lazy"),
                   "checkpoint", "sync, async")
    one_line_error(run(capsys, "estimate", *SMALL, "--tp", "2", "--tokens", "1T", "--set", "mtbf=1s"), "mtbf")
    source = tmp_path / "c.yaml"
    import yaml
    from importlib import resources
    data = yaml.safe_load(resources.files("comet_dse").joinpath("presets", "clusters", "dgx-h100.yaml").read_text())
    data.setdefault("economics", {}).update({"mtbf": "20000 h", "checkpoint": "async"})
    source.write_text(yaml.safe_dump(data))
    t = comet_dse.estimate("llama3-8b", str(source), 64, tp=2, global_batch=512, tokens="1T").training
    assert t["goodput_terms"]["mtbf_per_device_s"] == 20000 * HOUR and t["goodput_terms"]["checkpoint"] == "async"


def test_estimate_prints_goodput_as_its_own_line(capsys):
    code, out, err = run(capsys, "estimate", *SMALL, "--tp", "2", "--tokens", "1T")
    assert code == 0, err
    assert "of which steps" in out and "goodput" in out and "Young's optimum" in out and "failures" in out


# ---- the error band in every derived figure --------------------------------------------------------------------

def test_band_range_is_the_measured_step_time_the_band_allows():
    band = {"low": -0.2, "high": 0.05}
    # predicted = measured x (1 + e): an estimate 20 % low means the real figure is value / 0.8
    assert band_range(100.0, band) == pytest.approx([100 / 1.05, 100 / 0.8])
    assert band_range(100.0, {"low": None, "high": None}) is None
    assert band_range(float("nan"), band) is None


def test_every_derived_figure_takes_the_band_and_ranges_are_ordered():
    est = comet_dse.estimate("llama3-405b", "dgx-h100", 1024, tp=8, pp=16, global_batch=1024, zero=1,
                             pipeline_split="embedding-loss", tokens="15T")
    t, band = est.training, est.error_band
    assert band["validated"]
    for key in ("time_to_train_s", "device_time_s", "energy_j", "training_cost_usd", "training_cost_rent_usd",
                "training_cost_own_usd", "productive_time_s"):
        low, high = t[f"{key}_range"]
        assert low <= t[key] <= high
        model = t[f"{key}_modelled"]
        assert low == pytest.approx(model / (1 + band["high"])) and high == pytest.approx(model / (1 + band["low"]))
    data = json.loads(json.dumps(est.to_dict()))
    assert len(data["training"]["time_to_train_s_range"]) == 2


def test_ranges_grow_monotonically_with_the_band():
    t = {"time_to_train_s": 100.0, "device_time_s": 1e4, "energy_j": 5.0, "training_cost_usd": 7.0}
    narrow = with_ranges(t, {"low": -0.1, "high": 0.0})
    wide = with_ranges(t, {"low": -0.3, "high": 0.1})
    for key in t:
        assert wide[f"{key}_range"][0] <= narrow[f"{key}_range"][0] <= t[key]
        assert wide[f"{key}_range"][1] >= narrow[f"{key}_range"][1] >= t[key]


def test_an_unvalidated_accelerator_has_an_assumed_range_that_never_flatters():
    """No published MI300X run: the range is the span of every validated dense family widened by the assumption
    margins, marked assumed, and at least as wide as a validated H100's."""
    est = comet_dse.estimate("llama3-8b", "mi300x", 64, tp=1, global_batch=512, tokens="1T")
    band = est.error_band
    assert not band["validated"] and band["assumed"] and "assumed" in band["text"]
    low, high = est.training["time_to_train_s_range"]
    assert low <= est.training["time_to_train_s"] <= high
    h100 = comet_dse.estimate("llama3-8b", "dgx-h100", 64, tp=1, global_batch=512, tokens="1T").error_band
    assert band["low"] <= h100["low"] and band["high"] >= h100["high"]


# ---- whatif: the baseline's training figures; scale-downs read as savings ----------------------------------------

def test_whatif_json_has_the_baselines_time_to_train_and_cost(capsys):
    code, out, err = run(capsys, "whatif", *SMALL, "--resources", "hbm_capacity", "--scale", "0.5,2", "--no-fit",
                         "--tokens", "1T", "--json")
    assert code == 0, err
    data = json.loads(out)
    t = data["baseline"]["training"]
    assert data["training"] == t
    assert t is not None and t["time_to_train_s"] > t["productive_time_s"] > 0 and t["training_cost_usd"] > 0
    low, high = t["time_to_train_s_range"]
    assert low <= high and t["training_cost_usd_range"][0] <= t["training_cost_usd_range"][1]
    down = next(c for c in data["cells"] if c["factor"] == 0.5)
    up = next(c for c in data["cells"] if c["factor"] == 2)
    # a scale-down that saves money is never a "gain per added dollar"; its saving per 1 % slower is positive
    assert down["added_usd"] < 0 and down["speedup_per_musd"] is None
    assert down["speedup"] < 1 and down["usd_saved_per_slowdown_pct"] == pytest.approx(
        -down["added_usd"] / (100 * (1 - down["speedup"])))
    assert up["added_usd"] > 0 and up["usd_saved_per_slowdown_pct"] is None
    assert up["speedup_per_musd"] == pytest.approx((up["speedup"] - 1) / (up["added_usd"] / 1e6))
    code, out, err = run(capsys, "whatif", *SMALL, "--resources", "hbm_capacity", "--scale", "0.5", "--no-fit",
                         "--tokens", "1T")
    assert code == 0, err
    assert "As it is:" in out and "time to train" in out.split("Speedup of the best")[0]


def test_per_added_and_per_saved_keep_the_sign():
    from comet_dse.answers.whatif import per_added, per_saved

    assert per_added(0.88, -80_000, 1e6) is None                  # a slowdown that saves: not per added
    assert per_saved(0.88, -80_000) == pytest.approx(80_000 / 12)  # $6,667 saved per 1 % slower
    assert per_added(1.10, 100_000, 1e6) == pytest.approx(1.0)
    assert per_saved(1.10, 100_000) is None
    assert math.isinf(per_saved(1.0, -5_000))                      # cheaper and no slower
    assert per_added(1.1, 0.0, 1e6) is None and per_saved(0.9, 0.0) is None


# ---- one cost basis per table --------------------------------------------------------------------------------------

def test_a_table_across_clusters_costs_on_one_basis(tmp_path):
    """dgx-h100 (a rent) is the baseline: the table is on renting, and dgx-h200 (no rent, an owning figure)
    shows unknown there, never its owning cost."""
    study = tmp_path / "two.yaml"
    study.write_text(
        "name: two\nmodels: [llama3-8b]\nclusters: [dgx-h100, dgx-h200]\ndevices: 72\nglobal_batch: 72\n"
        "token_budget: 1T\nbaseline: {cluster: dgx-h100}\naxes: {}\nstrategy: {tp: [1], pp: [1], zero: [1]}\n")
    result = comet_dse.sweep(study)
    ranking = result.ranking
    assert ranking["cost_basis"] == "rent"
    by_label = {g["label"]: g for g in ranking["variants"]}
    h100 = next(g for label, g in by_label.items() if "dgx-h100" in label)["best"]
    gb200 = next(g for label, g in by_label.items() if "h200" in label)["best"]
    assert h100["training_cost_usd"] == pytest.approx(h100["training_cost_rent_usd"])
    assert gb200["training_cost_rent_usd"] is None and gb200["training_cost_usd"] is None
    assert gb200["training_cost_own_usd"] is not None          # it has a figure, of the other basis: not shown
    from comet_dse.cli.render import render_sweep

    text = render_sweep(ranking, 1.0)
    assert "cost (renting)" in text and "unknown" in text


def test_search_states_its_cost_basis(capsys):
    code, out, err = run(capsys, "search", *SMALL, "--tp", "2", "--tokens", "1T", "--top", "2")
    assert code == 0, err
    assert "cost (renting)" in out.split("The fastest strategy in detail")[0]
    code, out, err = run(capsys, "search", *SMALL, "--tp", "2", "--tokens", "1T", "--top", "2", "--set", "cost_basis=own")
    assert code == 0, err
    assert "cost (owning)" in out.split("The fastest strategy in detail")[0]


def test_goodput_options_are_the_set_of_the_same_name(capsys):
    code, out, err = run(capsys, "estimate", *SMALL, "--tp", "2", "--tokens", "1T", "--mtbf", "5000h",
                         "--checkpoint", "async", "--restart-time", "20min", "--json")
    assert code == 0, err
    g = json.loads(out)["training"]["goodput_terms"]
    assert g["mtbf_per_device_s"] == 5000 * HOUR and g["checkpoint"] == "async" and g["restart_time_setting_s"] == 1200
    code, out, err = run(capsys, "estimate", *SMALL, "--tp", "2", "--tokens", "1T", "--goodput", "off", "--json")
    assert code == 0, err
    assert json.loads(out)["training"]["goodput"] == 1
    one_line_error(run(capsys, "search", *SMALL, "--tokens", "1T", "--mtbf", "1s"), "mtbf")
