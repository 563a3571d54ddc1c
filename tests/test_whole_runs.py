"""Whole training runs (whole_runs.csv, `comet-dse validate`): published device-hours against the predicted ones,
goodput and the error band included; every row sourced; strategies as stated or searched, and said which."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import comet_dse
from comet_dse.answers import validation
from comet_dse.base.errors import InputError
from comet_dse.answers.errorband import band_for
from comet_dse.whole_run.economics import band_range
from cli_run import one_line_error, run

CSV = Path(comet_dse.__file__).parent / "data" / "validation" / "whole_runs.csv"


def _rows() -> list:
    with CSV.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def runs():
    return validation.whole_run_comparisons()


def test_every_row_names_its_source_and_how_its_strategy_was_chosen():
    for row in _rows():
        assert row["source"].strip() and row["published"].strip(), row["run"]
        assert row["strategy"] in validation.STRATEGY_SOURCES
        if row["strategy"] == "searched":
            assert "searched best" in row["source"], row["run"]       # the source says what is not published


def test_the_published_figures_are_the_sources_figures():
    published = {r["run"]: float(r["published_device_hours"]) for r in _rows()}
    assert published == {"llama3.1-405b": 30.84e6, "llama3.1-70b": 7.0e6, "llama3.1-8b": 1.46e6,
                         "llama2-70b": 1_720_320, "llama2-13b": 368_640, "llama2-7b": 184_320,
                         "bloom-176b": 1_082_990, "deepseek-v3": 2.664e6}
    tokens = {}
    for r in _rows():
        tokens[r["run"]] = tokens.get(r["run"], 0.0) + float(r["tokens"])
    assert tokens["llama3.1-405b"] == pytest.approx(15.6e12)    # 14.8T at 8K + 0.8T at 128K (Dubey et al. Sec. 3.4)
    assert tokens["deepseek-v3"] == 14.8e12 and tokens["bloom-176b"] == 366e9


def test_a_run_is_its_phases_over_goodput(runs):
    for r in runs:
        assert r.predicted_device_hours == pytest.approx(sum(p.device_time_s for p in r.phases) / 3600)
        assert r.steps_device_hours < r.predicted_device_hours           # failures and checkpoints cost time
        assert 0.5 < r.goodput < 1
        assert r.error == pytest.approx((r.predicted_device_hours - r.published_device_hours)
                                        / r.published_device_hours)
    big = next(r for r in runs if r.run == "llama3.1-405b")
    assert [p.name for p in big.phases] == ["8k pre-training", "128k long context"]
    assert 0.90 < big.goodput < 0.95         # the paper reports > 90 % effective training time on 16K GPUs


def test_searched_rows_keep_what_the_source_states(runs):
    bloom = next(r for r in runs if r.run == "bloom-176b").phases[0]
    assert bloom.strategy_source == "searched"
    assert "tp4 pp12 dp8" in bloom.strategy_text and "z1" in bloom.strategy_text
    assert "flash" not in bloom.strategy_text and "selective" not in bloom.strategy_text and " sp " not in bloom.strategy_text


def test_validate_prints_and_reports_the_whole_runs(capsys, runs):
    code, out, err = run(capsys, "validate", "--json")
    assert code == 0, err
    data = json.loads(out)["whole_runs"]
    errors = [row["error"] for row in data["rows"]]
    assert data["summary"]["with_goodput"]["mean_abs_error"] == pytest.approx(sum(map(abs, errors)) / len(errors))
    for row in data["rows"]:
        band = band_for(row["hardware"], row["dtype"])
        assert row["predicted_device_hours_range"] == band_range(row["predicted_device_hours"], band)
        assert row["band_assumed"] == (not band["validated"])          # an assumed band's range, marked
    code, out, err = run(capsys, "validate")
    assert code == 0, err
    assert "Whole training runs" in out and "llama3.1-405b" in out and "mean |error|" in out.split("Whole training runs")[1]


def test_a_bad_whole_runs_file_is_one_line(capsys, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    for name in validation.STEP_TIME_DATASETS:
        (folder / name).write_text((CSV.parent / name).read_text())
    rows = CSV.read_text().splitlines()
    (folder / "whole_runs.csv").write_text("\n".join([rows[0], rows[1].replace(",stated,", ",guessed,")]) + "\n")
    one_line_error(run(capsys, "validate", "--data", str(folder)), "strategy", "stated, searched")


def test_each_run_says_whether_its_published_figure_is_comparable(runs):
    """whole_runs.csv's comparable column: the Llama 2, BLOOM and DeepSeek-V3 figures count pre-training alone,
    the Llama 3.1 card's does not list its stages; validate summarises the comparable ones apart."""
    from comet_dse.answers.validation import whole_run_summary
    by_run = {r.run: r for r in runs}
    assert {r for r, w in by_run.items() if w.is_comparable} == {"llama2-70b", "llama2-13b", "llama2-7b",
                                                                 "bloom-176b", "deepseek-v3"}
    assert by_run["llama3.1-405b"].comparable.startswith("unknown: ")
    summary = whole_run_summary(runs)["comparable"]
    assert summary["rows"] == 5
    assert summary["mean_abs_error"] == pytest.approx(
        sum(abs(by_run[r].error) for r in by_run if by_run[r].is_comparable) / 5)


def test_a_comparable_cell_that_is_not_yes_no_or_unknown_is_refused():
    from comet_dse.answers.validation import _comparable
    assert _comparable({"comparable": "no: it counts ablations"}) == "no: it counts ablations"
    with pytest.raises(InputError) as err:
        _comparable({"comparable": "probably"})
    assert err.value.field == "whole_runs.csv comparable"
