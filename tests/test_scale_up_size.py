"""A scale-up domain resized (``--set network.<dim>.size=N``, a study's ``network.<dim>.size`` axis): smaller than
the hardware's domain is a choice (NVL72 racks run as NVL36), larger is another machine and refused in one line."""
from __future__ import annotations

import comet_dse
from cli_run import one_line_error, run

POINT = dict(tp=64, pp=1, dp=1, global_batch=16, micro_batch=1)


def test_a_smaller_domain_sends_tp_beyond_it_over_the_next_dimension():
    """TP 64 inside one NVL72 rack runs on NVLink; with the rack split into NVL36 domains half of it crosses
    InfiniBand, and its communication takes longer."""
    whole = comet_dse.estimate("llama3-70b", "gb200-nvl72", 64, **POINT)
    halves = comet_dse.estimate("llama3-70b", "gb200-nvl72", 64, overrides={"network.nvlink.size": 36}, **POINT)
    assert comet_dse.load_cluster("gb200-nvl72", overrides={"network.nvlink.size": "x0.5"}).network[0].size == 36
    assert halves.breakdown_s["tp_communication"] > whole.breakdown_s["tp_communication"]


def test_a_domain_beyond_the_hardware_is_refused_in_one_line(capsys):
    args = ("estimate", "--model", "llama3-8b", "--cluster", "gb300-nvl72", "--devices", "144", "--global-batch", "144",
            "--set")
    one_line_error(run(capsys, *args, "network.nvlink.size=144"), "--set network.nvlink.size", "beyond",
                   "domain of 72 devices", "1 to 72")
    one_line_error(run(capsys, *args, "network.nvlink.size=x2"), "beyond", "144 devices")
    one_line_error(run(capsys, *args, "network.nvlink.size=4.5"), "not a whole number of devices from 1 to 72")
    one_line_error(run(capsys, *args, "network.infiniband.size=8"), "outermost dimension")


def test_a_torus_dimension_keeps_its_slice_shape(capsys):
    args = ("estimate", "--model", "llama3-8b", "--cluster", "tpu-v5p", "--devices", "64", "--global-batch", "64",
            "--set", "network.x.size=8")
    one_line_error(run(capsys, *args), "--set network.x.size", "torus dimension", "slice shape")
