"""Expert all-to-all: group-limited (node-limited) routing and fp8 dispatch."""
import dataclasses as dc

import numpy as np
import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.base.errors import InputError
from comet_dse.cost import collectives as coll
from comet_dse.cost.layer_work import expert_exchange_time, layer_work, node_copy_fraction
from comet_dse.cost.shapes import context_of
from comet_dse.model.load import transformer_from
from comet_dse.presets.catalog import load_cluster, load_model, preset_data
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import Recompute
from comet_dse.strategy.declared import Strategy

H800 = load_cluster("dgx-h800")
DEEPSEEK = load_model("deepseek-v3")
UNLIMITED = dc.replace(DEEPSEEK, moe=dc.replace(DEEPSEEK.moe, expert_groups=1, groups_per_token=1))
# DeepSeek-V3's layout (arXiv:2412.19437 Sec. 3.2): PP 16, EP 64 over 8 nodes, ZeRO-1 data parallelism.
RUN = Strategy(pp=16, dp=128, ep=64, zero=1, global_batch=15360, flash_attention=True, dtype="fp8",
               recompute=Recompute.FULL, ep_overlap=True, placement="dp-tp-pp")


def _ctx(strategy, model=DEEPSEEK):
    st = StrategyArrays.of([strategy])
    return context_of(model, H800, 2048, st), st


def test_ep_group_spans_eight_nodes_with_dp_innermost():
    ctx, _ = _ctx(RUN)
    assert [float(n[0]) for n in ctx.spans["ep"]] == [8.0, 8.0]


def test_node_copy_fraction_by_hand():
    """8 nodes, a token's 8 experts in at most 4 of them: 4 (1 - (3/4)^8) = 3.60 distinct nodes of 8 copies."""
    ctx, _ = _ctx(RUN)
    assert float(node_copy_fraction(DEEPSEEK.moe, ctx.spans["ep"])[0]) == pytest.approx(4 * (1 - 0.75 ** 8) / 8)
    assert node_copy_fraction(UNLIMITED.moe, ctx.spans["ep"]) == 1.0
    # EP over 64 nodes (default placement): 8 groups of 8 nodes each, 4 groups reachable = 32 nodes
    wide, _ = _ctx(dc.replace(RUN, placement="tp-pp-dp"))
    assert float(node_copy_fraction(DEEPSEEK.moe, wide.spans["ep"])[0]) == pytest.approx(32 * (1 - (31 / 32) ** 8) / 8)


def test_outer_scale_touches_only_the_outermost_dimension():
    ctx, _ = _ctx(RUN)
    spans = ctx.spans["ep"]
    full = coll.all_to_all_time(1e9, ctx.dims, spans)
    inner_only = coll.all_to_all_time(1e9, ctx.dims, [spans[0], np.ones_like(spans[1])])
    outer_latency = 7 * ctx.dims[1].latency
    assert coll.all_to_all_time(1e9, ctx.dims, spans, outer_scale=0.0) == pytest.approx(inner_only + outer_latency)
    assert inner_only < coll.all_to_all_time(1e9, ctx.dims, spans, outer_scale=0.5) < full


def test_fp8_dispatch_halves_one_of_the_two_exchanges():
    ctx, st = _ctx(RUN)
    _, layer = layer_work(DEEPSEEK, ctx, st, moe_layer=True)
    ctx8, st8 = _ctx(dc.replace(RUN, ep_fp8_dispatch=True))
    plain = float(expert_exchange_time(DEEPSEEK.moe, layer.a2a_bytes, ctx, st)[0])
    fp8 = float(expert_exchange_time(DEEPSEEK.moe, layer.a2a_bytes, ctx8, st8)[0])
    assert 0.70 * plain < fp8 < 0.80 * plain    # (1 + (1 + 4/128)/2) / 2 of the bytes, plus fixed latency


def test_both_make_the_deepseek_step_faster():
    flat = estimate(UNLIMITED, H800, 2048, RUN).step_time_s
    limited = estimate(DEEPSEEK, H800, 2048, RUN).step_time_s
    fp8 = estimate(DEEPSEEK, H800, 2048, dc.replace(RUN, ep_fp8_dispatch=True)).step_time_s
    assert fp8 < limited < flat


def test_fp8_dispatch_needs_fp8_and_groups_must_divide():
    with pytest.raises(InputError, match="ep-fp8-dispatch"):
        dc.replace(RUN, dtype="bf16", ep_fp8_dispatch=True)
    data = preset_data("models", "deepseek-v3")
    with pytest.raises(InputError, match="expert_groups"):
        transformer_from({**data, "moe": {**data["moe"], "expert_groups": 7}})
    with pytest.raises(InputError, match="groups_per_token"):
        transformer_from({**data, "moe": {**data["moe"], "groups_per_token": 9}})


def test_search_tries_placements_and_shows_them(capsys):
    from comet_dse.cli import main

    argv = ["search", "--model", "deepseek-v3", "--cluster", "dgx-h800", "--devices", "2048", "--global-batch", "15360",
            "--dtype", "fp8", "--flash-attention", "--tp", "1", "--pp", "16", "--ep", "64", "--zero", "1",
            "--ep-overlap", "--ep-fp8-dispatch", "--placement", "tp-pp-dp,dp-tp-pp", "--top", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "placement" in out and "dp-tp-pp" in out.split("Fastest")[1].splitlines()[3]
    assert main(argv + ["--json"]) == 0
    import json
    best = json.loads(capsys.readouterr().out)["top"][0]
    assert best["placement"] == "dp-tp-pp"        # EP inside 8 nodes beats EP across 64
    chosen = dc.replace(RUN, ep_fp8_dispatch=True, pipeline_split=best["pipeline_split"])  # a search tries both
    assert best["step_time_s"] == pytest.approx(estimate(DEEPSEEK, H800, 2048, chosen).step_time_s)


@pytest.mark.parametrize("placement", ["tp-pp-dp", "dp-tp-pp"])
@pytest.mark.parametrize("fp8_dispatch", [False, True])
def test_more_network_or_compute_never_slower(placement, fp8_dispatch):
    st = dc.replace(RUN, placement=placement, ep_fp8_dispatch=fp8_dispatch)
    base = estimate(DEEPSEEK, H800, 2048, st).step_time_s
    links = dc.replace(H800, network=tuple(dc.replace(d, link_bandwidth=2 * d.link_bandwidth) for d in H800.network))
    acc = H800.accelerator
    flops = dc.replace(H800, accelerator=dc.replace(acc, peak_flops={k: 2 * v for k, v in acc.peak_flops.items()}))
    assert estimate(DEEPSEEK, links, 2048, st).step_time_s <= base * (1 + 1e-12)
    assert estimate(DEEPSEEK, flops, 2048, st).step_time_s <= base * (1 + 1e-12)


def test_deepep_sends_a_token_once_per_rank_that_holds_one_of_its_experts():
    """rank_copy_fraction: 32 experts on 8 ranks, top-8: 8 (1 - C(28, 8) / C(32, 8)) = 5.64 ranks per token;
    8 experts on 8 ranks, top-2: always 2 ranks; the all-to-all dispatcher sends every copy."""
    from math import comb

    from comet_dse.cost.layer_ops import DISPATCHER_ALLTOALL, DISPATCHER_FLEX
    from comet_dse.cost.layer_work import rank_copy_fraction
    from comet_dse.model.spec import MoE

    wide = MoE(experts=32, top_k=8, ffn=2048)
    expected = 8 * (1 - comb(28, 8) / comb(32, 8)) / 8
    assert float(rank_copy_fraction(wide, 8, DISPATCHER_FLEX)) == pytest.approx(expected, rel=1e-12)
    assert float(rank_copy_fraction(MoE(experts=8, top_k=2, ffn=1), 8, DISPATCHER_FLEX)) == pytest.approx(1.0)
    assert float(rank_copy_fraction(wide, 8, DISPATCHER_ALLTOALL)) == 1.0
    assert float(rank_copy_fraction(wide, 1, DISPATCHER_FLEX)) == pytest.approx(1 / 8)   # one rank holds all


def test_deepep_holds_its_own_sms_while_an_exchange_hides():
    """expert_exchange_share: NCCL's comm_units / compute_units for the all-to-all dispatcher, DEEPEP_SMS /
    compute_units for DeepEP's kernels (flex, fused), and nothing on a device that counts no communication units."""
    import dataclasses

    from comet_dse.cost.layer_work import DEEPEP_SMS, expert_exchange_share
    from comet_dse.cost.shapes import device_of
    from comet_dse.presets.catalog import load_cluster
    from comet_dse.strategy.arrays import StrategyArrays
    from comet_dse.strategy.declared import Strategy

    h100 = load_cluster("dgx-h100")
    st = StrategyArrays.of([Strategy(ep=8, dp=8, global_batch=8, moe_dispatcher=d)
                            for d in ("alltoall", "flex", "fused")])
    dev = device_of(h100, st)
    units = h100.accelerator.compute_units
    assert list(expert_exchange_share(dev, st)) == pytest.approx([h100.accelerator.comm_units / units,
                                                                  DEEPEP_SMS / units, DEEPEP_SMS / units])
    none = dataclasses.replace(dev, comm_share=0.0)
    assert list(expert_exchange_share(none, st)) == [0.0, 0.0, 0.0]
