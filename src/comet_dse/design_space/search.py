"""Exhaustive strategy search for one model on one cluster: evaluate every point, rank, count reasons."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.design_space.space import SearchSpace, enumerate_strategies
from comet_dse.design_space.table import economic_columns, evaluate_columns, reason_counts
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.declared import KNOBS, Strategy
from comet_dse.workload.families import family_of


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
           space: SearchSpace | None = None, tokens: float | None = None) -> SearchResult:
    """Evaluate every strategy of ``space`` and rank the feasible ones by step time (and so by time to
    train: the global batch is fixed). With ``tokens`` (a token budget) the columns hold what training on
    it takes (economics.COLUMNS) and, always, the cluster's price and rated power (table.economic_columns)."""
    space = space or SearchSpace()
    cluster.dim_sizes(devices)
    st = enumerate_strategies(model, devices, global_batch, space)
    cols = evaluate_columns(model, cluster, devices, st)
    cols.update(economic_columns(cluster, devices, cols, tokens, model.total_params()))
    feasible = np.flatnonzero(cols["feasible"])
    ranked = feasible[np.argsort(cols["step_time_s"][feasible], kind="stable")]
    infeasible = cols["infeasible_mask"][~cols["feasible"]]
    return SearchResult(columns=cols, ranked=ranked,
                        infeasible_by_rule=reason_counts(infeasible, family_of(model).rules))


def strategy_at(columns: dict, row: int) -> Strategy:
    """The Strategy of one row of evaluated columns (to re-run it through ``estimate``)."""
    return Strategy(**{k.name: k.decode(columns[k.name][row]) for k in KNOBS})
