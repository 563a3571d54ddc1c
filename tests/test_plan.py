"""comet-dse plan (answers/planner.py): the cheapest design within a deadline and the fastest within a budget, across
cluster presets and sizes, costs on one basis, time to train with goodput and the error band."""
from __future__ import annotations

import json

import pytest

import comet_dse
from comet_dse.answers.planner import sizes_for
from comet_dse.presets.catalog import load_cluster
from cli_run import one_line_error, run

SMALL = ["--model", "llama3-8b", "--global-batch", "512", "--tokens", "100G", "--clusters", "dgx-h100,dgx-a100-80gb,mi300x",
         "--devices", "64,128,256"]


@pytest.fixture(scope="module")
def answer():
    return comet_dse.plan("llama3-8b", "100G", 512, days=3, budget=30_000, clusters=["dgx-h100", "dgx-a100-80gb", "mi300x"],
                          devices=[64, 128, 256])


def test_the_cheapest_within_the_deadline_is_the_cheapest_that_meets_it(answer):
    c = answer.cheapest
    assert c is not None and c.training["time_to_train_s"] <= 3 * 86400
    meeting = [x for x in answer.candidates if x.training and x.training["time_to_train_s"] <= 3 * 86400
               and x.cost("rent") is not None]
    assert c.cost("rent") == min(x.cost("rent") for x in meeting)
    assert all(x.cluster != "mi300x" for x in meeting)       # no rent figure: unknown cost, never ranked on cost


def test_the_fastest_within_the_budget_is_the_fastest_that_fits_it(answer):
    f = answer.fastest
    assert f is not None and f.cost("rent") <= 30_000
    fitting = [x for x in answer.candidates if x.cost("rent") is not None and x.cost("rent") <= 30_000]
    assert f.training["time_to_train_s"] == min(x.training["time_to_train_s"] for x in fitting)


def test_every_candidate_has_goodput_and_its_band(answer):
    for c in answer.candidates:
        if c.training:
            assert c.training["time_to_train_s"] > c.training["productive_time_s"]
            low, high = c.time_range()
            assert low <= c.training["time_to_train_s"] <= high      # the headline lies inside its range
            assert c.band_assumed == (c.cluster == "mi300x")         # mi300x: not validated, an assumed band


def test_owning_basis_ranks_on_owning_costs():
    own = comet_dse.plan("llama3-8b", "100G", 512, days=30, clusters=["dgx-h100", "mi300x"], devices=[64], basis="own")
    assert own.cheapest is not None
    assert own.cheapest.cost("own") == min(c.cost("own") for c in own.candidates if c.cost("own") is not None)


def test_sizes_a_cluster_cannot_take_become_its_nearest_multiple():
    # GB200 jobs of 128 and 512 GPUs run in parts of racks (2 x 64, 8 x 64: Cluster.dim_sizes); 100 cannot
    assert sizes_for(load_cluster("gb200-nvl72"), [64, 128, 512]) == [64, 128, 512]
    gb200 = load_cluster("gb200-nvl72")
    assert [gb200.dim_sizes(n)[0] for n in sizes_for(gb200, [102])] == [72]    # 102 = 2 x 51: no whole trays
    assert sizes_for(load_cluster("dgx-h100"), [64, 101, 64]) == [64, 104]   # 8 per node; no repeats


def test_plan_command_text_and_json(capsys):
    code, out, err = run(capsys, "plan", *SMALL, "--days", "3", "--budget", "30k")
    assert code == 0, err
    assert "Cheapest within 3.0 days:" in out and "Fastest within $30k:" in out and "cost (renting)" in out
    code, out, err = run(capsys, "plan", *SMALL, "--days", "3", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["cost_basis"] == "rent" and data["cheapest_within_deadline"]["training"]["time_to_train_s"] <= 3 * 86400
    assert data["fastest_within_budget"] is None


def test_plan_bad_input_is_one_line(capsys):
    one_line_error(run(capsys, "plan", *SMALL), "--days", "deadline")
    one_line_error(run(capsys, "plan", *SMALL, "--days", "-1"), "days")
    one_line_error(run(capsys, "plan", *SMALL, "--budget", "lots"), "budget")


def test_judged_at_the_bands_slow_end_a_design_must_meet_the_deadline_there():
    kwargs = dict(clusters=["dgx-h100"], devices=[64, 128, 256])
    probe = comet_dse.plan("llama3-8b", "100G", 512, days=1000, **kwargs)
    slowest = max(probe.candidates, key=lambda c: c.training["time_to_train_s"])     # the cheapest: fewest devices
    days = (slowest.training["time_to_train_s"] + slowest.time_range()[1]) / 2 / 86400   # between its two times
    loose = comet_dse.plan("llama3-8b", "100G", 512, days=days, **kwargs)
    strict = comet_dse.plan("llama3-8b", "100G", 512, days=days, slow_end=True, **kwargs)
    assert loose.cheapest.devices == slowest.devices                  # meets the deadline as predicted
    assert strict.cheapest.devices != slowest.devices                 # not at its band's slow end
    assert strict.cheapest.time_range()[1] <= days * 86400
    assert strict.cheapest.cost("rent") >= loose.cheapest.cost("rent")
    assert "slow end" in "\n".join(strict.answer_lines())


def test_plan_says_how_many_it_shows_lists_all_on_request_and_names_what_it_left_out(capsys):
    """9 designs fit (3 clusters x 3 sizes); --top 2 shows 2 of them and says so; --all shows all 9; a cluster with
    no rent figure (dgx-h200 as shipped) is named as left out of a renting answer, never costed as owned."""
    argv = ["plan", "--model", "llama3-8b", "--global-batch", "512", "--tokens", "100G", "--days", "3",
            "--clusters", "dgx-h100,dgx-a100-80gb,dgx-h200", "--devices", "64,128,256", "--no-progress"]
    code, out, err = run(capsys, *argv, "--top", "2")
    assert code == 0, err
    assert "The 2 cheapest of the 9 designs that fit (--all lists every one):" in out
    assert "Left out of the answers, every cost on one basis (renting): dgx-h200 x 64 (no rent figure)" in out
    code, out, err = run(capsys, *argv, "--all")
    assert code == 0 and "The 9 cheapest of the 9 designs that fit:" in out and "--all lists" not in out
    assert sum(1 for line in out.splitlines() if line.startswith(("dgx-h100 ", "dgx-a100-80gb ", "dgx-h200 "))) == 9
    code, out, err = run(capsys, *argv, "--json")
    left = json.loads(out)["left_out_of_costs"]
    assert {(x["cluster"], x["why"]) for x in left} == {("dgx-h200", "no rent figure")} and len(left) == 3


def test_a_design_without_a_validated_band_is_judged_at_its_assumed_bands_slow_end(answer):
    """mi300x: no published run; its band is assumed, and --slow-end judges it at that band's slow end."""
    mi = [c for c in answer.candidates if c.cluster == "mi300x" and c.training]
    assert mi and all(c.band_assumed and c.time_range()[1] > c.training["time_to_train_s"] for c in mi)
    from comet_dse.answers.planner import _judged
    c = mi[0]
    assert _judged(c, "time_to_train_s", c.training["time_to_train_s"], True) == c.time_range()[1]


def test_sizes_beyond_the_largest_published_system_are_not_offered_and_said_so(capsys):
    """dgx-h200's largest published system is 1,024 GPUs (Nebius, MLPerf): 2,048 is not planned on it, and the
    text says which sizes it left out and why."""
    from comet_dse.answers.planner import sizes_for
    refused = []
    assert sizes_for(load_cluster("dgx-h200"), [512, 1024, 2048], refused) == [512, 1024]
    assert refused and refused[0][0] == 2048 and "at most 1024" in refused[0][1]
    code, out, err = run(capsys, "plan", "--model", "llama3-8b", "--global-batch", "512", "--tokens", "100G",
                         "--days", "30", "--clusters", "dgx-h200", "--devices", "512,2048", "--no-progress")
    assert code == 0, err
    assert "Sizes not offered: dgx-h200 x 2,048 (dgx-h200 has at most 1024 devices" in out
    assert "; 1 design (1 cluster x the sizes each takes)" in out
