"""Built-in presets (YAML data files shipped in the package) and resolving user references.

A model or cluster reference is a preset name (``megatron-1t``), a YAML file
path, or, for models, a Hugging Face ``config.json`` path.
"""
from __future__ import annotations

import errno
import os
from importlib import resources
from pathlib import Path

import yaml

from comet_dse.base.errors import InputError
from comet_dse.base.loading import read_json, read_yaml
from comet_dse.hardware.load import cluster_from
from comet_dse.hardware.spec import Cluster
from comet_dse.model.load import transformer_from_hf_config
from comet_dse.model.spec import Transformer
from comet_dse.workload.families import DEFAULT, family_named


def _preset_dir(kind: str):
    return resources.files("comet_dse").joinpath("presets", kind)


def preset_names(kind: str) -> list:
    """Sorted names of the built-in presets of ``kind`` ('models' or 'clusters')."""
    return sorted(p.name[:-5] for p in _preset_dir(kind).iterdir() if p.name.endswith(".yaml"))


def transformer_presets() -> list:
    """Sorted names of the built-in model presets of the transformer family (the explorer lists only these)."""
    return [n for n in preset_names("models") if preset_data("models", n).get("family", DEFAULT.name) == DEFAULT.name]


def preset_data(kind: str, name: str) -> dict:
    path = _preset_dir(kind).joinpath(f"{name}.yaml")
    if name not in preset_names(kind):            # never a path: "../x" or "/tmp/x" is not a preset
        field = "model" if kind == "models" else "cluster"
        raise InputError(field, f"unknown preset {name!r}; built-in {kind}: {', '.join(preset_names(kind))}")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_model(ref: str) -> Transformer:
    """A model from a preset name, a YAML file, or a Hugging Face config.json."""
    _check_reference(ref, "model")
    path = Path(ref)
    if path.is_dir():
        raise InputError("model", f"{ref} is a folder; give a preset name, a model YAML or a config.json file")
    if ref.endswith(".json"):
        if not path.exists():
            raise InputError("model", f"no such file {ref}")
        read_json(path, "model")       # a regular file, small, valid JSON, no key twice: then the HF reader
        return transformer_from_hf_config(path)
    if ref.endswith((".yaml", ".yml")):
        return model_from(read_yaml(path, "model"), "model")
    return model_from(preset_data("models", ref), "model")


def model_from(data, where: str = "model"):
    """A model spec from the mapping of a model file: read by the workload family its ``family:`` key names
    (workload/families.py; the transformer where it names none), which checks the rest."""
    family = DEFAULT
    if isinstance(data, dict) and "family" in data:
        data = dict(data)
        family = family_named(data.pop("family"), f"{where}.family")
    return family.load(data, where)


def load_cluster(ref: str, efficiency: str | None = None) -> Cluster:
    """A cluster from a preset name or a YAML file; ``efficiency``: a `training_efficiency:` setting that
    replaces the file's (hardware/efficiency.py: "physical" for the burn-test reading)."""
    _check_reference(ref, "cluster")
    is_file = ref.endswith((".yaml", ".yml"))
    data = read_yaml(Path(ref), "cluster") if is_file else preset_data("clusters", ref)
    if efficiency is not None:
        data = {**data, "training_efficiency": efficiency}
    return cluster_from(data, "cluster", Path(ref).parent if is_file else None)


def _check_reference(ref: str, field: str) -> None:
    """Refuse a reference the file system cannot even look up (a NUL character, a name too long)."""
    try:
        os.stat(ref)
    except ValueError:
        raise InputError(field, f"{ref[:60]!r} holds a NUL character; give a preset name or a file") from None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise InputError(field, f"{ref[:60]!r}... is too long for a file name; give a preset name or a file"
                             ) from None
