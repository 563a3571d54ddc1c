"""What a strategy knob is (``Knob``) and how a Strategy field declares one (``knob``): type, default,
help, how a search treats it, which cost terms depend on it, how the text output writes it."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

import numpy as np

from comet_dse.base.bounds import BOUNDS, shown
from comet_dse.strategy.choices import Zero

DERIVED = "derived"   # search enumerates every valid value from the model and device count
GIVEN = "given"       # one value per search, named by the command (--global-batch) or study (global_batch)
ALWAYS = "always"     # the text output shows the knob whenever it applies
CHANGED = "changed"   # ... only when it differs from the default


@dataclass(frozen=True)
class Knob:
    """What the rest of the tool needs to know about one Strategy field.

    kind: int (a positive count), float, bool, or a Choice / Zero Enum.
    search: the values a search tries when none are given (a tuple), DERIVED
      or GIVEN.
    microbatch: cost/microbatch_pass.py's per-micro-batch terms depend on it (the
      de-duplication key of those terms is every knob marked so, plus the
      placement's group strides).
    layout: cost/layout.py's per-layout terms depend on it (their
      de-duplication key is every knob marked so).
    applies: where False the value cannot change the result (SP with tp = 1):
      a search keeps only the first of its values there, and the text output
      leaves it out. Takes a Strategy or StrategyArrays; returns a bool or mask.
    label: how the text output writes it, from the value; shown: ALWAYS or CHANGED.
    line: which strategy line of the text output it goes on (0 degrees,
      1 batch, 2 memory and precision, 3 execution switches).
    short: the column heading of search tables and the compact sweep text.
    low, high: bounds of a number.
    default_text: how help texts state the default, when not the value itself.
    cluster_default: the values a search tries when it names none, where they depend on the hardware: a
      function of the accelerators of the clusters searched that returns a tuple, or None for ``search``
      (design_space.space.with_cluster_defaults applies it).
    cluster_default_text: how help texts state that hardware-dependent default.
    """

    name: str
    kind: type
    default: object
    help: str
    search: object
    microbatch: bool
    layout: bool
    applies: Callable | None
    label: Callable
    shown: str
    line: int
    short: str
    low: float | None
    high: float | None
    default_text: str | None
    cluster_default: Callable | None
    cluster_default_text: str | None = None

    @property
    def flag(self) -> str:
        """Its command-line option, e.g. --flash-attention (a switch that defaults to on: --no-dp-overlap)."""
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.kind is bool and self.default else f"--{dashed}"

    @property
    def meaning(self) -> str:
        """What a legend says it is: a switch, what its label says when on ('sequence parallel'); any other
        knob, the first phrase of its help text (before a colon, semicolon or parenthesis)."""
        if self.kind is bool:
            return self.label(True).removesuffix(" on")
        text = self.help
        for mark in (" (", ": ", "; "):
            text = text.split(mark, 1)[0]
        return text.strip()

    @property
    def is_choice(self) -> bool:
        return isinstance(self.kind, type) and issubclass(self.kind, Enum)

    @property
    def array_dtype(self):
        """numpy dtype of its StrategyArrays column: degrees and counts as float (they divide), codes as int."""
        if self.kind is bool:
            return bool
        return np.int64 if self.is_choice else np.float64

    def choices_text(self) -> str:
        if self.kind is bool:
            return "true or false (on/off)"
        if self.is_choice:
            return "one of " + ", ".join(str(m.value) for m in self.kind)
        if self.kind is int and self.low == 1:
            return f"a positive integer up to {self.high:,.0f}"
        bound = f"at least {self.low:g}" if self.high is None else f"in [{self.low:g}, {self.high:g}]"
        return f"{'an integer' if self.kind is int else 'a number'} {bound}"

    def coerce(self, value):
        """``value`` (a Python value, or text from a command line) as this knob's type; ValueError if invalid."""
        bad = ValueError(f"must be {self.choices_text()}, got {shown(value)}")
        if self.kind is bool:
            if isinstance(value, (bool, np.bool_)):
                return bool(value)
            words = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}
            if isinstance(value, str) and value.strip().lower() in words:
                return words[value.strip().lower()]
            raise bad
        if self.is_choice:
            if isinstance(value, (bool, np.bool_)):       # zero=True was ZeRO 1 (Zero is an IntEnum)
                raise bad
            try:
                return self.kind(int(value) if self.kind is Zero and isinstance(value, str) else value)
            except ValueError:
                raise bad from None
        number = _number(value, self.kind)
        if number is None or number < self.low or (self.high is not None and number > self.high):
            raise bad
        return number

    def encode(self, value):
        """Its value in a StrategyArrays column (the code of a choice)."""
        return value.code if self.is_choice else value

    def decode(self, cell):
        """The value of one StrategyArrays or result-table cell (a choice by its code, or by name as read from a file)."""
        if isinstance(cell, str):
            return self.coerce(cell)
        if self.is_choice:
            return list(self.kind)[int(cell)]
        return self.kind(cell)

    def column(self, values) -> np.ndarray:
        """Its result-table column: integers as int64, codes as int64, bools, floats."""
        if self.kind is bool:
            return np.asarray(values, dtype=bool)
        return np.asarray(values, dtype=np.float64 if self.kind is float else np.int64)


def _number(value, kind):
    if isinstance(value, str):
        try:
            value = kind(value.strip())
        except ValueError:
            return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    try:
        if kind is int:
            return int(value) if float(value) == int(value) else None
        return float(value) if np.isfinite(value) else None
    except (OverflowError, ValueError):      # too large for a float, or infinite: not a valid count
        return None


def knob(default, help: str, *, search=None, microbatch: bool = False, layout: bool = False,
         applies: Callable | None = None,
         label: Callable | None = None, shown: str = CHANGED, line: int = 3, short: str = "",
         low: float | None = None, high: float | None = None, kind: type | None = None,
         default_text: str | None = None, cluster_default: Callable | None = None,
         cluster_default_text: str | None = None):
    """A Strategy field declared as a knob (see Knob). ``search`` defaults to the default alone; an integer
    knob's ``high`` defaults to the bound of every count (bounds.BOUNDS["integer"])."""
    if (kind or type(default)) is int and high is None:
        high = BOUNDS["integer"].high
    return field(default=default, metadata={"knob": dict(
        kind=kind or type(default), default=default, help=help,
        search=(default,) if search is None else search, microbatch=microbatch, layout=layout,
        applies=applies,
        label=label, shown=shown, line=line, short=short, low=low, high=high, default_text=default_text,
        cluster_default=cluster_default, cluster_default_text=cluster_default_text)})
