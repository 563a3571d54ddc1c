"""What a search does when not told: fused attention where the cluster has a rate for it, TP inside the
scale-up domain, bf16 with fp8 on request, and a memory verdict that keeps the cluster's reserve free
(docs/design-space.md, "Defaults"; docs/hardware.md, "Reserved memory")."""
from __future__ import annotations

import dataclasses as dc
import json
import re
from pathlib import Path

import numpy as np
import pytest

from comet_dse.answers.whatif import smallest_capacity
from comet_dse.base.errors import InputError
from comet_dse.design_space.search import search
from comet_dse.design_space.space import (
    SearchSpace, enumerate_strategies, scale_up_domain, with_cluster_defaults, with_study_defaults,
)
from comet_dse.design_space.study import load_study
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.declared import KNOB
from cli_run import run

GiB = 2.0**30
STUDIES = Path(__file__).resolve().parents[1] / "studies"
LLAMA70 = ("--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", "1024", "--global-batch", "1024")


def _json(capsys, *argv) -> dict:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


# ---- fused attention -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cluster, fused", [("dgx-h100", True), ("dgx-h200", True), ("dgx-h800", True),
                                            ("dgx-a100-80gb", True), ("tpu-v4", False), ("mi300x", True),
                                            ("gaudi3", False)])
def test_fused_attention_by_default_where_the_accelerator_lists_a_rate(cluster, fused):
    c = load_cluster(cluster)
    assert fused is bool(c.accelerator.attention_efficiency)
    assert KNOB["flash_attention"].cluster_default([c.accelerator]) == ((True,) if fused else None)
    space = with_cluster_defaults(SearchSpace(), c, 64)
    assert space.given("flash_attention") == ((True,) if fused else None)
    assert with_cluster_defaults(SearchSpace.of(flash_attention=False), c, 64).given("flash_attention") == (False,)


def test_the_default_kernel_is_one_every_accelerator_lists():
    """An accelerator that lists only cuDNN's rate runs cudnn by default; two that share no kernel get no
    flash attention by default (its rate would be a guess on one of them)."""
    h100 = load_cluster("dgx-h100")
    only = {"cudnn": h100.accelerator.attention_efficiency["cudnn"]}
    cudnn = dc.replace(h100, accelerator=dc.replace(h100.accelerator, attention_efficiency=only))
    space = with_cluster_defaults(SearchSpace(), cudnn, 64)
    assert space.given("flash_attention") == (True,) and [k.value for k in space.given("attention_kernel")] == ["cudnn"]
    fa2 = {"fa2": h100.accelerator.attention_efficiency["fa2"]}
    other = dc.replace(h100, accelerator=dc.replace(h100.accelerator, attention_efficiency=fa2))
    assert "flash_attention" not in with_study_defaults(SearchSpace(), [cudnn, other]).values
    assert with_study_defaults(SearchSpace(), [h100, other]).given("flash_attention") == (True,)


def test_search_default_and_flash_attention_off(capsys):
    on = _json(capsys, "search", *LLAMA70, "--top", "3")
    off = _json(capsys, "search", *LLAMA70, "--top", "3", "--flash-attention", "off")
    assert all(row["flash_attention"] for row in on["top"])
    assert not any(row["flash_attention"] for row in off["top"])
    assert on["top"][0]["step_time_s"] < off["top"][0]["step_time_s"]


def test_paper_setup_studies_keep_unfused_attention_and_others_take_the_default(tmp_path):
    for path in sorted((STUDIES / "comet").glob("paper-*.yaml")):
        assert load_study(path).space.given("flash_attention") == (False,), path.name
    study = tmp_path / "h100.yaml"
    study.write_text("models: [llama3-8b]\ncluster: dgx-h100\ndevices: 64\nglobal_batch: 64\n")
    assert load_study(study).space.given("flash_attention") == (True,)
    study.write_text("models: [llama3-8b]\ncluster: dgx-a100-80gb\ndevices: 64\nglobal_batch: 64\n")
    assert load_study(study).space.given("flash_attention") == (True,)      # FlashAttention-2's A100 rate
    study.write_text("models: [llama3-8b]\ncluster: tpu-v4\ndevices: 64\nglobal_batch: 64\n")
    assert load_study(study).space.given("flash_attention") is None


# ---- TP inside the scale-up domain ------------------------------------------------------------------------------

@pytest.mark.parametrize("cluster, devices, domain", [("dgx-h100", 1024, 8), ("gb200-nvl72", 144, 72),
                                                      ("tpu-v4", 4096, 16), ("dgx-h100", 4, 4)])
def test_the_scale_up_domain_is_the_innermost_dimension(cluster, devices, domain):
    assert scale_up_domain(load_cluster(cluster), devices) == domain


def test_default_search_keeps_tp_inside_the_node_unless_asked(capsys):
    model, h100 = load_model("llama3-70b"), load_cluster("dgx-h100")
    default = with_cluster_defaults(SearchSpace(), h100, 1024)
    assert default.max_tp == 8
    tps = set(enumerate_strategies(model, 1024, 1024, default).tp)
    assert max(tps) == 8
    across = with_cluster_defaults(SearchSpace(), h100, 1024, tp_across_nodes=True)
    assert across.max_tp is None and max(enumerate_strategies(model, 1024, 1024, across).tp) > 8
    # an explicit TP list or an MP constraint is tried as given
    assert with_cluster_defaults(SearchSpace.of(tp=(16,)), h100, 1024).max_tp is None
    assert with_cluster_defaults(SearchSpace.of(mp=(64,)), h100, 1024).max_tp is None
    # on the command line
    rows = _json(capsys, "search", *LLAMA70, "--top", "50")["top"]
    assert all(row["tp"] <= 8 for row in rows)
    rows = _json(capsys, "search", *LLAMA70, "--top", "5", "--tp", "16")["top"]
    assert rows and all(row["tp"] == 16 for row in rows)
    code, out, err = run(capsys, "search", *LLAMA70, "--top", "1", "--tp-across-nodes", "--json")
    assert code == 0, err


def test_whatif_smallest_capacity_keeps_the_rule_and_names_its_split(capsys):
    """The issue: 'smallest HBM at which a split fits' answered 1.9 GiB with TP = 64 over 8 nodes."""
    model, h100 = load_model("llama3-70b"), load_cluster("dgx-h100")
    fit = smallest_capacity(model, h100, 1024, 1024, with_cluster_defaults(SearchSpace(), h100, 1024))
    tp = int(re.match(r"TP(\d+)", fit.split).group(1))
    assert tp <= 8 and f"tp{tp} " in fit.strategy_text + " "
    assert "TP <= 8 (the scale-up domain)" in fit.constraint
    assert fit.smallest > h100.reserved_memory             # the reserve is part of every verdict
    result = _json(capsys, "whatif", *LLAMA70, "--resources", "peak_flops", "--scale", "2")
    assert result["fit"]["split"] == fit.split and result["fit"]["smallest"] == pytest.approx(fit.smallest)


# ---- precision ---------------------------------------------------------------------------------------------------

def test_dtype_list_searches_both_and_shows_the_best_of_each(capsys):
    data = _json(capsys, "search", *LLAMA70, "--dtype", "bf16,fp8", "--top", "3")
    best = data["best_by_dtype"]
    assert set(best) == {"bf16", "fp8"}
    assert all(row["dtype"] == name for name, row in best.items())
    assert best["fp8"]["step_time_s"] < best["bf16"]["step_time_s"]          # H100's fp8 rate is twice bf16's
    assert min(best["fp8"]["rank"], best["bf16"]["rank"]) == 1
    code, out, err = run(capsys, "search", *LLAMA70, "--dtype", "bf16,fp8", "--top", "3")
    assert code == 0 and "Best per precision" in out
    assert re.search(r"^  bf16\s+rank\s+\d+", out, re.M) and re.search(r"^  fp8\s+rank\s+1\b", out, re.M)
    # bf16 stays the default precision
    assert {row["dtype"] for row in _json(capsys, "search", *LLAMA70, "--top", "5")["top"]} == {"bf16"}


# ---- the example ------------------------------------------------------------------------------------------

def test_llama3_70b_on_1024_h100_best_default_keeps_the_reserve_free(capsys):
    """Llama 3 70B on 1,024 H100s, global batch 1,024: the best default strategy runs fused attention, keeps TP
    in the node, and its memory leaves the reserve free: 1.96 GiB fixed + 64 MiB of GEMM workspaces + 1 % of the
    rest, shown as its own part."""
    data = _json(capsys, "search", *LLAMA70, "--top", "1")
    best = data["best"]
    assert best["feasible"] and best["inputs"]["strategy"]["flash_attention"] is True
    assert best["inputs"]["strategy"]["tp"] <= 8
    memory = best["memory_bytes"]
    rest = sum(v for k, v in memory.items() if k != "reserved")
    assert memory["reserved"] == pytest.approx(1.96 * GiB + 64 * 2**20 + 0.01 * rest, rel=1e-6)
    assert memory["reserved"] > 2.0 * GiB                     # several GiB kept for the runtime, NCCL, fragments
    assert rest + memory["reserved"] <= 80 * GiB
    code, out, err = run(capsys, "search", *LLAMA70, "--top", "1")
    assert re.search(r"^  reserved \(runtime and allocator\)\s+\S+ GiB$", out, re.M), out


def test_search_result_is_the_library_search_with_the_defaults():
    model, h100 = load_model("llama3-70b"), load_cluster("dgx-h100")
    result = search(model, h100, 1024, 1024, with_cluster_defaults(SearchSpace(), h100, 1024))
    best = int(result.ranked[0])
    assert bool(result.columns["flash_attention"][best]) and result.columns["tp"][best] <= 8
    assert np.all(result.columns["memory_reserved_bytes"] >= h100.reserved_memory)


# ---- the explorer -------------------------------------------------------------------------------------------------

def test_explorer_strategy_controls():
    from comet_dse.web.view import Controls, strategy_space

    h100 = load_cluster("dgx-h100")
    space = strategy_space(Controls(model="llama3-70b", cluster="dgx-h100", devices=1024, global_batch=1024), h100)
    assert space.given("flash_attention") == (True,) and space.max_tp == 8 and space.given("dtype") == ("bf16",)
    chosen = (("dtype", "bf16,fp8"), ("flash_attention", "off"), ("recompute", "full"), ("zero", "1"))
    space = strategy_space(Controls(cluster="dgx-h100", devices=1024, strategy=chosen, tp_across_nodes=True), h100)
    assert space.given("flash_attention") == (False,) and space.max_tp is None
    assert [d.value for d in space.given("dtype")] == ["bf16", "fp8"]
    assert [r.value for r in space.given("recompute")] == ["full"] and [int(z) for z in space.given("zero")] == [1]
    with pytest.raises(InputError, match="recompute"):
        strategy_space(Controls(cluster="dgx-h100", devices=1024, strategy=(("recompute", "sometimes"),)), h100)
