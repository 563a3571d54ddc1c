"""The third hardening issue (32): writes that cannot be redirected, a ledger that survives concurrency and
hostile files, errors that say what happened, hostile values refused, money settings that mean one thing.

One test (or a parametrised family) per probe of the issue, with the inputs it describes, and a property
test (Hypothesis) where a class of inputs is involved. Bad input is one ``comet-dse: error: <field>: ...``
line and exit status 2 (the API raises InputError); an error of the operating system on a file is one line
naming the path and the cause, exit status 74. No test asserts a speed: a hang is bounded (``no_hang``).
The physics probes of the issue (monotonicity in the cost model) are not here: they belong to the cost model.
"""
from __future__ import annotations

import csv
import errno
import json
import math
import multiprocessing
import os
import re
import socket
import stat
import unicodedata
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import comet_dse
from comet_dse import written
from comet_dse.cli.options import EXIT_BAD_INPUT, EXIT_RUN_FAILED, EXIT_STORAGE
from comet_dse.errors import InputError, StorageError
from comet_dse.presets import load_cluster, preset_data
from cli_run import one_line_error, run
from hang import no_hang

ROOT = Path(__file__).resolve().parents[1]
SOURCE_VALIDATION = ROOT / "src" / "comet_dse" / "data" / "validation"
WHATIF = ["whatif", "--model", "megatron-18b", "--cluster", "dgx-a100-80gb", "--devices", "64", "--global-batch",
          "256", "--mp", "8", "--dp", "8", "--resources", "peak_flops", "--no-fit"]
SEARCH = ["search", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80gb", "--devices", 8, "--global-batch", 8,
          "--tp", 8]
ESTIMATE = ["estimate", "--model", "megatron-1.7b", "--cluster", "dgx-h100", "--devices", 8, "--global-batch", 8,
            "--tp", 8]
STUDY = {"name": "hardening3", "models": ["megatron-1.7b"], "cluster": "dgx-a100-80gb", "devices": [8],
         "global_batch": 8, "strategy": {"tp": [4, 8], "zero": [0, 1]}}


def write_study(path: Path, **changes) -> Path:
    path.write_text(yaml.safe_dump({**STUDY, **changes}, sort_keys=False))
    return path


def write_runs(path: Path, ids=None) -> Path:
    ids = ids or [f"r{i}" for i in range(14)]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "model", "gpus", "tp", "dp", "global_batch", "recompute", "metric", "measured"])
        for i, label in enumerate(ids):
            writer.writerow([label, "megatron-22b", 64, 8, 8, 64, "full", "iter_s", 2.0 + i / 10])
    return path


def temporaries(folder: Path) -> list:
    """Names in ``folder`` that are temporaries of some output (``.<name>.tmp-...``), links included."""
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def predictable_links(folder: Path, out: Path, victim: Path) -> list:
    """Links to ``victim`` planted at every name the tool used to write ``out`` and its ledger under:
    ``.<name>.tmp-<pid>``, with ``@<host>``, and the ledger's own."""
    pid, host = os.getpid(), socket.gethostname()
    names = [f".{out.name}.tmp-{pid}", f".{out.name}.tmp-{pid}@{host}", f".{written.LEDGER}.tmp-{pid}",
             f".{out.name}.summary.json.tmp-{pid}"]
    links = [folder / n for n in names]
    for link in links:
        link.symlink_to(victim)
    return links


# --- 1. temporaries: never a predictable name, never through a link --------------------------------------

def test_write_file_writes_in_a_private_folder_at_a_name_nobody_can_predict(tmp_path):
    seen = []

    def write(tmp):
        folder = Path(tmp).parent
        seen.append((folder.name, stat.S_IMODE(os.lstat(folder).st_mode)))
        Path(tmp).write_text("x")

    for _ in range(2):
        written.write_file(tmp_path / "a.txt", write)
    (first, mode1), (second, mode2) = seen
    assert first != second and mode1 == mode2 == 0o700          # mkdtemp: 0700, a fresh random name each time
    assert re.fullmatch(rf"\.a\.txt\.tmp-{os.getpid()}-[a-z0-9_]{{8}}", first), first
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("command", ["whatif", "search-csv", "search-parquet", "calibrate", "validate"])
def test_a_link_at_a_predictable_temporary_name_is_never_written_through(tmp_path, capsys, command):
    """Probe: a link planted at `.<out>.tmp-<pid>` made whatif --figure, search --output and calibrate
    --output write into the link's target; one at the ledger's temporary overwrote a file with ledger JSON."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    argv = {"whatif": (WHATIF, "--figure", "f.svg"), "search-csv": (SEARCH, "--output", "r.csv"),
            "search-parquet": (SEARCH, "--output", "r.parquet"),
            "calibrate": (["calibrate", write_runs(tmp_path / "runs.csv"), "--cluster", "dgx-a100-80gb", "--no-cv",
                           "--output"], None, "c.yaml"),
            "validate": (["validate"], "--figure", "v.svg")}[command]
    if command == "calibrate":
        pytest.importorskip("scipy")
    head, option, name = argv
    out = tmp_path / name
    links = predictable_links(tmp_path, out, victim)
    code, _, err = run(capsys, *head, *([option] if option else []), out)
    assert code == 0, err
    assert victim.read_text() == "precious\n" and all(link.is_symlink() for link in links)
    assert out.is_file() and written.owns_file(out)
    assert sorted(temporaries(tmp_path)) == sorted(link.name for link in links)     # only what was planted


def test_report_never_writes_into_a_link_at_its_temporary_folder(tmp_path, capsys):
    """Probe: a link at `.rep.tmp-<pid>` made report --output write into (and replace the report.html of)
    another folder."""
    studies = tmp_path / "studies"
    studies.mkdir()
    write_study(studies / "s.yaml")
    other = tmp_path / "other"
    other.mkdir()
    (other / "report.html").write_text("their page")
    (tmp_path / f".rep.tmp-{os.getpid()}").symlink_to(other)
    (tmp_path / f".rep.tmp-old-{os.getpid()}").symlink_to(other)
    code, _, err = run(capsys, "report", studies, "--output", tmp_path / "rep", "--no-progress")
    assert code == 0, err
    assert sorted(p.name for p in other.iterdir()) == ["report.html"]
    assert (other / "report.html").read_text() == "their page"
    assert (tmp_path / "rep" / "report.html").is_file()
    assert stat.S_IMODE((tmp_path / "rep").stat().st_mode) == 0o777 & ~_umask()     # not left 0700


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_dataset_is_never_assembled_through_a_link_at_its_temporary_name(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    out = tmp_path / "ds"
    for name in (f".ds.tmp-{os.getpid()}@{socket.gethostname()}", f".ds.tmp-old-{os.getpid()}@{socket.gethostname()}"):
        (tmp_path / name).symlink_to(victim)
    study = write_study(tmp_path / "s.yaml")
    code, _, err = run(capsys, "sweep", study, "--output", out, "--no-progress")
    assert code == 0, err
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
    assert (out / "_comet-dse.json").is_file()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tails=st.lists(st.text(alphabet="0123456789abcdefghijklmnopqrstuvwxyz_@-.", min_size=1, max_size=24),
                      min_size=1, max_size=6, unique=True))
def test_no_link_at_any_temporary_looking_name_is_followed(tmp_path_factory, tails):
    """Property: whatever links sit at names `.<out>.tmp-<anything>` (a guess at the random part, another
    pid, another host), write_file writes neither through them nor removes them."""
    folder = tmp_path_factory.mktemp("links")
    victim = folder / "victim"
    victim.write_text("v")
    for tail in tails:
        (folder / f".out.txt.tmp-{tail}").symlink_to(victim)
        (folder / f".{written.LEDGER}.tmp-{tail}").symlink_to(victim)
    written.write_file(folder / "out.txt", lambda tmp: Path(tmp).write_text("result"))
    written.write_file(folder / "out.txt", lambda tmp: Path(tmp).write_text("again"))
    assert victim.read_text() == "v" and (folder / "out.txt").read_text() == "again"
    assert all((folder / f".out.txt.tmp-{t}").is_symlink() for t in tails)


# --- 2. the ledger -------------------------------------------------------------------------------------

def test_a_fifo_in_place_of_the_ledger_is_one_line_and_never_blocks(tmp_path, capsys):
    """Probe: a FIFO at the ledger's name blocked search --output forever."""
    os.mkfifo(tmp_path / written.LEDGER)
    with no_hang():
        one_line_error(run(capsys, *SEARCH, "--output", tmp_path / "r.csv"), "output: ", written.LEDGER,
                       "not a regular file")
    assert not (tmp_path / "r.csv").exists() and temporaries(tmp_path) == []


@pytest.mark.parametrize("target", ["big", "/dev/zero"])
def test_a_link_in_place_of_the_ledger_is_refused_without_reading_it(tmp_path, capsys, target):
    """Probe: a link to a 2 GiB file was read whole (43 s, 4.3 GB), /dev/zero was a MemoryError traceback."""
    if target == "big":
        big = tmp_path / "big"
        with open(big, "wb") as handle:
            handle.truncate(2 << 30)                                # sparse: no disk used
        target = big
    (tmp_path / written.LEDGER).symlink_to(target)
    with no_hang():
        one_line_error(run(capsys, *SEARCH, "--output", tmp_path / "r.csv"), "output: ", "symbolic link")
    assert not (tmp_path / "r.csv").exists()


def test_a_ledger_larger_than_the_limit_is_refused_after_a_bounded_read(tmp_path, capsys, monkeypatch):
    ledger = tmp_path / written.LEDGER
    with open(ledger, "wb") as handle:
        handle.truncate(2 << 30)
    reads = []
    real_fdopen = os.fdopen

    def counting_fdopen(fd, *args, **kwargs):
        handle = real_fdopen(fd, *args, **kwargs)
        read = handle.read

        def bounded(n=-1):
            reads.append(n)
            return read(n)
        handle.read = bounded
        return handle

    monkeypatch.setattr(written.os, "fdopen", counting_fdopen)
    (tmp_path / "r.csv").write_text("a user's table\n")
    with no_hang():
        one_line_error(run(capsys, *SEARCH, "--output", tmp_path / "r.csv"), "output: ", "larger than")
    assert reads and all(0 < n <= written.JSON_LIMIT + 1 for n in reads)      # never read without a bound


def _write_five(args):
    folder, worker = args
    for i in range(5):
        written.write_file(Path(folder) / f"w{worker}-{i}.txt", lambda tmp, w=worker, i=i: Path(tmp).write_text(f"{w} {i}"))
    return worker


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked writers")
def test_concurrent_writers_into_one_folder_lose_no_ledger_entry(tmp_path):
    """Probe: 16 concurrent writers into one folder lost 24 of 80 ledger entries (read-modify-write without
    a lock). Each entry is now written under an flock on the folder."""
    with no_hang(300), multiprocessing.get_context("fork").Pool(16) as pool:
        assert sorted(pool.map(_write_five, [(str(tmp_path), w) for w in range(16)])) == list(range(16))
    ledger = json.loads((tmp_path / written.LEDGER).read_text())
    names = {f"w{w}-{i}.txt" for w in range(16) for i in range(5)}
    assert set(ledger["files"]) == names
    assert all(written.owns_file(tmp_path / n) for n in names)
    assert temporaries(tmp_path) == []


def _same_size_same_time_edit(path: Path, offset: int) -> None:
    """Change one byte of ``path`` at ``offset`` in place, keeping its size, inode and modification time."""
    before = os.stat(path)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(min_size=1, max_size=300_000), where=st.floats(0, 1, exclude_max=True))
def test_an_edit_in_place_of_the_same_size_and_time_is_seen(tmp_path_factory, content, where):
    """Property: any one byte changed in a written file, its size and time kept, makes it not comet-dse's
    (the ledger holds its SHA-256): the write that would replace it is refused."""
    path = tmp_path_factory.mktemp("edit") / "result.bin"
    written.write_file(path, lambda tmp: Path(tmp).write_bytes(content))
    assert written.owns_file(path)
    _same_size_same_time_edit(path, int(where * len(content)))
    assert not written.owns_file(path)
    with pytest.raises(InputError, match="not a comet-dse result file"):
        written.write_file(path, lambda tmp: Path(tmp).write_bytes(b"new"))


def test_an_edit_in_the_middle_of_a_dataset_part_is_seen(tmp_path, capsys):
    """Probe: an edit in the middle of a dataset part, of the same size, went unnoticed and the part was
    replaced (the manifest hashed only the first and last 64 KiB)."""
    study = write_study(tmp_path / "s.yaml", strategy={"tp": [1, 2, 4, 8], "zero": [0, 1, 2, 3],
                                                         "recompute": ["none", "selective", "full"]})
    out = tmp_path / "ds"
    assert run(capsys, "sweep", study, "--output", out, "--no-progress")[0] == 0
    part = sorted(out.glob("*.parquet"))[0]
    _same_size_same_time_edit(part, part.stat().st_size // 2)
    one_line_error(run(capsys, "sweep", study, "--output", out, "--no-progress"), "output: ", part.name,
                   "changed since")


# --- 3. errors of the operating system: one line, exit status 74 -----------------------------------------

def _failing(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT])
@pytest.mark.parametrize("command", ["whatif", "validate", "search"])
def test_an_error_of_the_system_is_one_line_with_its_own_status(tmp_path, capsys, monkeypatch, command, code):
    """Probe: a full disk was reported as an input error (exit status 2) by whatif --figure, search --output
    and validate --figure. It is one line naming the path and the cause, exit status 74, and leaves nothing."""
    import matplotlib.figure
    import pyarrow.parquet as pq

    if command == "search":
        out = tmp_path / "r.parquet"
        monkeypatch.setattr(pq, "write_table", _failing(code))
        argv = [*SEARCH, "--output", out]
    else:
        out = tmp_path / "f.svg"
        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", _failing(code))
        argv = [*WHATIF, "--figure", out] if command == "whatif" else ["validate", "--figure", out]
    result = run(capsys, *argv)
    line = one_line_error((result[0], "", result[2]), str(out), os.strerror(code), errno.errorcode[code],
                          status=EXIT_STORAGE)
    assert line.startswith(f"comet-dse: error: {'--figure' if command != 'search' else 'output'}: cannot write ")
    assert not out.exists() and temporaries(tmp_path) == []


def test_a_ledger_that_cannot_be_written_leaves_no_unrecorded_file(tmp_path, capsys, monkeypatch):
    """Probe: when the ledger write failed after the figure was written, the command exited 1 with the
    figure in place but unrecorded. The ledger is written first: nothing is renamed into place, and the
    figure written before stays, still comet-dse's."""
    out = tmp_path / "f.svg"
    assert run(capsys, *WHATIF, "--figure", out)[0] == 0
    before = out.read_bytes()
    real = written._write_json

    def failing(path, data, field="output"):
        if Path(path).name == written.LEDGER:
            raise written.failure(field, "write", path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        return real(path, data, field)

    monkeypatch.setattr(written, "_write_json", failing)
    other = [("hbm_bandwidth" if a == "peak_flops" else a) for a in WHATIF]     # another figure
    result = run(capsys, *other, "--figure", out)
    one_line_error((result[0], "", result[2]), "No space left on device", status=EXIT_STORAGE)
    monkeypatch.setattr(written, "_write_json", real)
    assert out.read_bytes() == before and written.owns_file(out) and temporaries(tmp_path) == []
    fresh = tmp_path / "g.svg"
    monkeypatch.setattr(written, "_write_json", failing)
    assert run(capsys, *WHATIF, "--figure", fresh)[0] == EXIT_STORAGE
    assert not fresh.exists() and temporaries(tmp_path) == []


def test_a_failed_rename_puts_the_ledger_entry_back(tmp_path, monkeypatch):
    out = tmp_path / "a.txt"
    written.write_file(out, lambda tmp: Path(tmp).write_text("one"))
    real = os.replace

    def failing(src, dst, *args, **kwargs):
        if Path(dst) == out:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(written.os, "replace", failing)
    with pytest.raises(StorageError, match="cannot write .*a.txt: .*EIO"):
        written.write_file(out, lambda tmp: Path(tmp).write_text("two"))
    monkeypatch.setattr(written.os, "replace", real)
    assert out.read_text() == "one" and written.owns_file(out) and temporaries(tmp_path) == []


def test_the_exit_statuses_are_distinct_and_documented():
    assert len({EXIT_BAD_INPUT, EXIT_RUN_FAILED, EXIT_STORAGE, 0, 130}) == 5
    text = (ROOT / "docs" / "reliability.md").read_text()
    assert f"exit status {EXIT_STORAGE}" in text and f"exit status {EXIT_RUN_FAILED}" in text


def test_a_path_that_cannot_be_a_folder_stays_an_input_error(tmp_path, capsys):
    """What the user named (a file where a folder must be) is input, exit status 2; only the system's
    refusals take status 74."""
    (tmp_path / "file").write_text("x")
    one_line_error(run(capsys, *SEARCH, "--output", tmp_path / "file" / "r.csv"), "output: ", "cannot create")
