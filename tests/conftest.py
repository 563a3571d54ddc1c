"""Shared fixtures: presets loaded once per session."""
import pytest

from comet_dse.presets import load_cluster, load_model


@pytest.fixture(scope="session")
def a100():
    return load_cluster("dgx-a100-80gb")


@pytest.fixture(scope="session")
def gpt3():
    return load_model("gpt3-175b")


@pytest.fixture(scope="session")
def megatron_1t():
    return load_model("megatron-1t")
