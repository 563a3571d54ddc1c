"""The decoder-only transformer as a workload family: the first user of the workload seam (workload/family.py).

Its cost kernel is cost/ (cost/step.py: evaluate), its validity rules cost/feasibility.py, its model files
model/load.py. What it adds here is the part of the strategy space a search derives from the model: the
parallel degrees (tp, cp, pp, dp, ep), micro-batch sizes and interleaving (``degree_rows``); every other
knob takes its declared values (design_space/space.py).
"""
from __future__ import annotations

from comet_dse.base.bounds import BOUNDS
from comet_dse.base.vocabulary import TIME_PARTS
from comet_dse.base.divisors import divisors
from comet_dse.base.errors import InputError
from comet_dse.cost.feasibility import RULES, RULE_TEXT, violations
from comet_dse.cost.step import evaluate
from comet_dse.model.load import transformer_from
from comet_dse.model.spec import Transformer
from comet_dse.strategy.choices import EmbeddingSharding
from comet_dse.workload.family import TooManyRows, WorkloadFamily

MIN_CP_TOKENS = 4096   # default CP degrees keep at least this many tokens per device


def _degree_tuples(model: Transformer, devices: int, space) -> list:
    """(tp, cp, pp, dp) with tp * cp * pp * dp = devices, within the allowed values."""
    s = model.seq_len
    tps, pps, dps, cps = (space.given(n) for n in ("tp", "pp", "dp", "cp"))
    if cps is not None:
        cps = [c for c in cps if devices % c == 0]
    else:
        cps = [c for c in divisors(s) if s // c >= min(MIN_CP_TOKENS, s) and devices % c == 0]
    out = []
    for cp in cps:
        for tp in divisors(devices // cp):
            if tps is not None and tp not in tps:
                continue
            if tps is None and space.max_tp is not None and tp > space.max_tp:
                continue
            for pp in divisors(devices // (cp * tp)):
                dp = devices // (tp * cp * pp)
                if space.mp is not None and tp * pp not in space.mp:
                    continue
                if (pps is None or pp in pps) and (dps is None or dp in dps):
                    out.append((tp, cp, pp, dp))
    return out


def _expert_degrees(model: Transformer, dp: int, space) -> list:
    if space.given("ep") is not None:
        return list(space.given("ep"))
    if not model.moe:
        return [1]
    return [e for e in divisors(dp) if model.moe.experts % e == 0]


def _micro_batches(global_batch: int, dp: int, space) -> list:
    if global_batch % dp:
        return [1]  # kept so that the batch rule reports it
    per_replica = global_batch // dp
    given = space.given("micro_batch")
    if given is not None:
        return [b for b in given if b <= per_replica] or [min(given)]
    return [b for b in divisors(per_replica) if b <= space.max_micro_batch]


def _interleaves(layers: int, pp: int, space) -> list:
    """Virtual stages per device a search tries: every v up to max_interleave that cuts the layers into pp x v
    even chunks, with the embedding and the loss each in a layer's slot or not (Megatron-LM needs one or the
    other: num_layers, or num_layers + 2 with account-for-embedding/loss, divisible by pp x v). Llama 3 405B's
    126 layers on 16 stages take 8 chunks only with the embedding-loss split (the pipeline_split rule)."""
    if pp == 1:
        return [1]
    if space.given("interleave") is not None:
        return list(space.given("interleave"))
    found = {v for slots in (layers, layers + 2) if slots % pp == 0
             for v in divisors(slots // pp) if v <= space.max_interleave}
    return sorted(found) or [1]


DEGREES = ("tp", "pp", "dp", "micro_batch", "interleave", "cp", "ep", "embedding_sharding")   # the outer rows' columns
TABLE_WISE = EmbeddingSharding.TABLE_WISE.code      # a transformer has no embedding tables to shard: the default


def degree_rows(model: Transformer, devices: int, global_batch: int, space,
                max_rows: int | None = None) -> list:
    """The DERIVED degrees: (tp, pp, dp, micro_batch, interleave, cp, ep, embedding_sharding) rows, in
    enumeration order (embedding_sharding, a recommendation model's, at its default).

    ``space``: the search's SearchSpace (design_space/space.py), read through ``given(knob)``, ``mp``,
    ``max_tp``, ``max_micro_batch`` and ``max_interleave``. The device count and the global batch are checked
    against bounds.BOUNDS first (their divisors are enumerated); more than ``max_rows`` rows is refused as soon
    as the row past it is found (TooManyRows)."""
    devices = BOUNDS["devices"].check_integer("devices", devices)
    global_batch = BOUNDS["global_batch"].check_integer("global_batch", global_batch)
    outer = []
    for tp, cp, pp, dp in _degree_tuples(model, devices, space):
        for ep in _expert_degrees(model, dp, space):
            for mb in _micro_batches(global_batch, dp, space):
                for v in _interleaves(model.layers, pp, space):
                    outer.append((tp, pp, dp, mb, v, cp, ep, TABLE_WISE))
                    if max_rows is not None and len(outer) > max_rows:
                        raise TooManyRows()
    if not outer and space.mp is not None:
        dps = space.given("dp")
        raise InputError("strategy.mp", f"no split MP x DP (x CP) of {devices} devices has MP = tp*pp in "
                         f"{list(space.mp)}{f' and dp in {list(dps)}' if dps else ''} (with the tp, pp and cp "
                         "values allowed); MP x DP x CP must equal the device count")
    if not outer:
        given = {n: space.given(n) or "any" for n in ("tp", "cp", "pp", "dp")}
        raise InputError("strategy.tp", f"no allowed tp, cp, pp and dp values multiply to {devices} devices "
                         f"({', '.join(f'{n}: {v}' for n, v in given.items())})")
    return outer


TRANSFORMER = WorkloadFamily(
    name="transformer", model_type=Transformer, load=transformer_from, evaluate=evaluate, violations=violations,
    rules=RULES, rule_text=RULE_TEXT, degree_rows=degree_rows, degree_columns=DEGREES,
    table_knobs=("tp", "cp", "ep", "pp", "dp", "micro_batch", "interleave", "recompute", "sequence_parallel", "zero"),
    time_parts=tuple(p.key for p in TIME_PARTS if p.key != "embedding_communication"))
