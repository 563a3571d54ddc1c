"""The per-layout and per-micro-batch-shape caches: which terms are computed once per distinct key.

A sweep of millions of points has a few hundred distinct parallel layouts (the knobs declared ``layout=True``,
``LAYOUT_KNOBS``) and a few hundred distinct micro-batch shapes (``MICROBATCH_KNOBS`` and the TP and DP strides
of the placement). ``layout_grouped`` computes cost/layout.py's terms and ``microbatch_terms_grouped``
cost/microbatch_pass.py's once per distinct key (cost/distinct.py: grouped); ``layout_of`` gathers the layouts back
to every point. Bit-identical to computing every point.
"""
from __future__ import annotations

from comet_dse.cost.distinct import gathered, grouped
from comet_dse.cost.layout import Layout, layout_terms
from comet_dse.cost.microbatch_pass import microbatch_terms
from comet_dse.cost.shapes import context_of
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import LAYOUT_KNOBS, MICROBATCH_KNOBS


def layout_of(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays, context=None) -> Layout:
    """``layout_terms`` for every point of ``st``, computed once per distinct layout (cost/distinct.py).
    ``context``: StrategyArrays -> Context (default ``context_of``), to share one between callers."""
    at_groups, rows = layout_grouped(model, cluster, devices, st, context)
    return at_groups if rows is None else gathered(at_groups, rows[1])


def layout_grouped(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays, context=None) -> tuple:
    """(the Layout of one point per distinct layout, (first, inverse)), or (every point's Layout, None) where
    the batch is not grouped (cost/distinct.py: grouped)."""
    context = context or (lambda sub: context_of(model, cluster, devices, sub))
    columns = [getattr(st, name) for name in LAYOUT_KNOBS]
    return grouped(st, columns, lambda sub: layout_terms(model, st=sub, ctx=context(sub)))


def microbatch_terms_grouped(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays,
                             strides: dict, context=None) -> tuple:
    """(microbatch_terms of one point per distinct micro-batch shape, (first, inverse)), or (every point's
    terms, None) where the batch is not grouped (cost/distinct.py: grouped).

    The key is the knobs declared ``microbatch=True`` on Strategy (``MICROBATCH_KNOBS``) and the TP and DP
    strides of the placement (``strides``, StrategyArrays.strides; they fix the spans of the TP, CP and EP
    groups). ``context``: StrategyArrays -> Context (default ``context_of``)."""
    context = context or (lambda sub: context_of(model, cluster, devices, sub))
    columns = [getattr(st, f) for f in MICROBATCH_KNOBS] + [strides["tp"], strides["dp"]]
    return grouped(st, columns, lambda sub: microbatch_terms(model, context(sub), sub))
