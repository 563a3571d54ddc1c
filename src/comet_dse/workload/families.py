"""Every workload family, and finding a model's (the workload seam: workload/family.py)."""
from __future__ import annotations

from comet_dse.base.errors import InputError
from comet_dse.workload.family import WorkloadFamily
from comet_dse.workload.recommendation import RECOMMENDATION
from comet_dse.workload.transformer import TRANSFORMER

FAMILIES = (TRANSFORMER, RECOMMENDATION)   # a new family is one more entry (docs/architecture.md, "The workload seam")
DEFAULT = TRANSFORMER           # a model file without a family: key


def family_of(model) -> WorkloadFamily:
    """The family whose model specs ``model`` is one of."""
    for family in FAMILIES:
        if isinstance(model, family.model_type):
            return family
    raise TypeError(f"{type(model).__name__} is not the model of any workload family")


def family_named(name, where: str = "model.family") -> WorkloadFamily:
    """The family a model file names (``family: transformer``); InputError naming ``where`` otherwise."""
    for family in FAMILIES:
        if name == family.name:
            return family
    raise InputError(where, f"must be one of {', '.join(f.name for f in FAMILIES)}, got {name!r}")


def transformer_only(model, what: str) -> None:
    """InputError naming the model when ``what`` (a command or API function) does not take its family yet."""
    if not isinstance(model, TRANSFORMER.model_type):
        raise InputError("model", f"{model.name} is a {family_of(model).name} model; {what} takes transformers "
                         "only so far (estimate, search, whatif and studies take every family)")
