"""The one output rule (comet_dse/base/written.py): the tool replaces only a file or folder it wrote itself.

Each probe of the second hardening round is a test here: calibrate --output over its own runs, a cluster
file or a device; whatif --figure over a user's PNG or through a link; report --output over a folder that
looks like a report by its names but holds a user's file.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from cli_run import one_line_error, run
from comet_dse.base import written
from comet_dse.base.errors import InputError

SMALL = ["--model", "megatron-18b", "--cluster", "dgx-a100-80gb", "--devices", "64", "--global-batch", "256",
         "--mp", "8", "--dp", "8", "--resources", "peak_flops", "--no-fit"]


def write_runs(path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "model", "gpus", "tp", "dp", "global_batch", "recompute", "metric", "measured"])
        for i in range(14):
            writer.writerow([f"r{i}", "megatron-22b", 64, 8, 8, 64, "full", "iter_s", 2.0 + i / 10])


# --- the module itself ---------------------------------------------------------------------------------

def test_a_new_path_is_written_recorded_and_then_replaceable(tmp_path):
    target = tmp_path / "sub" / "a.txt"
    written.write_file(target, lambda tmp: Path(tmp).write_text("one"))
    assert target.read_text() == "one" and written.owns_file(target)
    written.write_file(target, lambda tmp: Path(tmp).write_text("two"))       # its own file: replaced
    assert target.read_text() == "two"
    assert sorted(p.name for p in target.parent.iterdir()) == [written.LEDGER, "a.txt"]


def test_a_write_that_fails_leaves_no_ledger_where_nothing_else_was_written(tmp_path, monkeypatch):
    """The rename into place fails (the system refuses it): no file, no temporary and no ledger is left in a
    folder where comet-dse keeps nothing else; in a folder where it keeps another file the ledger stays,
    recording that one only."""
    real_replace = os.replace

    def refuse(src, dst):             # only the rename of the result into place; the ledger's own goes through
        if Path(dst).name.endswith(".yaml"):
            raise PermissionError(13, "Permission denied", str(dst))
        real_replace(src, dst)

    alone = tmp_path / "alone" / "a.yaml"
    monkeypatch.setattr(written.os, "replace", refuse)
    with pytest.raises(Exception, match="Permission denied"):
        written.write_file(alone, lambda tmp: Path(tmp).write_text("one"))
    assert sorted(os.listdir(alone.parent)) == []
    monkeypatch.undo()
    kept = tmp_path / "kept"
    written.write_file(kept / "first.yaml", lambda tmp: Path(tmp).write_text("one"))
    monkeypatch.setattr(written.os, "replace", refuse)
    with pytest.raises(Exception, match="Permission denied"):
        written.write_file(kept / "second.yaml", lambda tmp: Path(tmp).write_text("two"))
    monkeypatch.undo()
    assert sorted(os.listdir(kept)) == [written.LEDGER, "first.yaml"]
    assert written.owns_file(kept / "first.yaml")


def test_a_file_changed_after_it_was_written_is_not_replaced(tmp_path):
    target = tmp_path / "a.txt"
    written.write_file(target, lambda tmp: Path(tmp).write_text("one"))
    target.write_text("the user's edit")
    with pytest.raises(InputError, match="not a comet-dse result file"):
        written.write_file(target, lambda tmp: Path(tmp).write_text("two"))
    assert target.read_text() == "the user's edit"


def test_a_users_file_is_refused_and_an_empty_one_is_used(tmp_path):
    mine, empty = tmp_path / "mine.csv", tmp_path / "empty.csv"
    mine.write_text("a,b\n1,2\n")
    empty.touch()
    with pytest.raises(InputError, match="not a comet-dse result file"):
        written.check_file(mine)
    assert written.check_file(empty) == empty


def test_links_devices_fifos_and_folders_are_refused_before_anything_is_written(tmp_path):
    real = tmp_path / "real.png"
    link = tmp_path / "link.png"
    link.symlink_to(real)                                   # even a link to a file that does not exist yet
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    for path, why in ((link, "symbolic link"), (fifo, "not a regular file"), (tmp_path, "is a folder"),
                      (Path("/dev/null"), "not a regular file")):
        with pytest.raises(InputError, match=why):
            written.check_file(path)
    assert not real.exists() and Path("/dev/null").is_char_device()


def test_an_input_of_the_command_is_refused_even_through_a_link(tmp_path):
    runs = tmp_path / "runs.csv"
    write_runs(runs)
    alias = tmp_path / "alias.csv"
    alias.symlink_to(runs)
    with pytest.raises(InputError, match="is an input of this command"):
        written.check_file(runs, inputs=[alias])


def test_a_sealed_folder_is_replaceable_until_a_file_is_added_or_changed(tmp_path):
    folder = tmp_path / "report"
    (folder / "data").mkdir(parents=True)
    (folder / "report.html").write_text("<html>")
    (folder / "data" / "a.parquet").write_bytes(b"x")
    written.seal(folder, ".m", "report")
    assert written.check_folder(folder, ".m", "report") == folder
    (folder / "data" / "survey.csv").write_text("answers")
    with pytest.raises(InputError, match="survey.csv"):
        written.check_folder(folder, ".m", "report")
    (folder / "data" / "survey.csv").unlink()
    (folder / "report.html").write_text("<html>edited")
    with pytest.raises(InputError, match="report.html"):
        written.check_folder(folder, ".m", "report")
    with pytest.raises(InputError, match="as a dataset"):                   # a manifest of another kind
        written.check_folder(folder, ".m", "dataset")


# --- the probes ---------------------------------------------------------------------------------------

def test_calibrate_never_writes_over_its_runs_a_cluster_file_or_a_device(tmp_path, capsys):
    pytest.importorskip("scipy")
    runs = tmp_path / "runs.csv"
    write_runs(runs)
    cluster = tmp_path / "mine.yaml"
    cluster.write_text("# my cluster\n")
    fifo = tmp_path / "out.yaml"
    os.mkfifo(fifo)
    before = {runs: runs.read_bytes(), cluster: cluster.read_bytes()}
    base = ["calibrate", runs, "--cluster", "dgx-a100-80gb", "--no-cv", "--output"]
    one_line_error(run(capsys, *base, runs), "output: ", "must end in .yaml")
    one_line_error(run(capsys, *base, cluster), "output: ", "not a comet-dse result file")
    one_line_error(run(capsys, *base, fifo), "output: ", "not a regular file")
    assert {p: p.read_bytes() for p in before} == before and fifo.is_fifo()


def test_calibrate_refuses_its_cluster_file_as_output(tmp_path, capsys):
    pytest.importorskip("scipy")
    runs = tmp_path / "runs.csv"
    write_runs(runs)
    cluster = tmp_path / "base.yaml"
    cluster.write_text("x: 1\n")
    one_line_error(run(capsys, "calibrate", runs, "--cluster", cluster, "--output", cluster),
                   "output: ", "is an input of this command")
    assert cluster.read_text() == "x: 1\n"


def test_whatif_figure_never_replaces_a_users_png_or_writes_through_a_link(tmp_path, capsys):
    thesis = tmp_path / "thesis.png"
    thesis.write_bytes(b"\x89PNG my figure")
    link = tmp_path / "link.png"
    link.symlink_to(thesis)
    for target in (thesis, link):
        one_line_error(run(capsys, "whatif", *SMALL, "--figure", target), "--figure: ")
    assert thesis.read_bytes() == b"\x89PNG my figure"


def test_whatif_figure_replaces_its_own_figure(tmp_path, capsys):
    figure = tmp_path / "speedups.svg"
    for _ in range(2):
        code, out, err = run(capsys, "whatif", *SMALL, "--figure", figure)
        assert code == 0, err
        assert figure.read_text().lstrip().startswith(("<?xml", "<svg"))
    assert written.owns_file(figure)


def study_folder(root: Path) -> Path:
    """A folder with one tiny study (one model, two strategies, one figure)."""
    studies = root / "studies"
    studies.mkdir()
    (studies / "s.yaml").write_text(STUDY)
    return studies


def test_report_leaves_a_folder_that_only_looks_like_a_report(tmp_path, capsys):
    """report --output site deleted site/data/survey.csv: site/ held a report.html and a data/ folder."""
    studies = study_folder(tmp_path)
    site = tmp_path / "site"
    (site / "data").mkdir(parents=True)
    (site / "report.html").write_text("<html>my page</html>")
    (site / "data" / "survey.csv").write_text("answers")
    (site / ".comet-dse-report").write_text("a marker by name only\n")
    one_line_error(run(capsys, "report", studies, "--output", site, "--no-progress"), "output: ", "did not write")
    assert (site / "data" / "survey.csv").read_text() == "answers"


def test_report_replaces_its_own_report_but_not_once_a_file_is_added(tmp_path, capsys):
    studies = study_folder(tmp_path)
    out = tmp_path / "out"
    assert run(capsys, "report", studies, "--output", out, "--no-progress")[0] == 0
    assert run(capsys, "report", studies, "--output", out, "--no-progress")[0] == 0
    (out / "data" / "survey.csv").write_text("answers")
    one_line_error(run(capsys, "report", studies, "--output", out, "--no-progress"), "survey.csv")
    assert (out / "data" / "survey.csv").read_text() == "answers"


STUDY = """\
name: tiny
models: [megatron-1.7b]
clusters: [dgx-a100-80gb]
devices: [8]
global_batch: 8
strategy:
  tp: [1, 2]
  recompute: [full]
figures: [speedup]
"""
