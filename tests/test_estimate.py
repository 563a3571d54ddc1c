"""End-to-end behaviour of estimate(): feasibility, tiers, uneven stages, presets."""
import dataclasses as dc

import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.base.units import format_bytes
from comet_dse.hardware.spec import MemoryTier
from comet_dse.presets.catalog import load_cluster, load_model, preset_names
from comet_dse.strategy.choices import Recompute
from comet_dse.strategy.declared import Strategy

GiB = 2**30


def test_readme_example_is_feasible_and_plausible(a100, megatron_1t):
    st = Strategy(tp=8, pp=64, dp=1, global_batch=512, micro_batch=1, recompute=Recompute.SELECTIVE,
                  sequence_parallel=True, dtype="fp16")
    r = estimate(megatron_1t, a100, 512, st)
    assert r.feasible and r.reasons == []
    # Korthikanti et al. 2022 Table 5 report MFU 56.3 % for this run.
    assert r.mfu == pytest.approx(0.563, abs=0.03)
    assert r.memory_per_device_bytes < 80 * GiB


def test_infeasible_lists_every_reason(a100, megatron_1t):
    st = Strategy(tp=3, pp=1, dp=2, global_batch=7, micro_batch=1)
    r = estimate(megatron_1t, a100, 8, st)
    assert not r.feasible
    text = " | ".join(r.reasons)
    assert "tp*pp*dp = 3*1*2 = 6, but the cluster has 8 devices" in text
    assert "tp=3 does not divide the 160 attention heads" in text
    assert "global batch 7 is not a multiple of dp*micro_batch = 2" in text
    assert "HBM holds 80.0 GiB" in text


def test_memory_reason_names_the_need(a100, megatron_1t):
    r = estimate(megatron_1t, a100, 8, Strategy(tp=8, pp=1, dp=1, global_batch=1))
    (reason,) = r.reasons
    assert r.memory_per_device_bytes == pytest.approx(2.2 * 2**40, rel=0.05)
    assert reason.startswith(f"needs {format_bytes(r.memory_per_device_bytes)} per device (weights ")
    assert reason.endswith("HBM holds 80.0 GiB")


def _with_expansion(cluster, capacity, bandwidth=64e9):
    tier = MemoryTier(name="cxl", capacity=capacity, bandwidth=bandwidth, efficiency=1.0, latency=1e-6)
    return dc.replace(cluster, accelerator=dc.replace(cluster.accelerator, expansion=tier))


def test_expansion_tier_makes_a_config_fit_at_a_cost(a100):
    model = load_model("gpt3-175b")
    st = Strategy(tp=8, pp=4, dp=1, global_batch=32, micro_batch=1, recompute=Recompute.FULL)
    plain = estimate(model, a100, 32, st)
    assert not plain.feasible
    over = plain.memory_per_device_bytes - 80 * GiB
    big = estimate(model, _with_expansion(a100, 512 * GiB), 32, st)
    assert big.feasible
    assert big.memory_tiers_bytes["expansion"] == pytest.approx(over, rel=1e-9)
    assert big.memory_tiers_bytes["hbm"] == pytest.approx(80 * GiB, rel=1e-9)
    assert big.breakdown_s["offload"] > 0
    faster = estimate(model, _with_expansion(a100, 512 * GiB, bandwidth=256e9), 32, st)
    assert faster.breakdown_s["offload"] < big.breakdown_s["offload"]
    small = estimate(model, _with_expansion(a100, 1 * GiB), 32, st)
    assert not small.feasible and "cxl tier 1.0 GiB" in small.reasons[0]


def test_uneven_stages_llama3_405b():
    """Llama-3 405B: 126 layers on 16 stages; the slowest stage sets the pace."""
    model = load_model("llama3-405b")
    h100 = load_cluster("dgx-h100")
    st = Strategy(tp=8, pp=16, dp=16, global_batch=256, micro_batch=1, recompute=Recompute.NONE,
                  sequence_parallel=True, flash_attention=True)
    r = estimate(model, h100, 2048, st)
    assert r.layers_per_stage == 8            # ceil(126 / 16)
    even = estimate(dc.replace(model, layers=128), h100, 2048, st)
    assert r.step_time_s <= even.step_time_s  # 126 layers never slower than 128


@pytest.mark.parametrize("cluster,devices,tp,pp", [
    ("dgx-a100-80gb", 1024, 8, 16), ("dgx-h100", 1024, 8, 16), ("tpu-v4", 1024, 8, 16), ("dojo", 1000, 5, 20),
])
def test_every_cluster_preset_estimates(cluster, devices, tp, pp):
    model = load_model("gpt3-175b")
    c = load_cluster(cluster)
    heads_ok = model.attention.heads % tp == 0
    dp = devices // (tp * pp)
    st = Strategy(tp=tp, pp=pp, dp=dp, global_batch=dp * 16, micro_batch=1, recompute=Recompute.FULL)
    r = estimate(model, c, devices, st)
    assert r.step_time_s > 0
    assert sum(r.breakdown_s.values()) == pytest.approx(r.step_time_s)
    if not heads_ok:
        assert any("attention heads" in x for x in r.reasons)


def test_presets_cover_the_issue():
    assert {"dgx-a100-80gb", "dgx-h100", "tpu-v4", "dojo"} <= set(preset_names("clusters"))


def test_placement_moves_tp_off_nvlink(a100):
    """TP across nodes (dp innermost) is slower than TP inside a node, everything else equal."""
    model = load_model("gpt3-175b")
    base = Strategy(tp=8, pp=8, dp=4, global_batch=64, micro_batch=1, recompute=Recompute.FULL)
    inside = estimate(model, a100, 256, base)
    across = estimate(model, a100, 256, dc.replace(base, placement="dp-pp-tp"))
    assert across.breakdown_s["tp_communication"] > 5 * inside.breakdown_s["tp_communication"]
    assert across.breakdown_s["dp_communication"] <= inside.breakdown_s["dp_communication"] + 1e-12
    assert across.step_time_s > inside.step_time_s


def test_a_strategy_that_breaks_a_rule_has_no_step_time_in_json():
    """tp=8 on a 28-head model cannot run: null times and MFU; a strategy that only does not fit keeps its numbers."""
    h100 = load_cluster("dgx-h100")
    model = load_model("llama3-8b")
    heads28 = dc.replace(model, attention=dc.replace(model.attention, heads=28, kv_heads=4))
    r = estimate(heads28, h100, 8, Strategy(tp=8, global_batch=8))
    assert "tp_heads" in r.broken_rules and not r.runnable
    data = r.to_dict()
    for key in ("step_time_s", "tokens_per_second", "mfu", "hfu", "breakdown_s", "phases_s"):
        assert data[key] is None, key
    assert data["memory_per_device_bytes"] > 0
    big = estimate(load_model("gpt3-175b"), h100, 8, Strategy(tp=8, global_batch=8))
    assert big.broken_rules == ["memory"] and big.to_dict()["step_time_s"] > 0
    assert estimate(model, h100, 8, Strategy(tp=8, global_batch=8)).to_dict()["mfu"] > 0


def test_matmul_efficiency_per_dtype(tmp_path):
    """A preset may give the GEMM efficiency per dtype: fp8 GEMMs then run at their own figure."""
    from comet_dse.base.errors import InputError
    from comet_dse.hardware.load import cluster_from
    import yaml

    h100 = load_cluster("dgx-h100")
    assert h100.accelerator.matmul_efficiencies()["fp8"] == pytest.approx(0.709)    # MAMF 1402.6 / 1978.9
    assert h100.accelerator.matmul_efficiencies()["bf16"] == pytest.approx(0.803)   # MAMF 794.5 / 989.4
    model = load_model("gpt3-175b")
    st = Strategy(tp=8, pp=8, dp=1, global_batch=64, dtype="fp8", recompute=Recompute.FULL)
    same = dc.replace(h100, accelerator=dc.replace(h100.accelerator, matmul_efficiency_by_dtype={}))
    slower_fp8 = estimate(model, h100, 64, st).breakdown_s["compute"]
    assert slower_fp8 > estimate(model, same, 64, st).breakdown_s["compute"]
    bf16 = Strategy(tp=8, pp=8, dp=1, global_batch=64, recompute=Recompute.FULL)
    assert estimate(model, h100, 64, bf16).step_time_s == estimate(model, same, 64, bf16).step_time_s
    from importlib import resources

    data = yaml.safe_load(resources.files("comet_dse").joinpath("presets", "clusters", "dgx-h100.yaml").read_text())
    data["accelerator"]["matmul_efficiency"] = {"fp8": 0.7}
    with pytest.raises(InputError, match="matmul_efficiency: needs a bf16 or fp16 figure"):
        cluster_from(data)
    data["accelerator"]["matmul_efficiency"] = {"bf16": 0.8, "fp9": 0.7}
    with pytest.raises(InputError, match="fp9: unknown field"):
        cluster_from(data)
