"""How a compiled step differs (docs/model.md, "XLA's execution"): the fp8 copy of the weights is the copy of what a
device holds (under ZeRO 3 its shard), none with fp8_fused_cast; the TPU presets' host memory takes the decoder
layer input MaxText offloads, and the published MaxText runs that offload it fit with it and not without."""
from __future__ import annotations

import pytest

import comet_dse
from comet_dse.answers.validation import gpu_runs
from comet_dse.presets.catalog import load_cluster

FSDP = dict(tp=1, pp=1, dp=64, zero=3, global_batch=64, micro_batch=1, recompute="full")


def _weights(dtype: str, **knobs) -> float:
    est = comet_dse.estimate("llama3-70b", "tpu-v7", 64, dtype=dtype, **FSDP, **knobs)
    return est.memory_bytes["weights"]


def test_the_fp8_copy_is_of_the_weights_a_device_holds():
    """The 16-bit weights a device holds under ZeRO 3 (its shard and the gathered layers, 2 bytes each) gain one
    byte each in fp8: 1.5 x; with the cast inside the matmuls, nothing."""
    bf16, kept, fused = _weights("bf16"), _weights("fp8"), _weights("fp8", fp8_fused_cast=True)
    assert kept == pytest.approx(1.5 * bf16, rel=1e-9)
    assert fused == pytest.approx(bf16, rel=1e-9)
    whole = comet_dse.estimate("llama3-70b", "tpu-v7", 64, dtype="fp8", **{**FSDP, "zero": 1})
    params = comet_dse.load_model("llama3-70b").total_params()
    assert whole.memory_bytes["weights"] == pytest.approx(3.0 * params, rel=1e-9)   # 2 + 1 bytes per parameter


def test_the_fused_cast_runs_no_cast_pass():
    """The once-per-step cast of the weights is a memory-bound pass; fused into the matmuls it is gone and the step
    is shorter by it, nothing else changes."""
    kept = comet_dse.estimate("llama3-8b", "tpu-v7", 64, dtype="fp8", **FSDP)
    fused = comet_dse.estimate("llama3-8b", "tpu-v7", 64, dtype="fp8", fp8_fused_cast=True, **FSDP)
    assert fused.step_time_s < kept.step_time_s
    assert fused.breakdown_s["compute"] == kept.breakdown_s["compute"]
    assert fused.breakdown_s["memory"] < kept.breakdown_s["memory"]
    bf16 = comet_dse.estimate("llama3-8b", "tpu-v7", 64, dtype="bf16", **FSDP)
    again = comet_dse.estimate("llama3-8b", "tpu-v7", 64, dtype="bf16", fp8_fused_cast=True, **FSDP)
    assert again.step_time_s == bf16.step_time_s and again.memory_per_device_bytes == bf16.memory_per_device_bytes


@pytest.mark.parametrize("preset", ["tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7"])
def test_every_tpu_preset_has_host_memory(preset):
    """The VM's memory over its chips (at least 48 GiB, v5e) over a PCIe link of 16-32 GB/s."""
    host = load_cluster(preset).accelerator.host
    assert host is not None and host.capacity >= 48 * 2**30 and 16e9 <= host.bandwidth <= 32e9


def test_maxtext_runs_that_offload_the_layer_input_fit_only_with_it():
    """Llama 3.1 405B on 256 TPU7x chips (MaxText's recipe offloads each decoder layer's input to the host): it fits
    with the row's activation_offload 1.0 and not with the input kept on the device."""
    run = next(r for r in gpu_runs(name="accelerators_public.csv") if r.label == "tpur-v7-llama3.1-405b-bf16-s8192-256c")
    assert run.strategy.activation_offload == 1.0
    cluster = load_cluster(run.cluster)
    offloaded = comet_dse.estimate(run.model, cluster, run.devices, **run.strategy.to_dict())
    kept = comet_dse.estimate(run.model, cluster, run.devices, **{**run.strategy.to_dict(), "activation_offload": 0.0})
    assert offloaded.feasible and not kept.feasible
    assert offloaded.memory_tiers_bytes["host"] <= cluster.accelerator.host.capacity
