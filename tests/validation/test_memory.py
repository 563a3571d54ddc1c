"""Peak memory per device of published runs (memory.csv) against the model: every row cites its source, and the
accuracy reached is guarded so that a regression fails. The issue's target (within 10 %) is not met; docs/
validation.md ("Peak memory") says what is off and why."""
import csv
import json

import pytest

from comet_dse.presets import load_cluster
from comet_dse.validation import MEASURES, MEMORY, memory_comparisons, memory_file, memory_summary, validation_dir
from cli_run import run

GiB = 2.0**30


@pytest.fixture(scope="module")
def comparisons():
    return memory_comparisons(validation_dir())


def test_every_row_is_sourced_and_predicted(comparisons):
    rows = list(csv.DictReader(memory_file(validation_dir()).open()))
    assert len(rows) == len(comparisons) >= 10
    for row, comp in zip(rows, comparisons):
        assert row["source"].strip() and row["measures"] in MEASURES, row["id"]
        assert comp.label == row["id"] and comp.measured == pytest.approx(float(row["measured_gib"]) * GiB)


def test_max_reserved_leaves_out_the_fixed_reserve(comparisons):
    """PyTorch's max reserved holds the footprint and the allocator's fragmentation, not the driver's share, the
    CUDA context or NCCL's buffers: the prediction is the estimate less the preset's reserved_memory."""
    from comet_dse.estimate import estimate
    from comet_dse.presets import load_model
    from comet_dse.strategy import Strategy, knob_values

    row = next(csv.DictReader(memory_file(validation_dir()).open()))
    cluster = load_cluster(row["cluster"])
    result = estimate(load_model(row["model"]).with_seq_len(int(row["seq_len"])), cluster, int(row["gpus"]),
                      Strategy(**knob_values(row)))
    assert comparisons[0].predicted == pytest.approx(result.memory_per_device_bytes - cluster.reserved_memory)


def test_memory_accuracy_reached(comparisons):
    """torchtitan's runs hold 36-50 % more than the model predicts, every row: its unfused fp32 cross entropy,
    FSDP2's unsharded gradients across pipeline micro-batches and torch.compile's and Float8's buffers are not
    modelled (docs/validation.md). These bounds guard what is reached."""
    stats = memory_summary(comparisons)
    assert stats["rows"] == len(comparisons)
    assert stats["mean_abs_error"] <= 0.45
    assert stats["max_abs_error"] <= 0.52
    assert all(c.error < 0 for c in comparisons)


def test_validate_reports_memory_and_recall(capsys):
    code, out, err = run(capsys, "validate")
    assert code == 0, err
    assert "Peak memory per device, predicted vs measured (memory.csv)" in out
    assert "Feasibility recall: 28 of 28 published runs judged to fit" in out
    assert "torchtitan-70b-fsdp32-tp8" in out
    code, out, err = run(capsys, "validate", "--json")
    data = json.loads(out)
    assert data["feasibility_recall"]["missed"] == []
    assert data["memory"]["summary"]["rows"] == len(data["memory"]["rows"]) >= 10
    assert {"label", "predicted_bytes", "measured_bytes", "measures", "error", "source"} <= set(data["memory"]["rows"][0])


def test_the_packaged_copy_is_found_when_a_folder_has_none(tmp_path):
    assert memory_file(tmp_path).name == MEMORY and memory_file(tmp_path).is_file()
