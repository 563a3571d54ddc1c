"""Exhaustive strategy search for one model on one cluster: evaluate every point, rank, count reasons."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.explore.space import SearchSpace, enumerate_strategies
from comet_dse.explore.table import decode, evaluate_columns, reason_counts
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy import GradAccumulation, Recompute, Strategy


@dataclass
class SearchResult:
    """Every evaluated point (columns), the feasible ones ranked, and infeasible counts by rule."""

    columns: dict
    ranked: np.ndarray          # row indices of feasible points, fastest first
    infeasible_by_rule: dict

    @property
    def evaluated(self) -> int:
        return len(self.columns["step_time_s"])

    @property
    def feasible(self) -> int:
        return len(self.ranked)


def search(model: Transformer, cluster: Cluster, devices: int, global_batch: int,
           space: SearchSpace | None = None) -> SearchResult:
    """Evaluate every strategy of ``space`` and rank the feasible ones by step time."""
    space = space or SearchSpace()
    cluster.dim_sizes(devices)
    st = enumerate_strategies(model, devices, global_batch, space)
    cols = evaluate_columns(model, cluster, devices, st)
    feasible = np.flatnonzero(cols["feasible"])
    ranked = feasible[np.argsort(cols["step_time_s"][feasible], kind="stable")]
    infeasible = cols["infeasible_mask"][~cols["feasible"]]
    return SearchResult(columns=cols, ranked=ranked, infeasible_by_rule=reason_counts(infeasible))


def strategy_at(columns: dict, row: int) -> Strategy:
    """The Strategy of one row of evaluated columns (to re-run it through ``estimate``)."""
    return Strategy(
        tp=int(columns["tp"][row]), pp=int(columns["pp"][row]), dp=int(columns["dp"][row]),
        global_batch=int(columns["global_batch"][row]), micro_batch=int(columns["micro_batch"][row]),
        interleave=int(columns["interleave"][row]),
        recompute=Recompute(decode("recompute", int(columns["recompute"][row]))),
        sequence_parallel=bool(columns["sequence_parallel"][row]), zero=int(columns["zero"][row]),
        dtype=decode("dtype", int(columns["dtype"][row])),
        flash_attention=bool(columns["flash_attention"][row]),
        dp_overlap=bool(columns["dp_overlap"][row]),
        grad_accumulation=GradAccumulation.FUSED if columns["grad_fused"][row] else GradAccumulation.SEPARATE,
        placement=decode("placement", int(columns["placement"][row])),
        cp=int(columns["cp"][row]), ep=int(columns["ep"][row]), moe_imbalance=float(columns["moe_imbalance"][row]),
        ep_overlap=bool(columns["ep_overlap"][row]), tp_overlap=bool(columns["tp_overlap"][row]),
        cp_algorithm="all-gather" if columns["cp_all_gather"][row] else "ring",
        ep_fp8_dispatch=bool(columns["ep_fp8_dispatch"][row]),
    )
