"""TP communication pipelined with the adjacent GEMMs (--tp-overlap)."""
import dataclasses as dc
import json

import numpy as np
import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.cli import main
from comet_dse.cost.layer_ops import layer_cost
from comet_dse.cost.layer_work import layer_work
from comet_dse.cost.shapes import context_of
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import Recompute
from comet_dse.strategy.declared import Strategy

A100 = load_cluster("dgx-a100-80gb")
GPT3 = load_model("gpt3-175b")
BASE = Strategy(tp=8, pp=8, dp=1, global_batch=64, micro_batch=1, recompute=Recompute.NONE,
                sequence_parallel=True, dtype="bf16")


def _links(cluster, factor):
    return dc.replace(cluster, network=tuple(dc.replace(d, link_bandwidth=d.link_bandwidth * factor)
                                             for d in cluster.network))


def _tp_per_microbatch(cluster, strategy):
    st = StrategyArrays.of([strategy])
    with np.errstate(divide="ignore", invalid="ignore"):
        work, _ = layer_work(GPT3, context_of(GPT3, cluster, 64, st), st)
    return float(work["tp"][0])


def test_overlap_only_moves_time_out_of_tp_communication():
    """Where communication kernels take no SMs (comm_units 0); with them, the hidden part slows the GEMMs
    beside it (tests/test_h100_mechanisms.py)."""
    quiet = dc.replace(A100, accelerator=dc.replace(A100.accelerator, comm_units=0))
    plain = estimate(GPT3, quiet, 64, BASE)
    overlapped = estimate(GPT3, quiet, 64, dc.replace(BASE, tp_overlap=True))
    assert overlapped.breakdown_s["tp_communication"] < plain.breakdown_s["tp_communication"]
    assert overlapped.step_time_s < plain.step_time_s
    for part in ("compute", "memory", "pp_communication", "dp_communication", "optimizer"):
        assert overlapped.breakdown_s[part] == pytest.approx(plain.breakdown_s[part])
    busy = estimate(GPT3, A100, 64, dc.replace(BASE, tp_overlap=True))
    assert overlapped.breakdown_s["compute"] < busy.breakdown_s["compute"] < plain.step_time_s


def test_without_tp_there_is_nothing_to_overlap():
    st = dc.replace(BASE, tp=1, dp=8, sequence_parallel=False)
    assert estimate(GPT3, A100, 64, dc.replace(st, tp_overlap=True)).step_time_s == \
        pytest.approx(estimate(GPT3, A100, 64, st).step_time_s)


def test_fast_links_leave_one_chunk_exposed():
    """Communication much shorter than the GEMMs: only the first chunk (1/t of it) shows."""
    fast = _links(A100, 1000.0)
    plain = _tp_per_microbatch(fast, BASE)
    assert _tp_per_microbatch(fast, dc.replace(BASE, tp_overlap=True)) == pytest.approx(plain / 8)


def test_slow_links_hide_exactly_the_adjacent_gemm_time():
    """Communication much longer than the GEMMs: the GEMMs' time is what disappears."""
    slow = _links(A100, 1e-3)
    st = StrategyArrays.of([BASE])
    ctx = context_of(GPT3, slow, 64, st)
    with np.errstate(divide="ignore", invalid="ignore"):
        layer = layer_cost(GPT3, ctx.shape, ctx.dev)
    gemm_f, gemm_b = float(layer.tp_gemm_forward[0]), float(layer.tp_gemm_backward[0])
    # QKV, output projection, MLP up and down: part of the layer, backward (two GEMMs each) longer
    assert 0 < gemm_f < layer.forward.total[0] and gemm_f < gemm_b < layer.backward.total[0]
    saved = _tp_per_microbatch(slow, BASE) - _tp_per_microbatch(slow, dc.replace(BASE, tp_overlap=True))
    assert saved == pytest.approx(gemm_f + gemm_b)
    # full recomputation repeats the forward and its collectives: the forward GEMMs hide twice
    full = dc.replace(BASE, recompute=Recompute.FULL)
    saved_full = _tp_per_microbatch(slow, full) - _tp_per_microbatch(slow, dc.replace(full, tp_overlap=True))
    assert saved_full == pytest.approx(2 * gemm_f + gemm_b)


def test_cli_flag_reaches_the_estimate(capsys):
    argv = ["estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "64", "--tp", "8",
            "--pp", "8", "--global-batch", "64", "--sequence-parallel", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(argv + ["--tp-overlap"]) == 0
    overlapped = json.loads(capsys.readouterr().out)
    assert overlapped["breakdown_s"]["tp_communication"] < plain["breakdown_s"]["tp_communication"]
    assert main(["search", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "64",
                 "--global-batch", "64", "--tp", "8", "--tp-overlap", "--json"]) == 0
    assert "tp" in capsys.readouterr().out


def test_study_strategy_key(tmp_path):
    from comet_dse.design_space.study import load_study

    path = tmp_path / "s.yaml"
    path.write_text("name: s\nmodels: [megatron-18b]\ncluster: dgx-a100-80gb\ndevices: [64]\nglobal_batch: 64\n"
                    "strategy:\n  tp: [8]\n  tp_overlap: true\n")
    assert load_study(path).space.choices("tp_overlap") == (True,)
    path.write_text(path.read_text().replace("tp_overlap: true", "tp_overlap: maybe"))
    with pytest.raises(Exception, match="tp_overlap"):
        load_study(path)
