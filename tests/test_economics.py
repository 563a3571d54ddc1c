"""Days, megawatt-hours and dollars (docs/economics.md): time to train, device time, energy and cost of a token
budget, prices and power that follow the design, per-dollar what-ifs, unknown figures and bad input."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

import comet_dse
from comet_dse.answers.overrides import apply_overrides
from comet_dse.base import vocabulary as voc
from comet_dse.base.errors import InputError
from comet_dse.base.units import KIND_BANDWIDTH, KIND_BYTES, KIND_TOKENS, parse_per_unit, parse_quantity
from comet_dse.design_space.rank import pareto
from comet_dse.presets.catalog import load_cluster
from comet_dse.whole_run import economics
from cli_run import one_line_error, run

ROOT = Path(__file__).resolve().parents[1]
GiB, HOUR, YEAR = 2.0**30, 3600.0, 365.25 * 86400.0
# A small, fast question: Llama 3 8B on 64 H100s (15,000 strategies).
SMALL = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "64", "--global-batch", "512"]


# ---- one configuration, by hand -----------------------------------------------------------------------------------

def _hand_cluster(goodput: str = "off"):
    """dgx-h100 (700 W TDP, $25,000) with round figures for everything else; a perfect run (every step
    trains) unless ``goodput`` is on (tests/test_goodput.py checks that part)."""
    return apply_overrides(load_cluster("dgx-h100"), {
        "rent": "2 USD/h", "pue": 1.5, "node_power": "1000 W", "switch_power": "50 W",
        "energy_price": "0.1 USD/kWh", "lifetime": "4 years", "goodput": goodput})


def test_time_energy_and_cost_of_one_configuration_by_hand():
    cluster = _hand_cluster()
    r = economics.rates(cluster, 16)                    # 16 devices, 8 per node: 2 nodes
    # a 10 s step: 5 s compute-bound, 2 s memory-bound, 1 s exposed TP comm, 2 s pipeline bubble; 1e5 tokens/s
    breakdown = {"compute": np.array([5.0]), "memory": np.array([2.0]), "tp_communication": np.array([1.0]),
                 "pipeline_bubble": np.array([2.0])}
    cols = economics.training(r, np.array([10.0]), np.array([1e5]), breakdown, tokens=1e11, parameters=8e9)
    # time to train: 1e11 tokens / 1e5 tokens/s = 1e6 s; device time: 16 x 1e6 = 1.6e7 s = 4,444.4 device-hours
    assert cols["time_to_train_s"][0] == pytest.approx(1e6)
    assert cols["device_time_s"][0] == pytest.approx(1.6e7)
    # draws (defaults x TDP 700 W): compute 700, memory 0.6 x 700 = 420, network 0.4 x 700 = 280, idle 0.1 x 700 = 70
    # fractions: compute 5/10, memory 2/10, network 1/10, idle 2/10
    # device: 700 x 0.5 + 420 x 0.2 + 280 x 0.1 + 70 x 0.2 = 350 + 84 + 28 + 14 = 476 W
    # cluster: PUE 1.5 x (16 x (476 + 50 switch share) + 2 nodes x 1,000) = 1.5 x (8,416 + 2,000) = 15,624 W
    assert cols["average_power_w"][0] == pytest.approx(15_624.0)
    # energy: 15,624 W x 1e6 s = 1.5624e10 J = 4,340 kWh
    assert cols["energy_j"][0] == pytest.approx(1.5624e10)
    # owning: 16 x $25,000 x 1e6 s / (4 x 365.25 x 86,400 s) + 4,340 kWh x $0.1 = $3,168.81 + $434.00
    own = 16 * 25_000 * 1e6 / (4 * 365.25 * 86_400) + 4_340 * 0.1
    assert own == pytest.approx(3_602.81, abs=0.01)
    assert cols["training_cost_own_usd"][0] == pytest.approx(own)
    # renting: 4,444.44 device-hours x $2 = $8,888.89; a rent is given, so that is the cost
    assert cols["training_cost_rent_usd"][0] == pytest.approx(1.6e7 / 3600 * 2)
    assert cols["training_cost_usd"][0] == pytest.approx(8_888.89, abs=0.01)


def test_owning_is_the_cost_with_cost_basis_own():
    cluster = apply_overrides(_hand_cluster(), {"cost_basis": "own"})
    r = economics.rates(cluster, 16)
    cols = economics.training(r, np.array([10.0]), np.array([1e5]), {"compute": np.array([10.0])}, 1e11, 8e9)
    # all compute-bound: 1.5 x (16 x (700 + 50) + 2 x 1,000) = 21,000 W over 1e6 s = 2.1e10 J = 5,833.3 kWh
    assert cols["energy_j"][0] == pytest.approx(2.1e10)
    assert cols["training_cost_usd"][0] == pytest.approx(16 * 25_000 * 1e6 / (4 * YEAR) + 2.1e10 / 3.6e6 * 0.1)


def test_estimate_training_is_the_token_budget_over_the_throughput():
    est = comet_dse.estimate("llama3-8b", "dgx-h100", 64, tp=2, global_batch=512, tokens="1T")
    t = est.training
    assert t["productive_time_s_modelled"] == pytest.approx(1e12 / est.tokens_per_second, rel=1e-12)
    assert t["time_to_train_s"] == pytest.approx(t["productive_time_s"] / t["goodput"], rel=1e-12)
    assert 0 < t["goodput"] < 1
    assert t["device_time_s"] == pytest.approx(64 * t["time_to_train_s"], rel=1e-12)
    # the headline is the band's expected value: the model's figure over 1 + the band's mean error, in its range
    mean = est.error_band["mean_error"]
    assert t["headline"] == "expected" and t["band_mean_error"] == mean
    assert t["time_to_train_s"] == pytest.approx(t["time_to_train_s_modelled"] / (1 + mean), rel=1e-12)
    low, high = t["time_to_train_s_range"]
    assert low <= t["time_to_train_s"] <= high
    assert t["training_cost_rent_usd"] == pytest.approx(t["device_time_s"] / HOUR * 2.99, rel=1e-12)   # the preset rent
    assert t["energy_j"] == pytest.approx(t["average_power_w"] * t["time_to_train_s"], rel=1e-12)
    assert t["energy_excludes"] == ["network switches"]      # dgx-h100 has a node figure, no switch figure
    row = est.to_arrow().to_pylist()[0]
    assert row["tokens"] == 1e12 and row["energy_j"] == pytest.approx(t["energy_j"])


def test_estimate_tokens_prints_days_device_hours_energy_and_cost(capsys):
    code, out, err = run(capsys, "estimate", *SMALL, "--tp", "2", "--tokens", "1T")
    assert code == 0, err
    for label in ("time to train", "device-hours", "energy", "cost"):
        assert any(line.strip().startswith(label) for line in out.splitlines()), label
    assert " days" in out and " MWh" in out and "$" in out and "2.99 USD/h" in out
    code, out, err = run(capsys, "estimate", *SMALL, "--tp", "2", "--tokens", "1T", "--json")
    training = json.loads(out)["training"]
    assert set(economics.COLUMNS) <= set(training) and training["tokens"] == 1e12
    code, out, err = run(capsys, "estimate", *SMALL, "--tp", "2", "--json")
    assert json.loads(out)["training"] is None                # no budget, no training figures


# ---- unknown stays unknown ----------------------------------------------------------------------------------------

def test_a_cluster_without_a_power_figure_has_unknown_energy_never_zero(capsys):
    code, out, err = run(capsys, "estimate", "--model", "llama3-8b", "--cluster", "tpu-v5p", "--devices", "64",
                         "--global-batch", "512", "--tp", "2", "--tokens", "1T", "--json")
    assert code == 0, err
    t = json.loads(out)["training"]                            # strict JSON: null, not NaN
    assert t["energy_j"] is None and t["average_power_w"] is None and t["training_cost_own_usd"] is None
    assert t["device_price_usd"] is None and t["device_power_w"]["compute"] is None
    assert t["training_cost_usd"] == pytest.approx(t["device_time_s"] / HOUR * 4.20)    # its rent is known
    code, out, err = run(capsys, "estimate", "--model", "llama3-8b", "--cluster", "tpu-v5p", "--devices", "64",
                         "--global-batch", "512", "--tp", "2", "--tokens", "1T")
    energy = next(line for line in out.splitlines() if line.strip().startswith("energy"))
    assert energy.split()[-1] == "unknown"


def test_search_columns_hold_nan_where_unknown_and_the_table_says_unknown(capsys):
    result = comet_dse.search("llama3-8b", "mi300x", 64, 512, tp=[2], tokens="1T")
    cols = result.result.columns
    ranked = result.result.ranked
    assert np.all(np.isnan(cols["training_cost_rent_usd"]))     # mi300x: no rent figure, so renting is unknown...
    assert np.all(np.isfinite(cols["energy_j"][ranked]))         # ... its energy (750 W TDP) and owning ($10k) are
    assert np.array_equal(cols["training_cost_usd"][ranked], cols["training_cost_own_usd"][ranked])   # basis: own
    assert np.all(np.isfinite(cols["training_cost_usd"][ranked]))
    code, out, err = run(capsys, "search", "--model", "llama3-8b", "--cluster", "tpu-v5p", "--devices", "64",
                         "--global-batch", "512", "--tp", "2", "--top", "1", "--tokens", "1T")
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert "time to train" in header and "energy" in header
    first = next(line for line in out.splitlines() if line.strip().startswith("1 "))
    assert "unknown" in first                                  # the energy column of a TPU v5p


# ---- prices and power that follow the design ----------------------------------------------------------------------

def test_price_and_power_follow_the_scaled_resource():
    h100 = load_cluster("dgx-h100")                            # 15 USD/GiB of HBM, 31 W per TB/s of HBM bandwidth
    more = apply_overrides(h100, {"hbm_capacity": "x2", "hbm_bandwidth": "x2"})
    # 80 GiB more HBM at 15 USD/GiB: +$1,200 per device
    assert economics.device_price(more) - economics.device_price(h100) == pytest.approx(80 * 15)
    # 3.35 TB/s more at 31 W per TB/s: +103.85 W in the memory-bound draw, none in the compute-bound one
    draws, before = economics.device_draws(more), economics.device_draws(h100)
    assert draws["memory"] - before["memory"] == pytest.approx(3.35 * 31)
    assert draws["compute"] == before["compute"] == 700
    r0, r1 = economics.rates(h100, 64), economics.rates(more, 64)
    assert r1.cluster_price_usd - r0.cluster_price_usd == pytest.approx(64 * 1200)
    assert r1.rated_power_w - r0.rated_power_w == pytest.approx(1.2 * 64 * 3.35 * 31)    # PUE 1.2
    # a rent grows by the added price spread over the lifetime: $1,200 / 5 years per device-second
    assert r1.price_delta_usd / r1.lifetime_s == pytest.approx(1200 / (5 * YEAR))


@pytest.fixture(scope="module")
def hbm_study(tmp_path_factory):
    """HBM capacity x bandwidth (x1, x2) of 64 H100s, llama3-8b, 1T tokens: its ranking and table."""
    folder = tmp_path_factory.mktemp("study")
    (folder / "hbm.yaml").write_text(yaml.safe_dump({
        "name": "hbm", "models": ["llama3-8b"], "cluster": "dgx-h100", "devices": 64, "global_batch": 512,
        "axes": {"hbm_capacity": {"scale": [1.0, 2.0]}, "hbm_bandwidth": {"scale": [1.0, 2.0]}},
        "token_budget": "1T", "strategy": {"zero": [1]}, "figures": ["pareto"]}, sort_keys=False))
    return comet_dse.sweep(folder / "hbm.yaml")


def test_a_hbm_capacity_and_bandwidth_study_has_a_pareto_front_of_several_designs(hbm_study):
    ranking = hbm_study.ranking
    price = ranking["pareto_cost"]
    power = ranking["pareto_power"]
    assert len(price) > 1 and len(power) > 1
    assert len({p["cost_usd"] for p in price}) == len(price) and len({p["power_w"] for p in power}) == len(power)
    best = {g["label"]: g["best"] for g in ranking["variants"]}
    base = best["hbm_capacity=x1, hbm_bandwidth=x1"]
    assert best["hbm_capacity=x2, hbm_bandwidth=x1"]["cost_usd"] - base["cost_usd"] == pytest.approx(64 * 80 * 15)
    assert best["hbm_capacity=x1, hbm_bandwidth=x2"]["power_w"] - base["power_w"] == pytest.approx(1.2 * 64 * 3.35 * 31)
    table = hbm_study.table
    for column in ("time_to_train_s", "energy_j", "training_cost_usd", "cost_usd", "power_w"):
        assert column in table.column_names
    assert len(set(table.column("cost_usd").to_pylist())) == 2 and len(set(table.column("power_w").to_pylist())) == 2
    # with a token budget the fronts of training cost and energy exist too (one design each here: faster is cheaper)
    assert ranking["pareto_training_cost"] and ranking["pareto_energy"]


def _study(tmp_path, axes: dict) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "models": ["llama3-8b"], "cluster": "dgx-h100", "devices": 64,
                                    "global_batch": 512, "axes": axes, "token_budget": "1T",
                                    "strategy": {"zero": [1], "tp": [2]}}, sort_keys=False))
    return path


def test_a_study_axis_sets_a_price_and_the_cost_follows_it(tmp_path):
    table = comet_dse.sweep(_study(tmp_path, {"rent": ["2 USD/h", "4 USD/h"]})).table
    variant = np.asarray(table.column("variant"))
    rent = np.asarray(table.column("training_cost_rent_usd"))
    device_time = np.asarray(table.column("device_time_s"))
    for v, price in ((0, 2.0), (1, 4.0)):
        ok = (variant == v) & np.isfinite(rent)
        assert ok.any() and np.allclose(rent[ok], device_time[ok] / 3600 * price)
    with pytest.raises(InputError, match="axes.pue.values"):
        comet_dse.sweep(_study(tmp_path, {"pue": [0.5]}))


def test_the_training_cost_front_holds_several_designs_when_a_resource_is_dear():
    rows = [{"model": "m", "devices": 8, "variant": i, "label": str(i),
             "best": {"tokens_per_second": tps, "step_time_s": 1.0, "training_cost_usd": cost}}
            for i, (tps, cost) in enumerate([(1.0, 10.0), (2.0, 15.0), (1.5, 20.0), (0.5, 9.0)])]
    front = pareto(rows, "training_cost_usd", 100.0)
    # (time, cost): 100 s $10, 50 s $15, 66.7 s $20 (dominated by 50 s $15), 200 s $9
    assert [p["variant"] for p in front] == [3, 0, 1]
    assert [p["time_s"] for p in front] == [200.0, 100.0, 50.0]


# ---- whatif per dollar and per watt -------------------------------------------------------------------------------

def test_whatif_ranks_by_speedup_per_added_dollar_and_watt(capsys):
    result = comet_dse.whatif("llama3-8b", "dgx-h100", 64, 512, resources=["hbm_capacity", "hbm_bandwidth", "peak_flops"],
                              factors=(2,), capacity=None, tokens="1T")
    cells = {c.resource: c for c in result.cells}
    cap, bw, flops = cells["hbm_capacity"], cells["hbm_bandwidth"], cells["peak_flops"]
    assert cap.added_usd == pytest.approx(64 * 80 * 15)          # 80 GiB more at 15 USD/GiB on 64 devices
    assert cap.speedup_per_musd == pytest.approx((cap.speedup - 1) / (64 * 80 * 15 / 1e6))
    assert bw.added_usd is None and bw.speedup_per_musd is None  # no per-unit price: unpriced, not free
    assert bw.added_w == pytest.approx(1.2 * 64 * 3.35 * 31)
    assert bw.speedup_per_kw == pytest.approx((bw.speedup - 1) / (bw.added_w / 1e3))
    assert flops.added_usd is None and flops.added_w is None and flops.speedup_per_kw is None
    from comet_dse.whole_run import goodput
    steps = 1e12 / (512 * 8192) * cap.step_time_s             # productive time; then the goodput of 64 devices
    wall = goodput.run(goodput.Reliability(), 64, comet_dse.load_model("llama3-8b").total_params(), steps)["wall_s"]
    mean = result.baseline.training["band_mean_error"]              # the cell's figures: the band's expected values
    assert cap.training_cost_usd is not None and cap.time_to_train_s == pytest.approx(float(wall) / (1 + mean))
    code, out, err = run(capsys, "whatif", *SMALL, "--resources", "hbm_capacity,hbm_bandwidth", "--scale", "2",
                         "--no-fit", "--tokens", "1T", "--json")
    assert code == 0, err
    cells = json.loads(out)["cells"]
    assert {"added_usd", "added_w", "speedup_per_musd", "speedup_per_kw", "training_cost_usd"} <= set(cells[0])
    by = {c["resource"]: c for c in cells}
    assert by["hbm_bandwidth"]["speedup_per_musd"] is None and by["hbm_capacity"]["speedup_per_musd"] > 0
    code, out, err = run(capsys, "whatif", *SMALL, "--resources", "hbm_capacity,hbm_bandwidth", "--scale", "2",
                         "--no-fit")
    assert voc.training_label("speedup_per_musd") in out and voc.training_label("speedup_per_kw") in out


# ---- bad values: one line, exit 2 ---------------------------------------------------------------------------------

@pytest.mark.parametrize("setting, needle", [
    ("pue=0.9", "--set pue: '0.9' is outside the plausible range [1, 3]"),
    ("rent=-2USD/h", "--set rent: cannot read '-2USD/h'"),
    ("energy_price=0.08", "needs a unit, like '0.08 USD/kWh'"),
    ("lifetime=10s", "--set lifetime"),
    ("unit_price.hbm_capacity=-1USD/GiB", "--set unit_price.hbm_capacity: cannot read"),
    ("unit_price.hbm_capacity=1W/GiB", "--set unit_price.hbm_capacity: cannot read"),
    ("cost_basis=lease", "--set cost_basis: must be one of rent, own"),
    ("switch_power=x2", "has no switch_power to scale"),
])
def test_bad_power_and_price_settings_are_one_line_errors(capsys, setting, needle):
    one_line_error(run(capsys, "estimate", *SMALL, "--tp", "2", "--set", setting), needle)


@pytest.mark.parametrize("tokens, needle", [("0", "outside the plausible range"), ("15X", "is not a tokens unit"),
                                            ("2e18", "outside the plausible range"), ("many", "cannot read")])
def test_bad_token_budgets_are_one_line_errors(capsys, tokens, needle):
    one_line_error(run(capsys, "estimate", *SMALL, "--tp", "2", f"--tokens={tokens}"), needle)
    with pytest.raises(InputError):
        comet_dse.estimate("llama3-8b", "dgx-h100", 64, tp=2, global_batch=512, tokens=tokens)


def _h100_file(tmp_path, economics_block: dict) -> Path:
    data = yaml.safe_load((ROOT / "src/comet_dse/presets/clusters/dgx-h100.yaml").read_text())
    data["economics"] = economics_block
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("block, needle", [
    ({"pue": 0.5}, "cluster.economics.pue: 0.5 is outside"),
    ({"rent": "-1 USD/h"}, "cluster.economics.rent: cannot read"),
    ({"node_power": "-5 kW"}, "cluster.economics.node_power: cannot read"),
    ({"unit_price": {"dram": "1 USD/GiB"}}, "not a resource with a per-unit figure"),
    ({"pue": 1.2, "cooling": 3}, "cluster.economics.cooling: unknown field"),
])
def test_bad_economics_in_a_cluster_file_are_one_line_errors(capsys, tmp_path, block, needle):
    path = _h100_file(tmp_path, block)
    one_line_error(run(capsys, "estimate", "--model", "llama3-8b", "--cluster", path, "--devices", "64",
                       "--global-batch", "512", "--tp", "2"), needle)


def test_a_price_the_per_unit_model_would_make_negative_is_unknown():
    dear = apply_overrides(load_cluster("dgx-h100"), {"unit_price.hbm_capacity": "400 USD/GiB"})
    # at x0.1 the HBM is 8 GiB, 72 GiB less: 25,000 - 400 x 72 = -3,800 USD, no price; at x0.5: 25,000 - 400 x 40
    small = apply_overrides(dear, {"hbm_capacity": "x0.1"})
    assert economics.price_delta(small) == pytest.approx(-400 * 72)
    assert math.isnan(economics.device_price(small))             # no negative price: unknown
    assert economics.device_price(apply_overrides(dear, {"hbm_capacity": "x0.5"})) == pytest.approx(25_000 - 400 * 40)


def test_a_cluster_file_economics_block_is_read_with_units(tmp_path):
    path = _h100_file(tmp_path, {"rent": "3 USD/h", "pue": 1.1, "node_power": "2 kW", "lifetime": "4 years",
                                 "energy_price": "0.12 USD/kWh", "cost_basis": "own",
                                 "unit_price": {"hbm_bandwidth": "100 USD/(TB/s)"}})
    econ = comet_dse.load_cluster(str(path)).economics
    assert econ.rent_usd_per_s == pytest.approx(3 / 3600) and econ.pue == 1.1 and econ.node_power_w == 2000
    assert econ.lifetime_s == pytest.approx(4 * YEAR) and econ.energy_price_usd_per_j == pytest.approx(0.12 / 3.6e6)
    assert econ.cost_basis == "own" and econ.unit_price["hbm_bandwidth"] == pytest.approx(100 / 1e12)
    assert econ.reference == {"hbm_bandwidth": 3.35e12}


# ---- units, vocabulary, explorer ----------------------------------------------------------------------------------

def test_token_counts_and_per_unit_figures_parse_with_their_prefixes():
    assert parse_quantity("15T", KIND_TOKENS, "t") == 15e12
    assert parse_quantity("500G", KIND_TOKENS, "t") == 5e11
    assert parse_quantity("2.5e12", KIND_TOKENS, "t") == 2.5e12
    assert parse_per_unit("15 USD/GiB", "USD", KIND_BYTES, "p") == pytest.approx(15 / GiB)
    assert parse_per_unit("31 W/(TB/s)", "W", KIND_BANDWIDTH, "p") == pytest.approx(31e-12)
    with pytest.raises(InputError):
        parse_per_unit("15 USD/TB/s", "USD", KIND_BYTES, "p")       # a bandwidth unit for a capacity


def test_every_training_quantity_is_documented_with_its_label_and_units():
    text = (ROOT / "docs" / "vocabulary.md").read_text()
    for q in voc.TRAINING:
        assert f"| `{q.key}` | {q.label} | {q.si_unit} | {q.unit} |" in text, q.key
    assert set(economics.COLUMNS) <= set(voc.TRAINING_QUANTITY)


def test_the_explorer_takes_a_token_budget_and_shows_time_and_cost():
    pytest.importorskip("dash")
    from comet_dse.web.app import _training, controls_from
    from comet_dse.web.view import compute

    controls = controls_from("llama3-8b", "", "dgx-h100", 64, 512, 1, [], [], "1T")
    assert controls.tokens == 1e12
    assert controls_from("llama3-8b", "", "dgx-h100", 64, 512, 1, [], [], " ").tokens is None
    with pytest.raises(InputError):
        controls_from("llama3-8b", "", "dgx-h100", 64, 512, 1, [], [], "-3T")
    view = compute(controls)
    shown = str(_training(view))
    assert "time-to-train" in shown and "training-cost" in shown and "days" in shown and "$" in shown
    assert math.isclose(view.chosen["training"]["productive_time_s_modelled"], 1e12 / view.top[0]["tokens_per_second"],
                        rel_tol=1e-9)


def test_the_explorer_places_each_design_it_evaluates_on_a_price_front():
    """As it is and HBM capacity doubled (the one resource of dgx-h100 with a per-unit price): the doubled
    design costs devices x 80 GiB x the price per GiB more; designs without a per-unit price are not placed."""
    pytest.importorskip("dash")
    from comet_dse.web import figures
    from comet_dse.web.app import controls_from
    from comet_dse.web.view import compute, designs

    cluster = load_cluster("dgx-h100")
    view = compute(controls_from("llama3-70b", "", "dgx-h100", 256, 512, 1, [], []))
    points = {d["label"]: d for d in designs(view)}
    per_gib = cluster.economics.unit_price["hbm_capacity"] * 2**30          # USD per GiB
    assert set(points) == {"as it is", "HBM capacity x2"}
    assert math.isclose(points["as it is"]["value"], 256 * cluster.device_price_usd, rel_tol=1e-12)
    assert math.isclose(points["HBM capacity x2"]["value"] - points["as it is"]["value"], 256 * 80 * per_gib,
                        rel_tol=1e-9)
    assert points["as it is"]["on_front"]                  # nothing is cheaper
    figure = figures.designs(view)
    assert len(figure["data"][0]["x"]) == 2 and "annotations" not in figure["layout"]


def test_search_tables_carry_the_same_expected_values_as_its_best_strategy(capsys):
    """search --tokens: each row's training figures are its band's expected values, as the detailed block's,
    with the model's own beside them (economics.expected_columns)."""
    code, out, err = run(capsys, "search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "64",
                         "--global-batch", "512", "--tp", "2", "--tokens", "1T", "--top", "1", "--json")
    assert code == 0, err
    data = json.loads(out)
    top, best = data["top"][0], data["best"]["training"]
    mean = best["band_mean_error"]
    assert top["time_to_train_s"] == pytest.approx(top["time_to_train_s_modelled"] / (1 + mean))
    assert top["time_to_train_s"] == pytest.approx(best["time_to_train_s"])
