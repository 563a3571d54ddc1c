"""A batch of design points evaluated into columns: one row per point.

The numbers come from the model's workload family (workload/family.py: ``evaluate`` and ``violations``;
for a transformer cost/step.py and cost/feasibility.py), the same that ``estimate`` uses; this module only
names and packs them. Infeasibility is a bit mask over the family's rule codes, so that millions of rows can
be counted by reason without strings.
"""
from __future__ import annotations

import numpy as np

from comet_dse.base.allocator import keep_freed_memory
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import KNOBS
from comet_dse.whole_run import economics
from comet_dse.workload.families import DEFAULT, family_of

# The rule codes of result tables and what each means: the default family's (a table's codes are its family's,
# workload/family.py; today every family is the transformer).
RULES, RULE_TEXT = DEFAULT.rules, DEFAULT.rule_text

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
        family = family_of(model)
        step = family.evaluate(model, cluster, devices, st)
        rules = family.violations(model, cluster, devices, st, step)
    mask = np.zeros(len(st), dtype=np.int64)
    for code, broken, _ in rules:
        if np.any(broken):          # most rules break no point of a batch: nothing to set
            mask |= np.asarray(broken, dtype=np.int64) << family.rules.index(code)
    cols = {k.name: k.column(getattr(st, k.name)) for k in KNOBS}
    cols.update({
        "feasible": mask == 0, "infeasible_mask": mask,
        "step_time_s": step.step_time, "tokens_per_second": step.tokens_per_second,
        "mfu": step.mfu, "hfu": step.hfu,
        "memory_per_device_bytes": step.memory_total, "hbm_bytes": step.hbm_bytes,
        "expansion_bytes": step.expansion_bytes,
        **({"host_bytes": step.host_bytes} if step.host_bytes is not None else {}),
    })
    cols.update({f"time_{k}_s": np.broadcast_to(v, step.step_time.shape) for k, v in step.breakdown.items()})
    cols.update({f"memory_{k}_bytes": np.broadcast_to(v, step.step_time.shape) for k, v in step.memory.items()})
    return cols


def economic_columns(cluster, devices: int, cols: dict, tokens: float | None, parameters: float) -> dict:
    """The price and power of each point's cluster at its design (whole_run/economics.py: per-unit prices and powers
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


def reason_counts(masks: np.ndarray, rules: tuple = RULES) -> dict:
    """Rule code -> number of points that break it (a point may break several); ``rules``: the codes of the
    table's workload family, in bit order (default the transformer's)."""
    return {code: int(np.count_nonzero(masks & (1 << i))) for i, code in enumerate(rules)
            if np.any(masks & (1 << i))}
