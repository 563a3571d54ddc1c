"""Cluster overrides (--set, --expansion) on estimate and search, and the split constraint --mp on search."""
from __future__ import annotations

import json
from importlib import resources

import pytest
import yaml

from comet_dse.answers.overrides import apply_overrides, resource_names
from comet_dse.base.errors import InputError
from comet_dse.presets.catalog import load_cluster
from cli_run import one_line_error, run

GiB = 2.0**30
TPU = ["--model", "megatron-1t", "--cluster", "tpu-v4", "--devices", "4096", "--global-batch", "2048"]
EST = ["estimate", *TPU, "--tp", "16", "--pp", "16", "--recompute", "selective", "--sequence-parallel", "--zero", "2"]


def estimate_json(capsys, *extra) -> dict:
    code, out, err = run(capsys, *EST, *extra, "--json")
    assert code == 0, err
    return json.loads(out)


def test_set_changes_the_estimate_as_a_cluster_file_would(capsys, tmp_path):
    base = estimate_json(capsys)
    more = estimate_json(capsys, "--set", "hbm_capacity=51.2GiB")
    assert more["inputs"]["cluster"] == "tpu-v4[hbm_capacity=51.2GiB]"
    assert more["memory_per_device_bytes"] == base["memory_per_device_bytes"]     # capacity, not footprint
    faster = estimate_json(capsys, "--set", "peak_flops=x2")
    assert faster["step_time_s"] < base["step_time_s"]
    # the same as editing the cluster file
    data = yaml.safe_load((resources.files("comet_dse") / "presets/clusters/tpu-v4.yaml").read_text())
    for dtype in data["accelerator"]["peak_flops"]:
        if dtype != "source":
            data["accelerator"]["peak_flops"][dtype] = 2 * float(load_cluster("tpu-v4").accelerator.peak_flops[dtype])
    path = tmp_path / "tpu2x.yaml"
    path.write_text(yaml.safe_dump(data))
    edited = estimate_json(capsys, "--cluster", str(path))
    assert edited["step_time_s"] == pytest.approx(faster["step_time_s"], rel=1e-12)


def test_set_network_dimension_and_dtype_peak():
    tpu = load_cluster("tpu-v4")
    changed = apply_overrides(tpu, [("network.x.link_bandwidth", "100GB/s"), ("network.y.topology", "ring"),
                                    ("peak_flops.fp8", "500TFLOP/s"), ("hbm_bandwidth", "x2")])
    dims = {d.name: d for d in changed.network}
    assert dims["x"].link_bandwidth == 100e9 and dims["y"].topology.value == "ring"
    assert dims["z"] == {d.name: d for d in tpu.network}["z"]
    assert changed.accelerator.peak_flops["fp8"] == 500e12
    assert changed.accelerator.hbm.bandwidth == 2 * tpu.accelerator.hbm.bandwidth
    assert "network.x.link_bandwidth" in resource_names(tpu) and "peak_flops.fp8" in resource_names(tpu)


def test_expansion_tier_from_the_command_line(capsys):
    base = estimate_json(capsys, "--set", "hbm_capacity=8GiB")
    assert not base["feasible"]
    tier = estimate_json(capsys, "--set", "hbm_capacity=8GiB", "--expansion", "512GiB@64GB/s@1us")
    assert tier["feasible"] and tier["memory_tiers_bytes"]["expansion"] > 0
    assert tier["breakdown_s"]["offload"] > 0
    # --set of the tier's own fields applies after --expansion
    faster = estimate_json(capsys, "--set", "hbm_capacity=8GiB", "--expansion", "512GiB@64GB/s",
                           "--set", "expansion_bandwidth=x4")
    assert faster["breakdown_s"]["offload"] < tier["breakdown_s"]["offload"]


@pytest.mark.parametrize("argv, needles", [
    (["--set", "hbm_capcity=1GiB"], ("--set hbm_capcity", "unknown cluster resource", "did you mean hbm_capacity")),
    (["--set", "hbm_capacity=5 furlongs"], ("--set hbm_capacity", "unit 'furlongs' is not a bytes unit")),
    (["--set", "hbm_capacity=80TB"], ("--set hbm_capacity", "outside the plausible range")),
    (["--set", "hbm_capacity=-1GiB"], ("--set hbm_capacity", "cannot read")),
    (["--set", "hbm_capacity"], ("--set", "expected NAME=VALUE")),
    (["--set", "peak_flops=x0"], ("--set peak_flops", "positive finite")),
    (["--set", "peak_flops.fp8=x2"], ("--set peak_flops.fp8", "no fp8 rate")),
    (["--set", "peak_flops.fp8=9EFLOP/s"], ("--set peak_flops.fp8", "outside the plausible range")),
    (["--set", "network.q.topology=ring"], ("--set network.q.topology", "unknown cluster resource")),
    (["--set", "network.x.topology=star"], ("--set network.x.topology", "valid: switch")),
    (["--set", "network.x.topology=x2"], ("--set network.x.topology", "named values")),
    (["--set", "network=base"], ("--set network", "unknown cluster resource")),
    (["--set", "expansion_capacity=1GiB"], ("--set expansion_capacity", "no expansion tier", "--expansion")),
    (["--expansion", "512GiB"], ("--expansion", "CAPACITY@BANDWIDTH")),
    (["--expansion", "512GiB@64GB"], ("--expansion.bandwidth", "not a bandwidth unit")),
    (["--expansion", "512GiB@64GB/s@5s"], ("--expansion.latency", "outside the plausible range")),
    (["--expansion", "999PiB@64GB/s"], ("--expansion.capacity", "outside the plausible range")),
])
@pytest.mark.parametrize("command", ["estimate", "search"])
def test_bad_overrides_are_one_line_and_exit_2(capsys, command, argv, needles):
    base = EST if command == "estimate" else ["search", *TPU, "--mp", "64"]
    one_line_error(run(capsys, *base, *argv), *needles)


def test_search_mp_and_dp_give_one_split(capsys):
    code, out, err = run(capsys, "search", *TPU, "--mp", "64", "--dp", "64", "--json", "--top", "50")
    assert code == 0, err
    result = json.loads(out)
    assert result["feasible"] > 0
    assert {(r["tp"] * r["pp"], r["dp"]) for r in result["top"]} == {(64, 64)}
    code, out, err = run(capsys, "search", *TPU, "--mp", "64,128", "--json", "--top", "400")
    splits = {r["tp"] * r["pp"] for r in json.loads(out)["top"]}
    assert splits == {64, 128}


def test_search_with_override_ranks_on_the_changed_cluster(capsys):
    code, out, _ = run(capsys, "search", *TPU, "--mp", "256", "--json", "--top", "1")
    small = json.loads(out)
    code, out, _ = run(capsys, "search", *TPU, "--mp", "256", "--set", "hbm_capacity=64GiB", "--json", "--top", "1")
    big = json.loads(out)
    assert big["feasible"] > small["feasible"]
    assert big["best"]["step_time_s"] <= small["best"]["step_time_s"]
    code, out, _ = run(capsys, "search", *TPU, "--mp", "256", "--set", "hbm_capacity=64GiB")
    assert code == 0 and "tpu-v4[hbm_capacity=64GiB]" in out


@pytest.mark.parametrize("argv, needles", [
    (["--mp", "3"], ("strategy.mp", "MP x DP x CP must equal the device count")),
    (["--mp", "64", "--dp", "128"], ("strategy.mp", "dp in [128]")),
    (["--mp", "0"], ("--mp", "positive integer")),
    (["--mp", "x"], ("--mp", "positive integer")),
    (["--mp", ","], ("--mp", "comma-separated")),
])
def test_impossible_split_is_one_line_and_exit_2(capsys, argv, needles):
    one_line_error(run(capsys, "search", *TPU, *argv), *needles)


def test_api_overrides_name_the_mapping():
    with pytest.raises(InputError, match=r"^overrides hbm_capacity: .*plausible"):
        apply_overrides(load_cluster("tpu-v4"), {"hbm_capacity": "80TB"}, where="overrides")
