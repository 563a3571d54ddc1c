"""The workload seam: what a workload family must give the rest of comet-dse (docs/architecture.md).

A family is one kind of model with its own cost kernel: the decoder-only transformer first
(workload/transformer.py), recommendation models next. Everything above this floor (the search engine, sweeps,
estimate, what-if, plan, the explorer) reaches a model's costs only through its family, found by the model's
type (``family_of``) or by the ``family:`` key of a model file (``family_named``), so a second family is a
second ``WorkloadFamily`` value in ``FAMILIES``, not an ``if`` in the code that uses it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class TooManyRows(Exception):
    """A family's ``degree_rows`` found more rows than the ``max_rows`` it was given (raised as soon as it does)."""


@dataclass(frozen=True)
class WorkloadFamily:
    """What one workload family gives the cost kernel's callers and the search engine.

    name: how model files name it (``family: transformer``) and outputs show it.
    model_type: the class of its model specs (model/spec.py: Transformer). A model spec also has ``name``
      and ``total_params()`` [parameters], which economics and checkpoints read.
    load: (mapping read from a model file, field prefix for errors) -> a model spec; InputError on bad input.
    evaluate: (model, cluster, devices, StrategyArrays) -> cost/step.py's StepArrays: step time with its
      breakdown by the parts of docs/vocabulary.md [s], memory per device by part [bytes], where it fits,
      model and hardware FLOPs, MFU, tokens per second; one array entry per design point.
    violations: (model, cluster, devices, StrategyArrays, StepArrays) -> [(rule code, mask of the points that
      break it, reason(i) -> one line)], in the order of ``rules``.
    rules: the rule codes, in the bit order of a result table's ``infeasible_mask``.
    rule_text: rule code -> what breaking it means, one line.
    degree_rows: (model, devices, global batch, search space, max_rows or None) -> the rows of the strategy
      knobs a search derives from the model and device count (``degree_columns``, in that order); raises
      TooManyRows past ``max_rows`` and InputError where no row exists. The search space is read through
      ``given(name)``, ``mp``, ``max_tp``, ``max_micro_batch`` and ``max_interleave`` (design_space/space.py).
    degree_columns: the knob names of those rows.
    unit: what one of its throughput's units is ("tokens" for a transformer, "samples" for a recommendation
      model); StepArrays.tokens_per_second counts them.
    table_knobs: the knobs a search table always shows for it (others only where they vary).
    time_parts: the parts of a step's time (base/vocabulary.py TIME_PARTS keys) its kernel can make non-zero,
      which text output lists (its StepArrays.breakdown holds every part, zero for the others).
    reads: the knobs its kernel reads beyond ``degree_columns`` and the global batch; a search holds every
      other knob at its default for it (empty: it reads them all).
    """

    name: str
    model_type: type
    load: Callable
    evaluate: Callable
    violations: Callable
    rules: tuple
    rule_text: dict
    degree_rows: Callable
    degree_columns: tuple
    unit: str = "tokens"
    table_knobs: tuple = ()
    time_parts: tuple = ()
    reads: tuple = ()

    @property
    def strategy_knobs(self) -> tuple | None:
        """The knobs a strategy text names for it: those its tables show and its kernel reads; None (every
        knob) for a family that reads them all."""
        return (*self.table_knobs, *self.reads) if self.reads else None

    def __post_init__(self) -> None:
        if set(self.rule_text) != set(self.rules):
            raise ValueError(f"{self.name}: rule_text must describe exactly the rules")
