"""What the loss keeps (--cross-entropy), when ZeRO 3 reduces gradients (--grad-sync) and the last pipeline rank's
memory, each against a hand calculation (docs/model.md, "Loss" and "When ZeRO 3 reduces gradients")."""
import dataclasses as dc

import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.choices import Recompute
from comet_dse.strategy.declared import Strategy

H100 = load_cluster("dgx-h100")
LLAMA8B = load_model("llama3-8b")
LLAMA70B = load_model("llama3-70b")


@pytest.mark.parametrize("kind, per_logit", [("fused", 10.0), ("fp32-cast", 12.0), ("loss-parallel", 16.0)])
def test_cross_entropy_keeps_its_bytes_per_logit(kind, per_logit):
    """One stage (pp 1), FSDP over 8: b s V logits at the loss's peak, against in-place's 6 bytes each."""
    base = Strategy(dp=8, zero=3, global_batch=8, micro_batch=1, recompute=Recompute.FULL, flash_attention=True)
    in_place = estimate(LLAMA8B, H100, 8, base)
    other = estimate(LLAMA8B, H100, 8, dc.replace(base, cross_entropy=kind))
    logits = 1 * LLAMA8B.seq_len * LLAMA8B.vocab
    extra = other.memory_bytes["activations"] - in_place.memory_bytes["activations"]
    assert extra == pytest.approx((per_logit - 6.0) * logits, abs=8)
    assert other.step_time_s == in_place.step_time_s


def test_tensor_parallel_loss_holds_its_vocabulary_share():
    base = Strategy(tp=8, dp=4, zero=1, global_batch=32, micro_batch=2, recompute=Recompute.FULL,
                    sequence_parallel=True, flash_attention=True)
    in_place = estimate(LLAMA70B, H100, 32, base)
    cast = estimate(LLAMA70B, H100, 32, dc.replace(base, cross_entropy="fp32-cast"))
    logits = 2 * LLAMA70B.seq_len * LLAMA70B.vocab / 8
    assert cast.memory_bytes["activations"] - in_place.memory_bytes["activations"] == pytest.approx(6.0 * logits, abs=8)


def test_grad_sync_step_holds_unsharded_fp32_gradients_and_reduces_once():
    """ZeRO 3 over 8, 4 micro-batches: g P / 8 sharded against g P unsharded (g = 4 B, bf16 training)."""
    base = Strategy(dp=8, zero=3, global_batch=32, micro_batch=1, recompute=Recompute.FULL, flash_attention=True)
    every = estimate(LLAMA8B, H100, 8, base)
    once = estimate(LLAMA8B, H100, 8, dc.replace(base, grad_sync="step"))
    assert once.memory_bytes["gradients"] == pytest.approx(8 * every.memory_bytes["gradients"], rel=1e-9)
    assert once.memory_bytes["gradients"] == pytest.approx(4.0 * LLAMA8B.total_params(), rel=1e-6)
    assert once.breakdown_s["dp_communication"] < every.breakdown_s["dp_communication"]
    assert once.step_time_s <= every.step_time_s


def test_grad_sync_step_with_weights_kept_gathers_once_per_step():
    """reshard_after_forward off with grad_sync step (torchtitan's FSDP2 under PP): the weights stay gathered
    between micro-batches, so a 4-micro-batch step pays the DP collectives of a 1-micro-batch one."""
    base = Strategy(dp=8, zero=3, global_batch=32, micro_batch=1, recompute=Recompute.FULL, flash_attention=True,
                    grad_sync="step", reshard_after_forward=False)
    four = estimate(LLAMA8B, H100, 8, base)
    one = estimate(LLAMA8B, H100, 8, dc.replace(base, global_batch=8))
    assert four.breakdown_s["dp_communication"] == pytest.approx(one.breakdown_s["dp_communication"], rel=1e-12)
    kept = estimate(LLAMA8B, H100, 8, dc.replace(base, grad_sync="micro-batch"))
    assert four.breakdown_s["dp_communication"] < kept.breakdown_s["dp_communication"]


def test_grad_sync_changes_nothing_with_one_micro_batch():
    base = Strategy(dp=8, zero=3, global_batch=8, micro_batch=1, recompute=Recompute.FULL, flash_attention=True)
    every = estimate(LLAMA8B, H100, 8, base)
    once = estimate(LLAMA8B, H100, 8, dc.replace(base, grad_sync="step"))
    assert once.memory_bytes == every.memory_bytes and once.step_time_s == every.step_time_s


def test_last_stage_memory():
    """pp 1: the last rank is the only one. pp 4, 1F1B, no recomputation: the first rank holds 4 micro-batches of
    its 8 layers, the last rank one, plus the logits, so the first is the busiest; with full recomputation the
    layers keep only their inputs and the last rank's logits make it the busiest, reported as the device's."""
    one = estimate(LLAMA8B, H100, 8, Strategy(dp=8, global_batch=64, micro_batch=1, recompute=Recompute.FULL,
                                              flash_attention=True, zero=1))
    assert one.memory_last_stage_bytes == one.memory_per_device_bytes
    kept = Strategy(pp=4, dp=8, global_batch=64, micro_batch=1, flash_attention=True, zero=1)
    piped = estimate(LLAMA8B, H100, 32, kept)
    assert 0 < piped.memory_last_stage_bytes < piped.memory_per_device_bytes
    recomputed = estimate(LLAMA8B, H100, 32, dc.replace(kept, recompute=Recompute.FULL))
    assert recomputed.memory_last_stage_bytes == recomputed.memory_per_device_bytes


def test_estimate_prints_the_last_stage_where_it_differs(capsys):
    from cli_run import run

    args = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "64",
            "--flash-attention", "--zero", "1"]
    code, out, err = run(capsys, *args, "--devices", "32", "--pp", "4", "--dp", "8")
    assert code == 0, err
    assert "last pipeline stage, total" in out and "the rank Megatron-LM logs memory from" in out
    code, out, err = run(capsys, *args, "--devices", "8", "--dp", "8")
    assert code == 0, err
    assert "last pipeline stage" not in out
