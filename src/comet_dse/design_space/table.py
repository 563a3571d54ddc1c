"""A batch of design points evaluated into columns: one row per point.

The numbers come from the same ``cost.step.evaluate`` that ``estimate`` uses;
this module only names and packs them. Infeasibility is a bit mask over
``RULES`` (the codes of cost/feasibility.py), so that millions of rows can be
counted by reason without strings.
"""
from __future__ import annotations

import numpy as np

from comet_dse.whole_run import economics
from comet_dse.base.allocator import keep_freed_memory
from comet_dse.cost.feasibility import violations
from comet_dse.cost.step import evaluate
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.declared import KNOBS
from comet_dse.strategy.arrays import StrategyArrays

RULES = ("devices", "tp_heads", "tp_kv_heads", "tp_ffn", "batch", "pp_layers", "interleave",
         "interleave_batch", "sp_seq", "ep_experts", "cp_seq", "attention_kernel", "dtype", "memory", "pure_mp",
         "step_time")
RULE_TEXT = {
    "devices": "tp*pp*dp differs from the device count",
    "tp_heads": "tp does not divide the attention heads (the query columns with a column split)",
    "tp_kv_heads": "tp and the KV heads do not divide one another",
    "tp_ffn": "tp does not divide the FFN size",
    "batch": "dp*micro_batch does not divide the global batch",
    "pp_layers": "more pipeline stages than layers",
    "interleave": "interleaving needs pp > 1 and pp*interleave dividing the layers",
    "interleave_batch": "interleaving needs the micro-batches per pipeline to be a multiple of pp",
    "sp_seq": "sequence parallelism needs tp to divide the tokens per device",
    "ep_experts": "ep must divide the experts and dp (and needs a MoE model)",
    "cp_seq": "cp does not divide the sequence length",
    "attention_kernel": "the device has no rate for the attention kernel",
    "dtype": "the device has no rate for the dtype",
    "memory": "does not fit in device memory",
    "pure_mp": "pure model parallelism has no pipeline (pp must be 1)",
    "step_time": "the step time is not a positive finite number",
}


LARGE_BATCH = 10_000            # from this many points on, evaluate_columns calls keep_freed_memory


def evaluate_columns(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays) -> dict:
    """Evaluate every point of ``st``; returns column name -> numpy array (SI units, names say the unit).

    A batch of LARGE_BATCH points or more first sets this process's allocator
    to keep freed memory (``allocator.keep_freed_memory``; it helps most when
    called before a process allocates its large arrays, as the command line
    and the sweep workers do).
    """
    if len(st) >= LARGE_BATCH:
        keep_freed_memory()
    with np.errstate(divide="ignore", invalid="ignore"):
        step = evaluate(model, cluster, devices, st)
        rules = violations(model, cluster, devices, st, step)
    mask = np.zeros(len(st), dtype=np.int64)
    for code, broken, _ in rules:
        if np.any(broken):          # most rules break no point of a batch: nothing to set
            mask |= np.asarray(broken, dtype=np.int64) << RULES.index(code)
    cols = {k.name: k.column(getattr(st, k.name)) for k in KNOBS}
    cols.update({
        "feasible": mask == 0, "infeasible_mask": mask,
        "step_time_s": step.step_time, "tokens_per_second": step.tokens_per_second,
        "mfu": step.mfu, "hfu": step.hfu,
        "memory_per_device_bytes": step.memory_total, "hbm_bytes": step.hbm_bytes,
        "expansion_bytes": step.expansion_bytes,
    })
    cols.update({f"time_{k}_s": np.broadcast_to(v, step.step_time.shape) for k, v in step.breakdown.items()})
    cols.update({f"memory_{k}_bytes": np.broadcast_to(v, step.step_time.shape) for k, v in step.memory.items()})
    return cols


def economic_columns(cluster, devices: int, cols: dict, tokens: float | None, parameters: float) -> dict:
    """The price and power of each point's cluster at its design (economics.py: per-unit prices and powers
    follow the scaled resources): ``cost_usd`` = devices x the device price, ``power_w`` = the rated draw
    (every device compute-bound, nodes and switches with a figure, times PUE); with a token budget also
    economics.COLUMNS (time to train, energy, cost; ``parameters``: the model's, what a checkpoint holds).
    NaN where unknown."""
    r = economics.rates(cluster, devices)
    n = len(cols["step_time_s"])
    out = {"cost_usd": np.full(n, r.cluster_price_usd), "power_w": np.full(n, r.rated_power_w)}
    if tokens:
        breakdown = {k[len("time_"):-len("_s")]: v for k, v in cols.items() if k.startswith("time_") and k.endswith("_s")}
        out.update(economics.training(r, cols["step_time_s"], cols["tokens_per_second"], breakdown, tokens,
                                           parameters))
    return out


def reason_counts(masks: np.ndarray) -> dict:
    """Rule code -> number of points that break it (a point may break several)."""
    return {code: int(np.count_nonzero(masks & (1 << i))) for i, code in enumerate(RULES)
            if np.any(masks & (1 << i))}
