"""Shared fixtures: presets loaded once per session; the Hypothesis profile.

HYPOTHESIS_PROFILE=ci (set by .ci/run) derandomizes every property test: CI
draws the same examples on every run, so a landing never fails on a new
random draw. Without it, each local run draws fresh examples and keeps
hunting (a failure it finds becomes a fixed regression test).
"""
import os

import pytest
from hypothesis import settings

from comet_dse.presets.catalog import load_cluster, load_model

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def a100():
    return load_cluster("dgx-a100-80gb")


@pytest.fixture(scope="session")
def gpt3():
    return load_model("gpt3-175b")


@pytest.fixture(scope="session")
def megatron_1t():
    return load_model("megatron-1t")
