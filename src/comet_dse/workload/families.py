"""Every workload family, and finding a model's (the workload seam: workload/family.py)."""
from __future__ import annotations

from comet_dse.base.errors import InputError
from comet_dse.workload.family import WorkloadFamily
from comet_dse.workload.transformer import TRANSFORMER

FAMILIES = (TRANSFORMER,)       # a new family is one more entry (docs/architecture.md, "The workload seam")
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
