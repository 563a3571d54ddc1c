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
from comet_dse.base import written
from comet_dse.base.errors import InputError, StorageError
from comet_dse.cli.options import EXIT_BAD_INPUT, EXIT_RUN_FAILED, EXIT_STORAGE
from comet_dse.presets.catalog import load_cluster, preset_data
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


def test_an_output_folder_reached_through_a_link_is_written_and_locked(tmp_path):
    """A link to a folder above the output (a home folder's results -> /data/results) is the user's own
    layout, not a planted temporary: files are written there, recorded and replaced as anywhere."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "results").symlink_to(real)
    for text in ("one", "two"):
        written.write_file(tmp_path / "results" / "a.txt", lambda tmp, t=text: Path(tmp).write_text(t))
    assert (real / "a.txt").read_text() == "two" and written.owns_file(real / "a.txt")


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_private_temporaries_of_dead_processes_are_removed_and_foreign_folders_kept(tmp_path):
    dead = _dead_pid()
    stale = tmp_path / f".out.txt.tmp-{dead}-abcd1234"
    stale.mkdir()
    (stale / "out.txt").write_text("half")
    foreign = tmp_path / f".out.txt.tmp-{dead}-zzzz9999"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("mine")
    written.write_file(tmp_path / "out.txt", lambda tmp: Path(tmp).write_text("whole"))
    assert not stale.exists() and (foreign / "thesis.tex").read_text() == "mine"


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
        text = f"{worker} {i}"
        written.write_file(Path(folder) / f"w{worker}-{i}.txt", lambda tmp, t=text: Path(tmp).write_text(t))
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


# --- 4. hostile values ---------------------------------------------------------------------------------

def _validation_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    for path in SOURCE_VALIDATION.iterdir():
        if path.is_file():
            (folder / path.name).write_bytes(path.read_bytes())
    if (SOURCE_VALIDATION / "models").is_dir():
        (folder / "models").mkdir()
        for path in (SOURCE_VALIDATION / "models").iterdir():
            (folder / "models" / path.name).write_bytes(path.read_bytes())
    return folder


def _set_cell(path: Path, column: str, value: str, row: int = 0) -> None:
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    rows[row][column] = value
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize("value", ["0", "nan", "inf", "-1", "1e-300", "-0", "1e400", "x"])
@pytest.mark.parametrize("file, column", [("h100_public.csv", "measured"),
                                          ("korthikanti2022_table5.csv", "measured_iteration_time_s"),
                                          ("korthikanti2022_table4.csv", "forward_ms"),
                                          ("memory.csv", "measured_gib")])
def test_a_measured_value_that_is_not_a_positive_number_in_range_is_one_line(tmp_path, capsys, file, column, value):
    """Probe: validate --data with measured=0 was a ZeroDivisionError traceback; nan, inf, -1 and 1e-300
    were accepted silently."""
    data = _validation_copy(tmp_path)
    _set_cell(data / file, column, value)
    one_line_error(run(capsys, "validate", "--data", data), "data: ", file, column, "must be a positive number")


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12)))
def test_measured_values_are_held_to_the_measured_time_bound(value):
    """Property: validation.measured_value accepts exactly the finite positive numbers in the measured_time
    row of bounds.BOUNDS, and nothing else, as one InputError."""
    from comet_dse.answers.validation import measured_value
    from comet_dse.base.bounds import BOUNDS

    text = repr(value) if isinstance(value, float) else value
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    row = BOUNDS["measured_time"]
    valid = math.isfinite(number) and number > 0 and row.low <= number <= row.high
    if valid:
        assert measured_value({"measured": text}, "measured", "x.csv") == number
    else:
        with pytest.raises(InputError, match="must be a positive number"):
            measured_value({"measured": text}, "measured", "x.csv")


def _nested(depth: int) -> dict:
    value = 1
    for _ in range(depth - 1):
        value = [value]
    return {"nested": value}


@pytest.mark.parametrize("depth", [65, 100, 900])
def test_a_config_json_nested_deeper_than_64_is_refused(tmp_path, capsys, depth):
    """Probe: a config.json nested 65 to 900 deep was accepted, although the docs say deeper than 64 is
    refused."""
    from comet_dse.base.loading import read_json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", **_nested(depth)}))
    with pytest.raises(InputError, match="more than 64 deep"):
        read_json(path, "model")
    one_line_error(run(capsys, *(a if a != "megatron-1.7b" else path for a in ESTIMATE)), "model: ", "64 deep")


def test_a_config_json_nested_64_deep_is_read(tmp_path):
    from comet_dse.base.loading import read_json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_nested(64)))
    assert read_json(path, "model") == _nested(64)


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8,
         "intermediate_size": 1376, "vocab_size": 32000, "max_position_embeddings": 2048}


@pytest.mark.parametrize("change, needle", [
    ({"head_dim": 0}, "config.json:head_dim: must be a positive integer"),
    ({"model_type": "bert"}, "config.json:model_type: 'bert' is an encoder"),
    ({"model_type": "t5", "is_encoder_decoder": True}, "is an encoder or encoder-decoder model"),
    ({"num_local_experts": 0, "num_experts_per_tok": 2}, "config.json:num_local_experts: must be a positive"),
    ({"n_routed_experts": 0}, "config.json:n_routed_experts: must be a positive"),
    ({"num_experts": 0, "moe_intermediate_size": 128}, "config.json:num_experts: must be a positive"),
])
def test_hf_configs_that_are_no_decoder_model_are_refused(tmp_path, capsys, change, needle):
    """Probe: HF configs with head_dim 0, model_type bert or num_local_experts 0 were accepted silently."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **change}))
    one_line_error(run(capsys, *(a if a != "megatron-1.7b" else path for a in ESTIMATE)), needle)


def test_hf_configs_with_null_or_absent_expert_counts_and_head_dim_are_dense(tmp_path):
    from comet_dse.model.load import transformer_from_hf_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "head_dim": None, "num_local_experts": None}))
    model = transformer_from_hf_config(path)
    assert model.moe is None and model.attention.head_dim == 64


EXPLORER = dict(model="megatron-1.7b", model_file=None, cluster="dgx-a100-80gb", devices=8, global_batch=8, rank=1,
                values=[], ids=[], tokens=None, strategy={})


@pytest.mark.parametrize("change, field", [
    ({"rank": "x"}, "rank"), ({"rank": math.nan}, "rank"), ({"rank": True}, "rank"), ({"rank": 99}, "rank"),
    ({"model": 123}, "model"), ({"model": ["megatron-1.7b"]}, "model"), ({"model": None}, "model"),
    ({"model_file": 123}, "model file"), ({"model_file": ["a"]}, "model file"), ({"cluster": None}, "cluster"),
    ({"cluster": {"a": 1}}, "cluster"), ({"values": "x"}, "resources"), ({"ids": [1], "values": [1]}, "resources"),
    ({"tokens": [1]}, "tokens"), ({"strategy": {"zero": [1]}}, "zero"),
    ({"ids": [{"type": "resource", "key": "hbm_capacity", "cluster": "dgx-a100-80gb"}], "values": [[1]]},
     "hbm_capacity"),
])
def test_explorer_controls_of_the_wrong_type_are_input_errors(change, field):
    """Probe: the explorer answered rank 'x' or NaN, model file 123 or a list, cluster None with HTTP 500."""
    pytest.importorskip("dash")
    from comet_dse.web.app import controls_from
    from comet_dse.web.view import compute

    with pytest.raises(InputError) as info:
        compute(controls_from(**{**EXPLORER, **change}))
    assert info.value.field == field


def _explorer_request(app, **values):
    """The JSON body the page posts when a control changes, with ``values`` for the controls."""
    key = next(k for k in app.callback_map if k.startswith("..status"))
    spec = app.callback_map[key]
    from comet_dse.web.view import STRATEGY_CONTROLS

    given = {"model": "megatron-1.7b", "model-file": None, "cluster": "dgx-a100-80gb", "devices": 8,
             "global-batch": 8, "rank": 1, "tokens": None,
             **{f"strategy-{knob}": "default" for knob in STRATEGY_CONTROLS}, "strategy-dtype": "bf16",
             "tp-across-nodes": [], **values}
    inputs = [[] if i["id"].startswith("{") else {"id": i["id"], "property": i["property"], "value": given[i["id"]]}
              for i in spec["inputs"]]
    outputs = [dict(zip(("id", "property"), o.split("."))) for o in key.strip(".").split("...")]
    return {"output": key, "outputs": outputs, "inputs": inputs, "state": [[]], "changedPropIds": ["rank.value"]}


@pytest.mark.parametrize("values", [{"rank": "x"}, {"rank": math.nan}, {"model-file": 123}, {"model-file": ["a"]},
                                    {"cluster": None}, {"model": 123}])
def test_the_explorer_answers_a_crafted_request_with_a_message_not_http_500(values):
    pytest.importorskip("dash")
    from comet_dse.web.app import build_app

    app = build_app()
    body = json.dumps(_explorer_request(app, **values), allow_nan=True)
    reply = app.server.test_client().post("/_dash-update-component", data=body, content_type="application/json")
    assert reply.status_code == 200, reply.get_data(as_text=True)[:300]
    message = json.loads(reply.get_data(as_text=True))["response"]["error"]["children"]
    assert "must be" in message
    reset = app.server.test_client().post("/_dash-update-component", json={
        "output": "resource-controls.children", "outputs": {"id": "resource-controls", "property": "children"},
        "inputs": [{"id": "cluster", "property": "value", "value": None}], "changedPropIds": ["cluster.value"]})
    assert reset.status_code == 200 and "cluster: must be a name" in reset.get_data(as_text=True)


@settings(max_examples=60, deadline=None)
@given(rank=st.one_of(st.none(), st.booleans(), st.integers(-5, 20), st.floats(), st.text(max_size=5)),
       model_file=st.one_of(st.none(), st.integers(), st.lists(st.integers(), max_size=2), st.just("")),
       cluster=st.one_of(st.none(), st.integers(), st.just("dgx-a100-80gb"), st.text(max_size=5)))
def test_every_explorer_control_value_is_a_view_or_an_input_error(rank, model_file, cluster):
    """Property: whatever JSON values the three controls hold, the explorer computes or says why not."""
    pytest.importorskip("dash")
    from comet_dse.web.app import controls_from
    from comet_dse.web.view import compute

    try:
        view = compute(controls_from(**{**EXPLORER, "rank": rank, "model_file": model_file, "cluster": cluster}))
    except InputError:
        return
    assert view.evaluated > 0


@pytest.mark.parametrize("host, url", [("::1", "http://[::1]:8050/"), ("[::1]", None), ("::", "http://[::1]:8050/"),
                                       ("0.0.0.0", "http://127.0.0.1:8050/"), ("127.0.0.1", "http://127.0.0.1:8050/"),
                                       ("fe80::1", "http://[fe80::1]:8050/")])
def test_explore_prints_a_url_a_browser_can_open(host, url):
    """Probe: explore --host ::1 printed http://::1:8050/, which no browser opens."""
    from comet_dse.web.serve import page_url

    if url is not None:
        assert page_url(host, 8050) == url


def test_explore_on_ipv6_loopback_prints_the_bracketed_url(monkeypatch, capsys):
    pytest.importorskip("dash")
    from comet_dse.web import app as web_app, serve

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = probe.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")

    class Quiet:
        def run(self, **kwargs):
            assert kwargs["host"] == "::1"

    monkeypatch.setattr(web_app, "build_app", lambda: Quiet())
    assert serve.serve("[::1]", port) == 0
    assert f"open http://[::1]:{port}/ in a browser" in capsys.readouterr().out


@pytest.mark.parametrize("kwargs, needle", [
    ({"strategy": "tp=8"}, "strategy: must be a Strategy or a dict of knobs"),
    ({"strategy": ["tp", 8]}, "strategy: must be a Strategy or a dict of knobs"),
    ({"overrides": "hbm_capacity=40GiB"}, "overrides: must be a mapping of resource name to value"),
    ({"overrides": 3}, "overrides: must be a mapping"),
    ({"overrides": ["hbm_capacity"]}, "overrides: each setting must be a (name, value) pair"),
])
def test_api_arguments_of_the_wrong_type_are_input_errors(kwargs, needle):
    """Probe: estimate(strategy='tp=8') and overrides as a string raised bare ValueErrors."""
    with pytest.raises(InputError) as info:
        comet_dse.estimate("megatron-1.7b", "dgx-a100-80gb", 8, **kwargs)
    assert needle in str(info.value)


def test_calibrate_refuses_a_run_id_given_twice(tmp_path, capsys):
    """Probe: duplicate run ids were accepted, and --holdout then held out both."""
    from comet_dse.answers.calibrate import read_runs

    runs = write_runs(tmp_path / "runs.csv", ids=[f"r{i}" for i in range(13)] + ["r3"])
    with pytest.raises(InputError, match="'r3' is the id of line 5 too"):
        read_runs(runs)
    one_line_error(run(capsys, "calibrate", runs, "--cluster", "dgx-a100-80gb", "--no-cv", "--holdout", "r3"),
                   "runs line 15: id", "give each run its own id")


HIDDEN = ["\u202e", "\u200b", "\u200f", "\u2066", "\ufeff", "\u2028", "\u00ad"]


@pytest.mark.parametrize("char", HIDDEN)
def test_invisible_format_characters_in_names_are_escaped_when_printed(tmp_path, capsys, char):
    """Probe: U+202E and U+200B in ids were printed raw (display spoofing): a name reads reversed, or two
    names that differ print alike."""
    data = {**preset_data("models", "megatron-1.7b"), "name": f"gpt{char}cod.exe"}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    code, out, err = run(capsys, *(a if a != "megatron-1.7b" else path for a in ESTIMATE))
    assert code == 0, err
    assert char not in out and f"gpt\\u{ord(char):04x}cod.exe" in out


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_printable_text_holds_no_control_or_invisible_character(text):
    """Property: what text.printable returns shows every character it keeps (no control character but newline
    and tab, no format character, no line or paragraph separator)."""
    from comet_dse.base.text import printable

    shown = printable(text)
    assert all(c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp") for c in shown)


def test_a_model_name_that_starts_like_a_formula_is_quoted_in_csv(tmp_path, capsys):
    """Probe: a model named '=HYPERLINK(...)' was written unquoted into every row of a CSV output."""
    data = {**preset_data("models", "megatron-1.7b"), "name": '=HYPERLINK("http://x","y")'}
    model = tmp_path / "m.yaml"
    model.write_text(yaml.safe_dump(data))
    out = tmp_path / "r.csv"
    study = write_study(tmp_path / "s.yaml", models=[str(model)])
    code, _, err = run(capsys, "sweep", study, "--output", out, "--no-progress")
    assert code == 0, err
    with out.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and all(r["model"] == "'" + data["name"] for r in rows)
    numbers = [float(r["step_time_s"]) for r in rows]        # number columns stay numbers
    assert all(n > 0 for n in numbers)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=8), min_size=1, max_size=5), st.lists(st.floats(-1e9, 1e9), min_size=1, max_size=5))
def test_no_csv_text_cell_starts_like_a_formula(words, numbers):
    """Property: after csv_table no text cell starts with = + - @, a tab or a carriage return, a cell is
    changed only by a leading ', and number columns are untouched (negative numbers stay numbers)."""
    from comet_dse.design_space.output import csv_table

    n = min(len(words), len(numbers))
    table = csv_table(pa.table({"name": words[:n], "coded": pa.array(words[:n]).dictionary_encode(),
                                "value": numbers[:n]}))
    for column in ("name", "coded"):
        for before, after in zip(words[:n], table.column(column).to_pylist()):
            assert not after.startswith(("=", "+", "-", "@", "\t", "\r"))
            assert after == before or after == "'" + before
    assert table.column("value").to_pylist() == numbers[:n]


# --- 5. money and settings -----------------------------------------------------------------------------

@pytest.mark.parametrize("setting", ["rent=2", "rent=0.5", "energy_price=0.00001", "lifetime=157788000"])
def test_a_price_or_lifetime_without_a_unit_is_refused(capsys, setting):
    """Probe: --set rent=2 was taken as 2 USD per device-second (a $97M answer instead of $27K), while
    energy_price without a unit was refused."""
    name = setting.split("=")[0]
    one_line_error(run(capsys, *ESTIMATE, "--tokens", "1T", "--set", setting), f"--set {name}: needs a unit")


def test_a_cluster_file_rent_without_a_unit_is_refused(tmp_path, capsys):
    data = preset_data("clusters", "dgx-h100")
    data["economics"] = {**data.get("economics", {}), "rent": 2}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    one_line_error(run(capsys, *(a if a != "dgx-h100" else path for a in ESTIMATE)), "economics.rent: needs a unit")


@pytest.mark.parametrize("settings, needle", [
    ([("unit_price.hbm_capacity", "1e7 USD/GiB"), ("hbm_capacity", "x2")], "one device cost"),
    ([("unit_price.peak_flops", "1 USD/(GFLOP/s)"), ("peak_flops", "x200")], "one device cost"),
    ([("unit_power.hbm_bandwidth", "1e5 W/(TB/s)"), ("hbm_bandwidth", "x10")], "one device draw"),
])
def test_a_per_unit_price_that_takes_a_design_past_the_bounds_is_refused(settings, needle):
    """Probe: unit prices multiplied by a scaled resource were unbounded (1e12 to 1e20 USD devices)."""
    with pytest.raises(InputError, match=needle):
        comet_dse.load_cluster("dgx-h100", overrides=settings)


def test_a_per_unit_price_past_the_bounds_is_refused_in_a_study(tmp_path, capsys):
    data = preset_data("clusters", "dgx-a100-80gb")
    data["economics"] = {"unit_price": {"hbm_capacity": "1e7 USD/GiB"}}
    data["device_price_usd"] = 15000
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump(data))
    study = write_study(tmp_path / "s.yaml", cluster=str(cluster), axes={"hbm_capacity": {"scale": [1, 2]}})
    one_line_error(run(capsys, "sweep", study, "--output", tmp_path / "r.parquet", "--no-progress"),
                   "axes (hbm_capacity=x2)", "one device cost")


def test_a_feasible_point_never_shows_a_negative_cost():
    """Probe: a feasible point showed a training cost of -146,367 USD where the docs promise 'unknown'."""
    est = comet_dse.estimate("megatron-1.7b", "dgx-h100", 8, tp=8, global_batch=8, tokens="1T", overrides={
        "rent": "2 USD/h", "unit_price.hbm_capacity": "5000 USD/GiB", "hbm_capacity": "x0.5"})
    assert est.feasible
    for key in ("training_cost_usd", "training_cost_rent_usd", "training_cost_own_usd"):
        assert math.isnan(est.training[key])


@settings(max_examples=60, deadline=None)
@given(price=st.floats(0, 5000), scale=st.floats(0.05, 4), rent=st.floats(0.01, 100))
def test_training_costs_are_unknown_or_not_negative(price, scale, rent):
    """Property: whatever per-unit price and design, a cost is a number of at least 0 or unknown (NaN)."""
    from comet_dse.whole_run import economics

    try:
        cluster = comet_dse.load_cluster("dgx-h100", overrides={
            "rent": f"{rent} USD/h", "unit_price.hbm_capacity": f"{price} USD/GiB", "hbm_capacity": f"x{scale}"})
    except InputError:
        return
    r = economics.rates(cluster, 8)
    cols = economics.training(r, [1.0], [1e5], {"compute": [1.0]}, 1e12, [1.7e9])
    for key in ("training_cost_usd", "training_cost_rent_usd", "training_cost_own_usd"):
        value = float(cols[key][0])
        assert math.isnan(value) or value >= 0


def _state(cluster):
    return (cluster.accelerator, cluster.network, cluster.economics, cluster.device_price_usd)


def test_a_whole_and_a_part_of_peak_flops_do_not_compound_and_their_order_does_not_matter():
    """Probe: --set peak_flops=x2 --set peak_flops.bf16=x2 compounded silently (x4), and the order of a plain
    and a dotted --set changed the answer. Rule: a part takes its own value on the cluster as given."""
    base = load_cluster("dgx-h100")
    one = comet_dse.load_cluster("dgx-h100", overrides=[("peak_flops", "x2"), ("peak_flops.bf16", "x3")])
    other = comet_dse.load_cluster("dgx-h100", overrides=[("peak_flops.bf16", "x3"), ("peak_flops", "x2")])
    assert _state(one) == _state(other)
    assert one.accelerator.peak_flops["bf16"] == pytest.approx(3 * base.accelerator.peak_flops["bf16"])
    assert one.accelerator.peak_flops["fp8"] == pytest.approx(2 * base.accelerator.peak_flops["fp8"])


def test_one_part_written_two_ways_is_refused():
    with pytest.raises(InputError, match="sets what overrides network.nvlink.bandwidth sets already"):
        comet_dse.load_cluster("dgx-h100", overrides=[("network.nvlink.bandwidth", "x2"),
                                                      ("network.nvlink.link_bandwidth", "x2")])


SETTINGS = [("peak_flops", "x2"), ("peak_flops.bf16", "x1.5"), ("peak_flops.fp8", "3PFLOP/s"),
            ("network_bandwidth", "x2"), ("network.nvlink.bandwidth", "x0.5"), ("network_latency", "x2"),
            ("network.infiniband.latency", "1us"), ("hbm_capacity", "x1.5"), ("unit_price.hbm_capacity", "20USD/GiB"),
            ("unit_power.hbm_bandwidth", "30W/(TB/s)"), ("hbm_bandwidth", "x2"), ("rent", "3USD/h")]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(SETTINGS), min_size=1, max_size=len(SETTINGS), unique=True), st.randoms())
def test_the_order_of_settings_never_changes_the_cluster(chosen, random):
    """Property: any set of settings applied in any order gives the same cluster, prices and draws."""
    from comet_dse.whole_run import economics

    shuffled = list(chosen)
    random.shuffle(shuffled)
    one = comet_dse.load_cluster("dgx-h100", overrides=chosen)
    other = comet_dse.load_cluster("dgx-h100", overrides=shuffled)
    assert _state(one) == _state(other)
    assert economics.device_draws(one) == economics.device_draws(other)
    assert economics.price_delta(one) == pytest.approx(economics.price_delta(other))


def test_expansion_given_twice_is_refused(capsys):
    """Probe: --expansion given twice was silently last-wins."""
    one_line_error(run(capsys, *ESTIMATE, "--expansion", "512GiB@64GB/s", "--expansion", "1TiB@64GB/s"),
                   "argument --expansion: is given twice")


def test_two_network_dimensions_with_one_name_are_refused(tmp_path, capsys):
    """Probe: two network dimensions with the same name were accepted, and a --set then scaled both."""
    data = preset_data("clusters", "dgx-h100")
    data["network"][1]["name"] = data["network"][0]["name"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    one_line_error(run(capsys, *(a if a != "dgx-h100" else path for a in ESTIMATE)),
                   "cluster.network[1].name", "names an earlier dimension too")
    network = preset_data("clusters", "dgx-a100-80gb")["network"]
    twice = [network[0], {**network[1], "name": network[0]["name"]}]
    study = write_study(tmp_path / "s.yaml", networks={"twice": twice},
                        axes={"network": ["base", "twice"]})
    one_line_error(run(capsys, "sweep", study, "--output", tmp_path / "r.parquet", "--no-progress"),
                   "networks.twice[1].name")


CALIBRATION = {"base": "dgx-a100-80gb", "runs_file": "runs.csv", "runs_sha256": "0" * 64, "runs": 14,
               "fitted": {"gemm": {"value": 0.7, "sigma": 0.01, "preset": 0.75, "unit": ""}},
               "left_at_preset": [], "error_before": {"mean_abs_error": 0.2, "max_abs_error": 0.4},
               "error_in_sample": {"mean_abs_error": 0.05, "max_abs_error": 0.1},
               "cross_validation": "leave-one-out",
               "error_cross_validated": {"mean_abs_error": 0.06, "max_abs_error": 0.12}}


@pytest.mark.parametrize("change, needle", [
    ({"error_cross_validated": {"mean_abs_error": 0.1, "max_abs_error": -1}}, "max_abs_error"),
    ({"error_in_sample": {"mean_abs_error": 0.5, "max_abs_error": 0.1}}, "exceeds max_abs_error"),
    ({"error_in_sample": {"mean_abs_error": ".nan", "max_abs_error": 0.1}}, "mean_abs_error"),
    ({"error_in_sample": {"mean_abs_error": 0.1}}, "max_abs_error: is missing"),
    ({"error_in_sample": "small"}, "error_in_sample"),
    ({"runs": 0}, "calibration.runs"), ({"runs": "many"}, "calibration.runs"),
    ({"runs_file": ["x"]}, "calibration.runs_file"), ({"runs_sha256": "abc"}, "runs_sha256"),
    ({"fitted": {"gemm": {"value": "fast", "preset": 0.7}}}, "fitted.gemm.value"),
    ({"left_at_preset": "gemm"}, "left_at_preset"), ({"verdict": "great"}, "calibration.verdict"),
])
def test_the_calibration_block_of_a_cluster_file_is_checked(tmp_path, capsys, change, needle):
    """Probe: the calibration: block of a calibrated cluster file was never validated (a bad value gave a
    traceback or 'max -100 %')."""
    data = {**preset_data("clusters", "dgx-a100-80gb"), "calibration": {**CALIBRATION, **change}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data).replace("'.nan'", ".nan"))
    argv = [a if a != "dgx-h100" else path for a in ESTIMATE]
    one_line_error(run(capsys, *argv), "cluster.calibration", needle)


def test_a_sound_calibration_block_is_read_and_gives_the_error_band(tmp_path, capsys):
    """A sound block, sealed as calibrate seals it (its runs file beside it, the fingerprint over the rest)."""
    import hashlib

    from comet_dse.base.fingerprint import fingerprint
    from comet_dse.hardware.load import FINGERPRINT

    (tmp_path / "runs.csv").write_text("id,model,gpus,metric,measured\n")
    digest = hashlib.sha256((tmp_path / "runs.csv").read_bytes()).hexdigest()
    data = {**preset_data("clusters", "dgx-a100-80gb"), "calibration": {**CALIBRATION, "runs_sha256": digest}}
    data["calibration"]["fingerprint"] = fingerprint(data, (FINGERPRINT,))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    est = comet_dse.estimate("megatron-1.7b", path, 8, tp=8, global_batch=8)
    assert est.error_band["high"] == 0.12 and "max 12.0 %" in est.error_band["text"]
