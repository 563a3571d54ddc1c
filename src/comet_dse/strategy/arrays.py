"""Many strategies as parallel numpy arrays (``StrategyArrays``): the batched cost model's input."""
from __future__ import annotations

import itertools
from enum import Enum

import numpy as np

from comet_dse.strategy.choices import Dtype, Placement
from comet_dse.strategy.declared import KNOB, KNOBS, Strategy


class StrategyArrays:
    """Many strategies as parallel numpy arrays, one attribute per knob (``KNOBS``): the batched cost model's input.

    Degrees and counts are float arrays, switches bool, choices their codes
    (``Choice.code``); compare a choice with ``uses``, never with a bare number.
    """

    def __init__(self, columns: dict):
        missing = [k.name for k in KNOBS if k.name not in columns]
        extra = sorted(set(columns) - set(KNOB))
        if missing or extra:
            raise ValueError(f"StrategyArrays needs exactly the knobs; missing {missing}, unknown {extra}")
        n = len(np.atleast_1d(columns["tp"]))
        for k in KNOBS:
            array = np.asarray(columns[k.name], dtype=k.array_dtype)
            setattr(self, k.name, np.broadcast_to(array, (n,)) if array.ndim == 0 else array)

    @classmethod
    def of(cls, strategies: list) -> "StrategyArrays":
        """Stack a list of Strategy into arrays (a single strategy is a batch of one)."""
        return cls({k.name: [k.encode(getattr(s, k.name)) for s in strategies] for k in KNOBS})

    def take(self, index) -> "StrategyArrays":
        """The points at ``index`` (an integer array), as a new StrategyArrays."""
        return StrategyArrays({k.name: getattr(self, k.name)[index] for k in KNOBS})

    def strategy(self, i: int) -> Strategy:
        """The Strategy of point ``i``."""
        return Strategy(**{k.name: k.decode(getattr(self, k.name)[i]) for k in KNOBS})

    def uses(self, choice: Enum) -> np.ndarray:
        """True where the point's knob of that Enum (e.g. Recompute.FULL) takes that value."""
        name = next(k.name for k in KNOBS if k.kind is type(choice))
        return getattr(self, name) == choice.code

    def dtype_table(self, values: dict, missing: float = float("nan")):
        """Per point, ``values[dtype name]`` (``missing`` where absent): a table lookup, or a
        per-point selection when a value is itself an array over the points (calibration)."""
        return self.select(self.dtype, [values.get(d.value, missing) for d in Dtype])

    @staticmethod
    def select(codes, per_code: list):
        """Per point, ``per_code[code]``; each entry a number or an array over the points."""
        if all(np.ndim(x) == 0 for x in per_code):
            return np.array(per_code, dtype=float)[codes]
        return np.select([codes == i for i in range(len(per_code))],
                         [np.broadcast_to(np.asarray(x, dtype=float), np.shape(codes)) for x in per_code], np.nan)

    def strides(self) -> dict:
        """Device-number stride of each parallel group under each point's placement.

        The placement orders three blocks, innermost first: "tp" (TP, with CP
        just outside it), "pp" and "dp"; a block's stride is the product of the
        degrees of the blocks inside it. EP takes consecutive DP ranks (stride
        of DP); the expert-data-parallel group (dp/ep) steps over whole EP groups.
        """
        degree = {"tp": self.tp * self.cp, "pp": self.pp, "dp": self.dp}
        block = {axis: np.ones_like(self.tp, dtype=float) for axis in degree}
        for placement in Placement:
            inner = np.ones_like(self.tp, dtype=float)
            for axis in placement.value.split("-"):
                block[axis] = np.where(self.placement == placement.code, inner, block[axis])
                inner = inner * degree[axis]
        return {"tp": block["tp"], "cp": block["tp"] * self.tp, "pp": block["pp"], "dp": block["dp"],
                "ep": block["dp"], "edp": block["dp"] * self.ep}

    def __len__(self) -> int:
        return len(self.tp)


def combinations(values: dict) -> list:
    """Every combination of knob values (knob -> tuple), in the order of ``values``: [dict]."""
    names = list(values)
    return [dict(zip(names, combo)) for combo in itertools.product(*(values[n] for n in names))]
