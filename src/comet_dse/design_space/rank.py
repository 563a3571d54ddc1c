"""Ranking a sweep: top-k per cluster variant, speedup over the baseline, Pareto fronts.

Summaries are computed per chunk as it finishes (a few rows each) and merged
at the end, so ranking never needs the whole result table in memory.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from comet_dse.base.jsonout import plain
from comet_dse.design_space.table import reason_counts
from comet_dse.strategy.declared import KNOBS
from comet_dse.base.vocabulary import FRONTS# the Pareto fronts: key, column with and without a token budget

# Every strategy knob, then the results kept for each of the best rows.
ROW_FIELDS = tuple(k.name for k in KNOBS) + (
    "step_time_s", "tokens_per_second", "mfu", "hfu", "memory_per_device_bytes", "expansion_bytes", "cost_usd",
    "power_w", "productive_time_s", "goodput", "time_to_train_s", "device_time_s", "average_power_w", "energy_j",
    "training_cost_rent_usd", "training_cost_own_usd", "training_cost_usd")


def chunk_summary(table: pa.Table, top_k: int, rules: tuple | None = None) -> dict:
    """Counts and the top_k fastest feasible rows of one finished chunk, as plain JSON values (jsonout.plain:
    a cost or power the cluster does not give is None, not NaN), so that a summary read back from its
    file equals the one a run keeps in memory; ``rules``: the rule codes of the chunk's model's workload family
    (default the transformer's)."""
    feasible = table.column("feasible").to_numpy(zero_copy_only=False)
    times = table.column("step_time_s").to_numpy()
    masks = table.column("infeasible_mask").to_numpy()
    rows = np.flatnonzero(feasible)
    best = rows[np.argsort(times[rows], kind="stable")[:top_k]]
    names = [n for n in ROW_FIELDS if n in table.column_names]
    first = {name: table.column(name)[0].as_py() for name in ("model", "devices", "variant")}
    return {
        **first,
        "points": table.num_rows,
        "feasible": int(len(rows)),
        "infeasible_by_rule": reason_counts(masks, *(() if rules is None else (rules,))),
        "top": plain([{name: table.column(name)[int(i)].as_py() for name in names} for i in best]),
    }


def merge(summaries: list, variants: list, baseline: int, top_k: int, token_budget: float | None) -> dict:
    """Per (model, devices, variant): counts, top_k, best; speedup over the baseline; Pareto fronts. The cost
    of training (``training_cost_usd`` of every row) is on one basis for the whole table, the baseline
    cluster's (``cost_basis``): a variant without a figure for it has none (null), never its own basis's."""
    from comet_dse.whole_run.economics import cost_basis, cost_column

    basis = cost_basis(variants[baseline].cluster)
    groups = {}
    for s in summaries:
        key = (s["model"], s["devices"], s["variant"])
        g = groups.setdefault(key, {"model": s["model"], "devices": s["devices"], "variant": s["variant"],
                                    "label": variants[s["variant"]].label, "points": 0, "feasible": 0,
                                    "infeasible_by_rule": {}, "top": []})
        g["points"] += s["points"]
        g["feasible"] += s["feasible"]
        for code, n in s["infeasible_by_rule"].items():
            g["infeasible_by_rule"][code] = g["infeasible_by_rule"].get(code, 0) + n
        g["top"] = sorted(g["top"] + s["top"], key=lambda r: r["step_time_s"])[:top_k]
    for g in groups.values():
        for row in g["top"]:
            if cost_column(basis) in row:
                row["training_cost_usd"] = row[cost_column(basis)]
    rows = sorted(groups.values(), key=lambda g: (g["model"], g["devices"], g["variant"]))
    for g in rows:
        g["best"] = g["top"][0] if g["top"] else None
    for g in rows:
        base = groups.get((g["model"], g["devices"], baseline))
        base_best = base["best"] if base else None
        g["speedup"] = (base_best["step_time_s"] / g["best"]["step_time_s"]
                        if g["best"] and base_best else None)
        if g["best"] and token_budget:
            g["time_to_train_s"] = g["best"].get("time_to_train_s")
    fronts = {f.key: pareto(rows, f.column_for(token_budget), token_budget) if f.column_for(token_budget) else []
              for f in FRONTS}
    return {"variants": rows, "baseline": variants[baseline].label, "token_budget": token_budget,
            "cost_basis": basis, **fronts}


def pareto(rows: list, resource: str, token_budget: float | None) -> list:
    """The (model, devices, variant) bests not dominated in (time, resource): both lower is better.

    Time is time-to-train for the token budget when one is given, else step time. ``resource``: a column
    of ROW_FIELDS (cost_usd, power_w, training_cost_usd, energy_j). Rows without a figure are left out.
    """
    out = []
    for model in sorted({r["model"] for r in rows}):
        points = [r for r in rows if r["model"] == model and r["best"] is not None
                  and r["best"].get(resource) is not None and not math.isnan(r["best"][resource])]

        def time_of(r):
            """Time to train (goodput included: whole_run/economics.py) with a budget, else the step time."""
            if token_budget:
                known = r["best"].get("time_to_train_s")
                return known if known is not None else token_budget / r["best"]["tokens_per_second"]
            return r["best"]["step_time_s"]

        points.sort(key=lambda r: (r["best"][resource], time_of(r)))
        best_time = math.inf
        for r in points:
            if time_of(r) < best_time:
                out.append({"model": model, "devices": r["devices"], "variant": r["variant"], "label": r["label"],
                            resource: r["best"][resource], "time_s": time_of(r)})
                best_time = time_of(r)
    return out
