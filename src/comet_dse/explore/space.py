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
from comet_dse.strategy import DTYPE_CHOICES, PLACEMENTS, RECOMPUTE_CODES, Recompute, StrategyArrays, check_choices

MIN_CP_TOKENS = 4096   # default CP degrees keep at least this many tokens per device


def divisors(n: int) -> list:
    """Positive divisors of n, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class SearchSpace:
    """Which values each strategy axis may take; None means every valid value.

    tp, pp: degrees (default: every divisor of the device count).
    cp: context-parallel degrees (default: divisors of the sequence that leave at
      least 4096 tokens per device, so only 1 for short sequences).
    ep: expert-parallel degrees (default: for MoE models every common divisor of
      the experts and dp; 1 for dense models).
    micro_batch: sequences per micro-batch (default: divisors of the per-replica
      batch up to max_micro_batch).
    interleave: virtual stages (default: divisors of the layers per stage up to max_interleave).
    recompute, sequence_parallel, zero, placement: choices to try.
    dtype, flash_attention, dp_overlap, grad_fused, moe_imbalance, ep_overlap,
      tp_overlap, cp_algorithm, ep_fp8_dispatch: fixed for the whole search.
    """

    tp: tuple | None = None
    pp: tuple | None = None
    cp: tuple | None = None
    ep: tuple | None = None
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
    moe_imbalance: float = 1.0
    ep_overlap: bool = False
    tp_overlap: bool = False
    cp_algorithm: str = "ring"
    ep_fp8_dispatch: bool = False

    def __post_init__(self) -> None:
        for value in self.recompute:
            if value not in {r.value for r in Recompute}:
                raise InputError("strategy.recompute", f"must be none, selective or full, got {value!r}")
        check_choices(lambda field: f"strategy.{field}", self.dtype, self.zero, self.placement,
                      self.cp_algorithm, self.ep_fp8_dispatch, self.moe_imbalance)


def _degree_tuples(model: Transformer, devices: int, space: SearchSpace) -> list:
    """(tp, cp, pp, dp) with tp * cp * pp * dp = devices, within the allowed values."""
    s = model.seq_len
    if space.cp is not None:
        cps = [c for c in space.cp if devices % c == 0]
    else:
        cps = [c for c in divisors(s) if s // c >= min(MIN_CP_TOKENS, s) and devices % c == 0]
    out = []
    for cp in cps:
        for tp in divisors(devices // cp):
            if space.tp is not None and tp not in space.tp:
                continue
            for pp in divisors(devices // (cp * tp)):
                if space.pp is None or pp in space.pp:
                    out.append((tp, cp, pp, devices // (tp * cp * pp)))
    return out


def _expert_degrees(model: Transformer, dp: int, space: SearchSpace) -> list:
    if space.ep is not None:
        return list(space.ep)
    if not model.moe:
        return [1]
    return [e for e in divisors(dp) if model.moe.experts % e == 0]


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
    for tp, cp, pp, dp in _degree_tuples(model, devices, space):
        for ep in _expert_degrees(model, dp, space):
            for mb in _micro_batches(global_batch, dp, space):
                for v in _interleaves(model.layers, pp, space):
                    outer.append((tp, pp, dp, mb, v, cp, ep))
    if not outer:
        raise InputError("strategy.tp", f"no allowed tp, cp and pp values divide {devices} devices "
                         f"(tp: {space.tp or 'any'}, cp: {space.cp or 'default'}, pp: {space.pp or 'any'})")
    inner = [(RECOMPUTE_CODES[Recompute(rc)], sp, z, PLACEMENTS.index(pl))
             for rc in space.recompute for sp in space.sequence_parallel for z in space.zero for pl in space.placement]
    o = np.array(outer, dtype=float)
    i = np.array(inner, dtype=float)
    # Columns: tp pp dp mb v cp ep | recompute sp zero placement
    rows = np.concatenate([np.repeat(o, len(i), axis=0), np.tile(i, (len(o), 1))], axis=1)
    tp, dp, sp, zero = rows[:, 0], rows[:, 2], rows[:, 8] > 0, rows[:, 9]
    # Drop duplicates that cannot differ: SP with tp = 1, ZeRO with dp = 1.
    keep = ~(sp & (tp == 1)) & ~((zero > 0) & (dp == 1))
    if not np.any(keep):
        keep = np.ones(len(rows), dtype=bool)
    rows = rows[keep]
    n = len(rows)
    return StrategyArrays(
        tp=rows[:, 0], pp=rows[:, 1], dp=rows[:, 2], global_batch=np.full(n, float(global_batch)),
        micro_batch=rows[:, 3], interleave=rows[:, 4], recompute=rows[:, 7].astype(int),
        sequence_parallel=rows[:, 8] > 0, zero=rows[:, 9].astype(int),
        dtype=np.full(n, DTYPE_CHOICES.index(space.dtype)), dp_overlap=np.full(n, space.dp_overlap),
        flash_attention=np.full(n, space.flash_attention), grad_fused=np.full(n, space.grad_fused),
        placement=rows[:, 10].astype(int), cp=rows[:, 5], ep=rows[:, 6], moe_imbalance=np.full(n, space.moe_imbalance),
        ep_overlap=np.full(n, space.ep_overlap), tp_overlap=np.full(n, space.tp_overlap),
        cp_all_gather=np.full(n, space.cp_algorithm == "all-gather"), ep_fp8_dispatch=np.full(n, space.ep_fp8_dispatch),
    )
