"""Recommendation models (DLRM, DLRM-DCNv2) as a workload family: the second user of the workload seam
(workload/family.py).

Its cost kernel and rules are cost/recommendation.py, its model files model/recommendation.py. A search derives
the layout from the model: the dense part data-parallel on every device (dp = devices, one micro-batch of
global batch / devices, no tensor, pipeline, context or expert parallelism) and each embedding sharding the
model allows (``degree_rows``: column-wise only where the devices divide the embedding dim).
"""
from __future__ import annotations

from comet_dse.base.bounds import BOUNDS
from comet_dse.base.errors import InputError
from comet_dse.cost.recommendation import RULES, RULE_TEXT, evaluate, violations
from comet_dse.model.recommendation import Recommendation, recommendation_from
from comet_dse.strategy.choices import EmbeddingSharding
from comet_dse.workload.family import WorkloadFamily

DEGREES = ("tp", "pp", "dp", "micro_batch", "interleave", "cp", "ep", "embedding_sharding")


def _shardings(model: Recommendation, devices: int, space) -> list:
    """The shardings a search tries: the given ones, or every one the model allows on ``devices``."""
    given = space.given("embedding_sharding")
    if given is not None:
        return [EmbeddingSharding(g) for g in given]
    return [s for s in EmbeddingSharding if s is not EmbeddingSharding.COLUMN_WISE or model.dim % devices == 0]


def degree_rows(model: Recommendation, devices: int, global_batch: int, space, max_rows: int | None = None) -> list:
    """One row per embedding sharding: (tp, pp, dp, micro_batch, interleave, cp, ep, embedding_sharding) =
    (1, 1, devices, global_batch / devices, 1, 1, 1, sharding). A global batch the devices do not divide keeps
    one micro-batch of 1, so that the batch rule reports it; parallel degrees other than 1 are refused."""
    devices = BOUNDS["devices"].check_integer("devices", devices)
    global_batch = BOUNDS["global_batch"].check_integer("global_batch", global_batch)
    for knob in ("tp", "pp", "cp", "ep", "interleave"):
        values = space.given(knob)
        if values is not None and tuple(values) != (1,):
            raise InputError(f"strategy.{knob}", f"a recommendation model has no {knob} other than 1 (its dense "
                             f"part is data-parallel on every device), got {list(values)}")
    dps = space.given("dp")
    if dps is not None and tuple(dps) != (devices,):
        raise InputError("strategy.dp", f"a recommendation model runs data-parallel on all {devices} devices, "
                         f"got dp {list(dps)}")
    micro = global_batch // devices if global_batch % devices == 0 else 1
    return [(1, 1, devices, micro, 1, 1, 1, s.code) for s in _shardings(model, devices, space)]


RECOMMENDATION = WorkloadFamily(
    name="recommendation", model_type=Recommendation, load=recommendation_from, evaluate=evaluate,
    violations=violations, rules=RULES, rule_text=RULE_TEXT, degree_rows=degree_rows, degree_columns=DEGREES,
    unit="samples", table_knobs=("dp", "embedding_sharding"),
    time_parts=("compute", "memory", "embedding_communication", "dp_communication", "optimizer", "offload",
                "overhead"),
    reads=("dtype", "dp_overlap", "embedding_overlap", "embedding_hierarchical"))
