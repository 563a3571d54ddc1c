"""``estimate(model, cluster, devices, strategy)``: one design point, a batch of one.

The math lives in the model's workload family (workload/family.py; a transformer's in cost/step.py) and runs
on arrays; this module only packs a
single Strategy into arrays and unpacks the result into a typed Estimate.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from comet_dse.base.tables import Tabular
from comet_dse.cost.feasibility import feasible_mask, reasons_for
from comet_dse.cost.layer_work import layer_phase_times
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import Strategy
from comet_dse.whole_run.economics import COLUMNS as TRAINING_COLUMNS, training_of
from comet_dse.workload.families import family_of


@dataclass(frozen=True)
class Estimate(Tabular):
    """Result of one design point. Units: seconds, bytes, FLOP; fractions 0..1.

    breakdown_s parts add up to step_time_s. memory_bytes parts add up to
    memory_per_device_bytes (the busiest pipeline stage). The time fields are
    computed for every point, but mean nothing when the strategy breaks a rule
    other than memory (``runnable`` is False): the JSON then holds null for them.
    ``training``: with a token budget (``estimate(..., tokens=)``), time to train, device time, energy and
    cost (whole_run/economics.py: economics.training_of; SI units, NaN / null where an input is unknown).
    ``error_band``: the step-time error the validation residuals give for this accelerator and precision
    (errorband.band_for; the API and the command line add it), or None. ``efficiency``: the fraction of the
    benchmark tensor rate the estimate ran at and where it comes from (measured on public runs of its family,
    assumed from the nearest family, or the physical reading; hardware/efficiency.py), added likewise.
    """

    feasible: bool
    reasons: list
    broken_rules: list
    step_time_s: float
    tokens_per_second: float
    mfu: float
    hfu: float
    memory_per_device_bytes: int
    memory_bytes: dict
    memory_tiers_bytes: dict
    breakdown_s: dict
    phases_s: dict
    model_flops_per_step: float
    hardware_flops_per_step: float
    microbatches: float
    layers_per_stage: int
    inputs: dict = field(default_factory=dict)
    training: dict | None = None
    error_band: dict | None = None    # the error to expect (errorband.band_for), where the caller adds it
    efficiency: dict | None = None    # the tensor rate it ran at (hardware/efficiency.py: efficiency_summary), likewise
    memory_last_stage_bytes: int = 0  # the last pipeline rank's memory, its reserve included (= the busiest with pp 1)

    @property
    def runnable(self) -> bool:
        """True unless a validity rule other than memory is broken (the strategy could run on a bigger device)."""
        return all(code == "memory" for code in self.broken_rules)

    def rows(self) -> list:
        """One flat row (``to_arrow()``, ``to_pandas()``): the inputs, the strategy's knobs, the result,
        ``time_<part>_s`` and ``memory_<part>_bytes``; reasons joined by '; '."""
        d = self.to_dict()
        strategy = d["inputs"].get("strategy", {})
        row = {k: v for k, v in d["inputs"].items() if k != "strategy"}
        row.update(strategy)
        row.update({k: d[k] for k in ("feasible", "step_time_s", "tokens_per_second", "mfu", "hfu",
                                      "memory_per_device_bytes", "model_flops_per_step", "microbatches")})
        row["reasons"] = "; ".join(self.reasons)
        row.update({f"time_{k}_s": v for k, v in (d["breakdown_s"] or {}).items()})
        row.update({f"memory_{k}_bytes": v for k, v in self.memory_bytes.items()})
        if self.training is not None:
            row["tokens"] = self.training["tokens"]
            row.update({k: self.training[k] if self.runnable else None for k in TRAINING_COLUMNS})
        return [row]

    def to_dict(self) -> dict:
        """The JSON contract of ``comet-dse estimate --json`` (times and rates null when not ``runnable``)."""
        timed = self.runnable
        return {
            "feasible": self.feasible,
            "reasons": list(self.reasons),
            "broken_rules": list(self.broken_rules),
            "step_time_s": self.step_time_s if timed else None,
            "tokens_per_second": self.tokens_per_second if timed else None,
            "mfu": self.mfu if timed else None,
            "hfu": self.hfu if timed else None,
            "memory_per_device_bytes": self.memory_per_device_bytes,
            "memory_bytes": dict(self.memory_bytes),
            "memory_tiers_bytes": dict(self.memory_tiers_bytes),
            "breakdown_s": dict(self.breakdown_s) if timed else None,
            "phases_s": dict(self.phases_s) if timed else None,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "microbatches": self.microbatches,
            "layers_per_stage": self.layers_per_stage,
            "memory_last_stage_bytes": self.memory_last_stage_bytes,
            "inputs": dict(self.inputs),
            "training": (dict(self.training, **{k: None for k in self.training
                                                if k in TRAINING_COLUMNS or k.endswith("_range")})
                         if not timed else dict(self.training)) if self.training is not None else None,
            "error_band": dict(self.error_band) if self.error_band is not None else None,
            "efficiency": dict(self.efficiency) if self.efficiency is not None else None,
        }


def estimate(model: Transformer, cluster: Cluster, devices: int, strategy: Strategy,
             tokens: float | None = None) -> Estimate:
    """Estimate one training iteration of ``model`` on ``devices`` devices of ``cluster``; with ``tokens``
    (a token budget, checked by the caller against bounds.BOUNDS['tokens']) also what training on them
    takes (``Estimate.training``).

    Raises InputError for input that has no meaningful estimate (a dtype the
    device cannot run, a device count the network cannot hold); every other
    problem is a reason in the result.
    """
    cluster.accelerator.flops(strategy.dtype.value)
    cluster.dim_sizes(devices)
    arrays = StrategyArrays.of([strategy])
    with np.errstate(divide="ignore", invalid="ignore"):
        family = family_of(model)
        step = family.evaluate(model, cluster, devices, arrays)
        rules = family.violations(model, cluster, devices, arrays, step)
    feasible = bool(feasible_mask(rules)[0])
    step_time = float(step.step_time[0])
    breakdown = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in step.breakdown.items()}
    training = None
    if tokens is not None:
        training = training_of(cluster, devices, step_time, float(step.tokens_per_second[0]), breakdown, tokens,
                               model.total_params())
    return Estimate(
        feasible=feasible,
        reasons=reasons_for(rules, 0),
        broken_rules=[code for code, mask, _ in rules if mask[0]],
        step_time_s=step_time,
        tokens_per_second=float(step.tokens_per_second[0]),
        mfu=float(step.mfu[0]),
        hfu=float(step.hfu[0]),
        memory_per_device_bytes=int(round(float(step.memory_total[0]))),
        memory_bytes={k: int(round(float(v[0]))) for k, v in step.memory.items()},
        memory_tiers_bytes={"hbm": int(round(float(step.hbm_bytes[0]))),
                            "expansion": int(round(float(step.expansion_bytes[0]))),
                            **({"host": int(round(float(step.host_bytes[0])))} if step.host_bytes is not None
                               else {})},
        breakdown_s=breakdown,
        phases_s={k: float(np.asarray(v).reshape(-1)[0]) for k, v in step.phases.items()},
        model_flops_per_step=float(step.model_flops[0]),
        hardware_flops_per_step=float(step.hardware_flops[0]),
        microbatches=float(step.microbatches[0]),
        layers_per_stage=int(np.asarray(step.stage_layers).reshape(-1)[0]),
        memory_last_stage_bytes=int(round(float(np.asarray(step.last_stage_memory).reshape(-1)[0]))),
        inputs={"model": model.name, "cluster": cluster.name, "devices": devices,
                "strategy": strategy.to_dict()},
        training=training,
    )


@dataclass(frozen=True)
class LayerTimes:
    """One dense transformer layer and one micro-batch on one device [s] (cost/layer_work.py: layer_phase_times)."""

    forward_s: float
    backward_s: float       # backward and recomputation, with the communication exposed during them


def layer_times(model: Transformer, cluster: Cluster, devices: int, strategy: Strategy) -> LayerTimes:
    """Forward and backward time of one layer under ``strategy``, as a per-layer profile measures them."""
    cluster.accelerator.flops(strategy.dtype.value)
    times = layer_phase_times(model, cluster, devices, StrategyArrays.of([strategy]))
    return LayerTimes(forward_s=float(times["forward"][0]), backward_s=float(times["backward"][0]))
