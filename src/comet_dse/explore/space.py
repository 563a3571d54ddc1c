"""The strategy space: every parallelisation of a model on a number of devices.

Degrees are enumerated so that tp * pp * dp = devices always holds; every
other rule (heads divisibility, batch divisibility, interleaving, memory) is
left to the cost model's validity rules, so that a search can report how many
points each rule excluded. Choices that cannot change the result are not
enumerated twice: sequence parallelism only with tp > 1, ZeRO stages only
with dp > 1, interleaving only with pp > 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.errors import InputError
from comet_dse.model.spec import Transformer
from comet_dse.strategy import DTYPE_CHOICES, PLACEMENTS, RECOMPUTE_CODES, Recompute, StrategyArrays

AXES = ("tp", "pp", "micro_batch", "interleave", "recompute", "sequence_parallel", "zero", "placement")


def divisors(n: int) -> list:
    """Positive divisors of n, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class SearchSpace:
    """Which values each strategy axis may take; None means every valid value.

    tp, pp: degrees (default: every divisor of the device count).
    micro_batch: sequences per micro-batch (default: divisors of the per-replica
      batch up to max_micro_batch).
    interleave: virtual stages (default: divisors of the layers per stage up to max_interleave).
    recompute, sequence_parallel, zero, placement: choices to try.
    dtype, flash_attention, dp_overlap, grad_fused: fixed for the whole search.
    """

    tp: tuple | None = None
    pp: tuple | None = None
    micro_batch: tuple | None = None
    interleave: tuple | None = None
    recompute: tuple = ("none", "selective", "full")
    sequence_parallel: tuple = (False, True)
    zero: tuple = (0, 1, 2, 3)
    placement: tuple = ("tp-pp-dp",)
    max_micro_batch: int = 16
    max_interleave: int = 8
    dtype: str = "bf16"
    flash_attention: bool = False
    dp_overlap: bool = True
    grad_fused: bool = True

    def __post_init__(self) -> None:
        for value in self.recompute:
            if value not in {r.value for r in Recompute}:
                raise InputError("strategy.recompute", f"must be none, selective or full, got {value!r}")
        for value in self.zero:
            if value not in (0, 1, 2, 3):
                raise InputError("strategy.zero", f"must be 0, 1, 2 or 3, got {value!r}")
        for value in self.placement:
            if value not in PLACEMENTS:
                raise InputError("strategy.placement", f"must be one of {', '.join(PLACEMENTS)}, got {value!r}")
        if self.dtype not in DTYPE_CHOICES:
            raise InputError("strategy.dtype", f"must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")


def _degree_pairs(devices: int, space: SearchSpace) -> list:
    pairs = []
    for tp in divisors(devices):
        if space.tp is not None and tp not in space.tp:
            continue
        for pp in divisors(devices // tp):
            if space.pp is None or pp in space.pp:
                pairs.append((tp, pp, devices // (tp * pp)))
    return pairs


def _micro_batches(global_batch: int, dp: int, space: SearchSpace) -> list:
    if global_batch % dp:
        return [1]  # kept so that the batch rule reports it
    per_replica = global_batch // dp
    if space.micro_batch is not None:
        return [b for b in space.micro_batch if b <= per_replica] or [min(space.micro_batch)]
    return [b for b in divisors(per_replica) if b <= space.max_micro_batch]


def _interleaves(layers: int, pp: int, space: SearchSpace) -> list:
    if pp == 1:
        return [1]
    if space.interleave is not None:
        return list(space.interleave)
    per_stage = layers // pp if layers % pp == 0 else 0
    return [v for v in divisors(per_stage) if v <= space.max_interleave] if per_stage else [1]


def enumerate_strategies(model: Transformer, devices: int, global_batch: int, space: SearchSpace) -> StrategyArrays:
    """Every strategy of ``space`` for ``model`` on ``devices`` devices, as arrays."""
    outer = []
    for tp, pp, dp in _degree_pairs(devices, space):
        for mb in _micro_batches(global_batch, dp, space):
            for v in _interleaves(model.layers, pp, space):
                outer.append((tp, pp, dp, mb, v))
    if not outer:
        raise InputError("strategy.tp", f"no allowed tp and pp values divide {devices} devices "
                         f"(tp: {space.tp or 'any'}, pp: {space.pp or 'any'})")
    inner = [(RECOMPUTE_CODES[Recompute(rc)], sp, z, PLACEMENTS.index(pl))
             for rc in space.recompute for sp in space.sequence_parallel for z in space.zero for pl in space.placement]
    o = np.array(outer, dtype=float)
    i = np.array(inner, dtype=float)
    rows = np.concatenate([np.repeat(o, len(i), axis=0), np.tile(i, (len(o), 1))], axis=1)
    tp, pp, dp, sp, zero = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 6] > 0, rows[:, 7]
    # Drop duplicates that cannot differ: SP with tp = 1, ZeRO with dp = 1.
    keep = ~(sp & (tp == 1)) & ~((zero > 0) & (dp == 1))
    if not np.any(keep):
        keep = np.ones(len(rows), dtype=bool)
    rows = rows[keep]
    n = len(rows)
    return StrategyArrays(
        tp=rows[:, 0], pp=rows[:, 1], dp=rows[:, 2], global_batch=np.full(n, float(global_batch)),
        micro_batch=rows[:, 3], interleave=rows[:, 4], recompute=rows[:, 5].astype(int),
        sequence_parallel=rows[:, 6] > 0, zero=rows[:, 7].astype(int),
        dtype=np.full(n, DTYPE_CHOICES.index(space.dtype)), dp_overlap=np.full(n, space.dp_overlap),
        flash_attention=np.full(n, space.flash_attention), grad_fused=np.full(n, space.grad_fused),
        placement=rows[:, 8].astype(int),
    )
