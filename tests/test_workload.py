"""The workload seam (workload/family.py, docs/architecture.md): the transformer is its first family, model files
may name their family, and the search, estimate and the preset catalog reach a model's costs through it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

import comet_dse
from cli_run import one_line_error, run
from comet_dse.base.errors import InputError
from comet_dse.cost.feasibility import RULES, RULE_TEXT
from comet_dse.presets.catalog import load_model, model_from, preset_data
from comet_dse.workload import families
from comet_dse.workload.family import WorkloadFamily
from comet_dse.workload.transformer import TRANSFORMER


def test_the_transformer_is_the_family_of_every_preset():
    for name in ("llama3-8b", "mixtral-8x7b", "megatron-1t", "deepseek-v3"):
        assert families.family_of(load_model(name)) is TRANSFORMER
    assert TRANSFORMER.rules == RULES and TRANSFORMER.rule_text == RULE_TEXT
    assert families.DEFAULT is TRANSFORMER and TRANSFORMER in families.FAMILIES


def test_something_that_is_no_model_has_no_family():
    with pytest.raises(TypeError, match="not the model of any workload family"):
        families.family_of({"layers": 32})


def test_a_family_describes_exactly_its_rules():
    with pytest.raises(ValueError, match="rule_text"):
        dataclasses.replace(TRANSFORMER, rule_text={**RULE_TEXT, "extra": "a rule nobody checks"})


def test_a_model_file_may_name_its_family(tmp_path):
    data = preset_data("models", "llama3-8b")
    named = tmp_path / "named.yaml"
    named.write_text(yaml.safe_dump({"family": "transformer", **data}), encoding="utf-8")
    assert load_model(str(named)) == load_model("llama3-8b")
    assert model_from({"family": "transformer", **data}) == model_from(data)


def test_an_unknown_family_is_one_line_naming_the_field(tmp_path, capsys):
    path = tmp_path / "recsys.yaml"
    path.write_text(yaml.safe_dump({"family": "recsys", **preset_data("models", "llama3-8b")}), encoding="utf-8")
    with pytest.raises(InputError, match="must be one of transformer, recommendation, got 'recsys'"):
        load_model(str(path))
    one_line_error(run(capsys, "estimate", "--model", str(path), "--cluster", "dgx-h100", "--devices", "8",
                       "--global-batch", "8"), "model.family", "transformer", "recsys")


@pytest.fixture
def counted(monkeypatch):
    """The transformer family with its evaluate, violations and degree_rows counting their calls, installed as
    the only family: what reaches the cost kernel only through the seam is counted."""
    calls = {"evaluate": 0, "violations": 0, "degree_rows": 0}

    def counting(name):
        inner = getattr(TRANSFORMER, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return inner(*args, **kwargs)
        return wrapper

    family = dataclasses.replace(TRANSFORMER, **{name: counting(name) for name in calls})
    assert isinstance(family, WorkloadFamily)
    monkeypatch.setattr(families, "FAMILIES", (family,))
    return calls


def test_search_and_estimate_reach_the_cost_kernel_through_the_family(counted):
    result = comet_dse.search("llama3-8b", "dgx-h100", 64, 256, tp=[1, 2], recompute="selective")
    assert counted["degree_rows"] >= 1 and counted["evaluate"] >= 1 and counted["violations"] >= 1
    before = dict(counted)
    est = comet_dse.estimate("llama3-8b", "dgx-h100", 64, tp=2, global_batch=256)
    assert counted["evaluate"] == before["evaluate"] + 1 and counted["violations"] == before["violations"] + 1
    assert np.isfinite(est.step_time_s) and result.evaluated > 0
