"""Context parallelism with an all-gather of K and V (Llama 3) instead of a ring."""
import dataclasses as dc

import numpy as np
import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.base.errors import InputError
from comet_dse.cli import main
from comet_dse.cost import collectives as coll
from comet_dse.cost.layer_work import layer_work
from comet_dse.cost.shapes import context_of
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import CpAlgorithm, Recompute
from comet_dse.strategy.declared import Strategy

H100 = load_cluster("dgx-h100")
LLAMA = load_model("llama3-8b").with_seq_len(131072)
BASE = Strategy(tp=8, pp=1, dp=1, cp=16, global_batch=8, micro_batch=1, recompute=Recompute.NONE,
                sequence_parallel=True, flash_attention=True, cp_algorithm="all-gather")


def _cp_work(strategy):
    st = StrategyArrays.of([strategy])
    with np.errstate(divide="ignore", invalid="ignore"):
        ctx = context_of(LLAMA, H100, 128, st)
        work, layer = layer_work(LLAMA, ctx, st)
    return float(work["cp"][0]), layer, ctx


def test_all_gather_is_exposed_once_per_pass():
    """Forward all-gather + backward reduce-scatter of cp x (own K and V), fully exposed."""
    exposed, layer, ctx = _cp_work(BASE)
    gather = float(coll.all_gather_time(16 * layer.cp_kv_bytes, ctx.dims, ctx.spans["cp"])[0])
    assert gather > 0
    assert exposed == pytest.approx(2 * gather)
    recomputed, _, _ = _cp_work(dc.replace(BASE, recompute=Recompute.FULL))
    assert recomputed == pytest.approx(3 * gather)


def test_ring_hides_behind_long_attention_where_all_gather_cannot():
    ring = estimate(LLAMA, H100, 128, dc.replace(BASE, cp_algorithm="ring"))
    gather = estimate(LLAMA, H100, 128, BASE)
    assert ring.breakdown_s["cp_communication"] < gather.breakdown_s["cp_communication"]
    assert gather.step_time_s > ring.step_time_s
    # the ring's hidden transfers hold SMs (comm_units), which slows the attention beside them
    assert ring.breakdown_s["compute"] > gather.breakdown_s["compute"]
    quiet = dc.replace(H100, accelerator=dc.replace(H100.accelerator, comm_units=0))
    assert estimate(LLAMA, quiet, 128, BASE).breakdown_s["compute"] == pytest.approx(
        estimate(LLAMA, quiet, 128, dc.replace(BASE, cp_algorithm="ring")).breakdown_s["compute"])


def test_no_cp_no_exchange():
    st = dc.replace(BASE, cp=1, tp=8, dp=16)
    assert estimate(LLAMA, H100, 128, st).breakdown_s["cp_communication"] == 0.0


def test_bad_algorithm_is_an_input_error(capsys):
    with pytest.raises(InputError, match="cp-algorithm"):
        dc.replace(BASE, cp_algorithm="tree")
    argv = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "128", "--tp", "8",
            "--cp", "16", "--global-batch", "8", "--seq-len", "131072", "--cp-algorithm"]
    with pytest.raises(SystemExit) as stop:
        main(argv + ["tree"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cp-algorithm" in err[0]
    assert main(argv + ["all-gather"]) == 0
    assert "CP by all-gather" in capsys.readouterr().out


def test_study_key(tmp_path):
    from comet_dse.design_space.study import load_study

    path = tmp_path / "s.yaml"
    path.write_text("name: s\nmodels: [llama3-8b]\ncluster: dgx-h100\ndevices: [128]\nglobal_batch: 8\n"
                    "strategy:\n  tp: [8]\n  cp: [16]\n  cp_algorithm: all-gather\n")
    assert load_study(path).space.choices("cp_algorithm") == (CpAlgorithm.ALL_GATHER,)
    path.write_text(path.read_text().replace("all-gather", "tree"))
    with pytest.raises(InputError, match="cp_algorithm"):
        load_study(path)
