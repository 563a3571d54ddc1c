"""comet-dse whatif: speedups of scaled resources and the smallest capacity that makes a split fit."""
from __future__ import annotations

import json

import pytest

from comet_dse.answers.overrides import apply_overrides
from comet_dse.answers.whatif import smallest_capacity, whatif
from comet_dse.design_space.search import search
from comet_dse.design_space.space import SearchSpace
from comet_dse.presets.catalog import load_cluster, load_model
from cli_run import one_line_error, run

GiB = 2.0**30
# A small, fast question: megatron-18b on 64 A100s (a few thousand strategies per variant).
SMALL = ["--model", "megatron-18b", "--cluster", "dgx-a100-80gb", "--devices", "64", "--global-batch", "256"]


@pytest.fixture(scope="module")
def small():
    return load_model("megatron-18b"), load_cluster("dgx-a100-80gb")


def test_speedups_equal_searches_of_the_scaled_cluster(small):
    model, cluster = small
    result = whatif(model, cluster, 64, 256, resources=["peak_flops", "hbm_capacity", "network_bandwidth"],
                    factors=(0.5, 2), capacity=None)
    base = search(model, cluster, 64, 256)
    assert result.baseline.step_time_s == pytest.approx(float(base.columns["step_time_s"][base.ranked[0]]))
    for resource in ("peak_flops", "hbm_capacity", "network_bandwidth"):
        for factor in (0.5, 2.0):
            scaled = apply_overrides(cluster, [(resource, f"x{factor}")])
            r = search(model, scaled, 64, 256)
            expected = result.baseline.step_time_s / float(r.columns["step_time_s"][r.ranked[0]])
            assert result.speedup(resource, factor) == pytest.approx(expected, rel=1e-12)
    assert result.speedup("peak_flops", 2.0) > 1 > result.speedup("peak_flops", 0.5)
    assert result.fit is None
    table = result.to_arrow()
    assert table.num_rows == 6 and {"resource", "factor", "speedup", "strategy_text"} <= set(table.column_names)


def test_smallest_capacity_is_the_edge_of_fitting(small):
    model, cluster = small
    space = SearchSpace(mp=(8,), values={"dp": (8,)})
    fit = smallest_capacity(model, cluster, 64, 256, space)
    assert fit.constraint == "MP8 x DP8" and fit.fits_now and fit.smallest < cluster.accelerator.hbm.capacity

    def fits(capacity):
        return search(model, apply_overrides(cluster, [("hbm_capacity", capacity)]), 64, 256, space).feasible > 0

    assert fits(fit.smallest) and not fits(fit.smallest * 0.999)


def test_split_that_cannot_fit_says_why(small):
    model, cluster = small
    fit = smallest_capacity(model, cluster, 64, 256, SearchSpace(values={"tp": (64,), "dp": (1,)}))
    assert fit.smallest is None and "no strategy is valid" in fit.note


def test_whatif_table(capsys):
    code, out, err = run(capsys, "whatif", *SMALL)
    assert code == 0, err
    for needle in ("As it is:", "peak_flops", "hbm_capacity", "network.nvlink.bandwidth", "x0.5", "x2",
                   "Smallest hbm_capacity at which any split with TP <= 8 (the scale-up domain) has a strategy that fits"):
        assert needle in out, needle


def test_whatif_json_split_and_figure(capsys, tmp_path):
    figure = tmp_path / "w.png"
    code, out, err = run(capsys, "whatif", *SMALL, "--mp", "8", "--dp", "8", "--resources", "hbm_capacity,peak_flops",
                         "--scale", "0.25,4", "--json", "--figure", figure)
    assert code == 0, err
    result = json.loads(out)
    assert [(c["resource"], c["factor"]) for c in result["cells"]] == [
        ("hbm_capacity", 0.25), ("hbm_capacity", 4.0), ("peak_flops", 0.25), ("peak_flops", 4.0)]
    assert result["fit"]["constraint"] == "MP8 x DP8" and 0 < result["fit"]["smallest"] < 80 * GiB
    assert result["baseline"]["strategy"]["tp"] * result["baseline"]["strategy"]["pp"] == 8
    assert figure.stat().st_size > 5000


def test_whatif_with_overrides_and_expansion(capsys):
    code, out, err = run(capsys, "whatif", *SMALL, "--set", "hbm_capacity=20GiB", "--expansion", "256GiB@64GB/s",
                         "--no-fit", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["cluster"].endswith("[expansion=256GiB@64GB/s, hbm_capacity=20GiB]")
    assert {"expansion_capacity", "expansion_bandwidth"} <= {c["resource"] for c in result["cells"]}
    assert result["fit"] is None


def test_factor_beyond_the_plausible_bound_is_a_note(small):
    model, cluster = small
    result = whatif(model, cluster, 64, 256, resources=["hbm_capacity"], factors=(1000.0,), capacity=None)
    cell = result.cells[0]
    assert cell.speedup is None and "plausible range" in cell.note


@pytest.mark.parametrize("argv, needles", [
    (["--resources", "hbm_capcity"], ("--resources hbm_capcity", "did you mean hbm_capacity")),
    (["--resources", "network.nvlink.topology"], ("--resources network.nvlink.topology", "no scale")),
    (["--resources", "expansion_capacity"], ("--resources expansion_capacity", "no expansion tier")),
    (["--scale", "0"], ("--scale", "positive numbers")),
    (["--scale", "two"], ("--scale", "positive numbers")),
    (["--capacity", "hbm_bandwidth"], ("--capacity", "invalid choice")),
    (["--mp", "3"], ("strategy.mp", "device count")),
    (["--set", "hbm_capacity=5 furlongs"], ("--set hbm_capacity", "not a bytes unit")),
    (["--figure", "w.pdf"], ("--figure", ".png or .svg")),
])
def test_bad_whatif_input_is_one_line_and_exit_2(capsys, argv, needles):
    one_line_error(run(capsys, "whatif", *SMALL, *argv), *needles)


def test_whatif_where_nothing_fits_answers_no_fit_instead_of_evaluating_nothing(capsys):
    """Llama 3 8B on 8 TPU v5e chips fits nowhere: scaling compute leaves no candidate strategy, which is an
    answer ('no fit'), not an evaluation of an empty set (an IndexError in the cost model before)."""
    from comet_dse.cli import main

    code = main(["whatif", "--model", "llama3-8b", "--cluster", "tpu-v5e", "--devices", "8", "--global-batch", "8",
                 "--resources", "peak_flops", "--no-fit"])
    out = capsys.readouterr().out
    assert code == 0 and "As it is: no strategy fits" in out and "no fit" in out, out
