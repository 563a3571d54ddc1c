"""Running a study in chunks: serially, on local processes, or on Dask; resumable, never half-written.

The design space is cut into chunks (one model, one device count, one cluster
variant, a slice of the strategies). Each chunk is evaluated by a pure
function in a worker, which writes it to ``<output>.parts/part-<id>.parquet``
(atomically; a local folder or an fsspec URL) and sends the driver only a
small summary. ``--resume`` skips the chunks already there. When all are done
the parts become the output: a dataset folder (the parts, linked), or one file
joined from them without re-encoding, or a CSV; each written under a temporary
name and renamed, so an interrupted and resumed run produces the same bytes as
an uninterrupted one, and memory stays bounded by a few chunks.

Safety (docs/reliability.md): the parts folder records a digest of every input
and is locked while a run writes it; damaged chunks and temporaries of dead
runs are cleaned up; workers ignore Ctrl-C (the driver stops the run and says
so in one line) and exit when the driver dies.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

try:
    import fcntl
except ImportError:          # not POSIX: no lock between runs
    fcntl = None

from comet_dse.base import jsonout, written
from comet_dse.base.allocator import keep_freed_memory
from comet_dse.base.errors import InputError, RunFailed, StorageError
from comet_dse.design_space.output import (
    check_output_file, csv_table, output_parent, remove_stale_temps, to_arrow, write_dataset,
)
from comet_dse.design_space.parquet_concat import ParquetJoinError, join
from comet_dse.design_space.rank import chunk_summary, merge
from comet_dse.design_space.space import enumerate_strategies
from comet_dse.design_space.storage import Folder, is_url, parquet_options
from comet_dse.design_space.study import Study
from comet_dse.design_space.table import economic_columns, evaluate_columns
from comet_dse.workload.families import family_of

CHUNK_ROWS = 250_000
PARENT_POLL_S = 0.5          # how often a worker checks that its parent still runs
SCHEDULER_TIMEOUT_S = 5      # how long to try to reach a Dask scheduler


def structural(rules: tuple) -> int:
    """The bits of a family's divisibility rules (every rule but memory and step time) in its result tables."""
    return sum(1 << i for i, code in enumerate(rules) if code not in ("memory", "step_time"))


@dataclass(frozen=True)
class Chunk:
    """One unit of work: everything a worker needs, nothing it must look up."""

    index: int
    model_index: int
    devices: int
    variant_index: int
    start: int
    stop: int


def plan(study: Study) -> tuple:
    """(chunks, strategies): strategies[(model_index, devices, global_batch)] are StrategyArrays (with the
    variant's MP grid appended to the key where the study has per-cluster grids: ``_strategy_set``).

    Raises InputError when a (model, devices) pair has no structurally valid strategy.
    """
    strategies, chunks = {}, []
    for mi, model in enumerate(study.models):
        for variant in study.variants:
            for devices in variant.devices:
                key = _strategy_set(study, mi, devices, variant)
                if key in strategies:
                    continue
                st = enumerate_strategies(model, devices, variant.global_batch, study.space_for(variant), limit=None)
                probe = evaluate_columns(model, variant.cluster, devices, st)
                if not np.any((probe["infeasible_mask"] & structural(family_of(model).rules)) == 0):
                    raise InputError("strategy", f"no valid strategy for {model.name} on {devices} devices with "
                                     f"global batch {variant.global_batch}: every point breaks a divisibility rule")
                strategies[key] = st
    for mi in range(len(study.models)):
        for variant in study.variants:
            for devices in variant.devices:
                n = len(strategies[_strategy_set(study, mi, devices, variant)])
                for start in range(0, n, CHUNK_ROWS):
                    chunks.append(Chunk(len(chunks), mi, devices, variant.index, start, min(n, start + CHUNK_ROWS)))
    return chunks, strategies


def _strategy_set(study: Study, model_index: int, devices: int, variant) -> tuple:
    """The key of a variant's strategy set: model, device count, global batch, and its MP grid if it has one."""
    grid = study.strategy_key(variant)
    return (model_index, devices, variant.global_batch) + ((grid,) if grid else ())


def first_points(study: Study, n: int) -> list:
    """The first ``n`` design points in the order a sweep evaluates them, without evaluating any:
    [(model name, devices, variant label, Strategy)]."""
    out, cache = [], {}
    for mi, model in enumerate(study.models):
        for variant in study.variants:
            for devices in variant.devices:
                key = _strategy_set(study, mi, devices, variant)
                if key not in cache:
                    cache[key] = enumerate_strategies(model, devices, variant.global_batch, study.space_for(variant),
                                                      limit=None)
                st = cache[key]
                for i in range(min(len(st), n - len(out))):
                    out.append((model.name, devices, variant.label, st.strategy(i)))
                if len(out) >= n:
                    return out
    return out


def run_chunk(study: Study, chunk: Chunk, st) -> pa.Table:
    """Evaluate one chunk (``st``: its slice of the strategies) into an Arrow table; pure."""
    model = study.models[chunk.model_index]
    variant = study.variants[chunk.variant_index]
    cols = evaluate_columns(model, variant.cluster, chunk.devices, st)
    n = chunk.stop - chunk.start
    ids = {"model": np.full(n, chunk.model_index), "devices": np.full(n, chunk.devices, dtype=np.int64),
           "variant": np.full(n, chunk.variant_index, dtype=np.int64)}
    for axis, value in variant.values.items():
        ids[f"axis_{axis}"] = np.full(n, value) if not isinstance(value, str) else np.full(n, value, dtype=object)
    ids.update(economic_columns(variant.cluster, chunk.devices, cols, study.token_budget,
                                model.total_params()))
    bad = cols["feasible"] & ~(np.isfinite(cols["step_time_s"]) & (cols["step_time_s"] > 0))
    if np.any(bad):      # never rank a wrong answer: input validation should make this impossible
        raise RuntimeError(f"comet-dse bug: a feasible point of {variant.label} has step time "
                           f"{cols['step_time_s'][np.flatnonzero(bad)[0]]!r}; please report it with the study")
    table = to_arrow({**ids, **cols})
    names = [m.name for m in study.models]
    model_col = pa.DictionaryArray.from_arrays(pa.array(ids["model"].astype(np.int32)), pa.array(names))
    return table.set_column(0, "model", model_col)


@dataclass(frozen=True)
class Job:
    """What a worker gets for one chunk (a few KB): the study without its other variants, the chunk,
    the key of its strategy set (``token``: the run's input digest), where parts go and how many rows
    its summary keeps. The worker enumerates the strategies itself (``strategies_of``)."""

    study: Study
    chunk: Chunk
    token: str
    parts: Folder
    top_k: int


_STRATEGIES: dict = {}          # per process: (token, model, devices, batch) -> StrategyArrays, the last few


def strategies_of(job: Job):
    """The chunk's slice of its strategy set, enumerated in this process once per set (as ``plan`` does)."""
    c = job.chunk
    variant = job.study.variants[c.variant_index]
    batch = variant.global_batch
    key = (job.token, *_strategy_set(job.study, c.model_index, c.devices, variant))
    if key not in _STRATEGIES:
        while len(_STRATEGIES) >= 4:
            _STRATEGIES.pop(next(iter(_STRATEGIES)))
        _STRATEGIES[key] = enumerate_strategies(job.study.models[c.model_index], c.devices, batch,
                                                job.study.space_for(variant), limit=None)
    return _STRATEGIES[key].take(np.arange(c.start, c.stop))


def _task(job: Job) -> tuple:
    """Evaluate one chunk and write it where the run keeps its parts; returns only (index, summary, rows).

    Runs in a pool worker, a Dask worker or the driver (module level so that it pickles). The
    summary is written before the rows: a chunk counts as done once its rows exist (PartStore).
    """
    c = job.chunk
    table = run_chunk(job.study, c, strategies_of(job))
    summary = chunk_summary(table, job.top_k, family_of(job.study.models[c.model_index]).rules)
    job.parts.write_bytes(f"part-{c.index:06d}.json", jsonout.dumps(summary).encode("utf-8"))
    job.parts.write_parquet(f"part-{c.index:06d}.parquet", table)
    return c.index, summary, table.num_rows


class PartStore:
    """The folder of finished chunks next to the final output, locked by the run that writes it.

    ``<output>.parts/plan.json`` records the digest of every input (Study.inputs);
    ``--resume`` continues only a folder with the same digests, and keeps only
    chunks whose rows and summary are complete. Workers write the parts
    themselves (``_task``), to a local folder or an fsspec URL (``storage.Folder``).
    Temporaries of dead runs are removed (on this machine).
    """

    def __init__(self, output, study: Study, chunks: list, resume: bool):
        self.url = is_url(str(output))
        self.output = str(output) if self.url else Path(output)
        self.folder = f"{output}.parts" if self.url else self.output.with_name(self.output.name + ".parts")
        self.parts = Folder(self.folder)
        self.token = study.fingerprint()
        self.rows = [c.stop - c.start for c in chunks]
        marker = {"fingerprint": self.token, "chunks": len(chunks), "inputs": study.inputs}
        self.lock = None
        created = self._make_remote() if self.url else self._make_local()
        if created:
            self.parts.write_bytes("plan.json", json.dumps(marker).encode("utf-8"))
        else:
            self._check_resume(marker, resume)
        if not self.url:
            written.remove_stale_temps_in(self.folder)
            remove_stale_temps(self.output)
            if check_output_file(self.output) != "dataset":
                remove_stale_temps(summary_path(self.output))
        self.finished = {i for i in range(len(chunks)) if self._complete(i)}

    def _make_local(self) -> bool:
        """Create (or find) the local parts folder and lock it; True if it is new."""
        try:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise written.failure("output", "create", self.folder.parent, exc) from None
        try:
            self.folder.mkdir()
            created = True
        except FileExistsError:
            created = False
        except OSError as exc:
            raise written.failure("output", "create", self.folder, exc) from None
        if not self.folder.is_dir() or self.folder.is_symlink():
            raise InputError("output", f"{self.folder} exists and is not a folder this tool made; move it away")
        if hasattr(os, "getuid") and self.folder.stat().st_uid != os.getuid():
            raise InputError("output", f"{self.folder} belongs to another user; comet-dse continues only a parts "
                             "folder of its own; move it away")
        self.lock = _lock(self.folder, self.output)
        return created

    def _make_remote(self) -> bool:
        """Create (or find) the parts folder at a URL (no lock there: docs/reliability.md); True if it is new."""
        try:
            kind = self.parts.kind()
            if kind == "file":
                raise InputError("output", f"{self.folder} exists and is not a folder this tool made; move it away")
            self.parts.make()
        except OSError as exc:
            raise InputError("output", f"cannot create {self.folder}: {exc}") from None
        return kind == "missing" or "plan.json" not in self.parts.names()

    def _check_resume(self, marker: dict, resume: bool) -> None:
        """Continue an earlier run's folder only with --resume and only with the same inputs."""
        if not resume:
            self.release()
            raise InputError("output", f"{self.folder} holds an earlier unfinished run; pass --resume to continue it "
                             "or delete the folder")
        try:
            saved = self.parts.read_json("plan.json")
        except (OSError, ValueError):
            saved = None
        if saved != marker:
            self.release()
            if not isinstance(saved, dict) or not isinstance(saved.get("inputs"), dict):
                raise InputError("resume", f"{self.folder} was not started by this version of comet-dse; "
                                 "delete it to start over")
            old, new = saved["inputs"], marker["inputs"]
            changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
            what = ", ".join(changed) or "the number of chunks"
            raise InputError("resume", f"{self.folder} was started with other inputs (changed: {what}); resuming "
                             "would mix results; delete the folder to start over")

    def _complete(self, index: int) -> bool:
        """Whether chunk ``index`` is done: its summary parses and its rows file holds all its rows.
        A damaged chunk (e.g. truncated by a crash) is removed, to be evaluated again."""
        rows = self.name(index)
        if self.parts.kind(rows) != "file":
            return False
        try:
            self.parts.read_json(f"part-{index:06d}.json")
            if self.parts.parquet_rows(rows) == self.rows[index]:
                return True
        except (OSError, ValueError, pa.ArrowException):
            pass
        self.parts.remove(rows)
        return False

    @staticmethod
    def name(index: int) -> str:
        """File name of chunk ``index``'s rows (its summary: the same with .json)."""
        return f"part-{index:06d}.parquet"

    def path(self, index: int):
        return f"{self.folder}/{self.name(index)}" if self.url else self.folder / self.name(index)

    def done(self, index: int) -> bool:
        return index in self.finished

    def arrived(self, index: int) -> None:
        """A worker reports chunk ``index`` written: check that its rows are where this run keeps parts."""
        if self.parts.kind(self.name(index)) != "file":
            raise InputError("output", f"a worker evaluated chunk {index} but its rows are not in {self.folder}; "
                             "with --scheduler the output must be on storage every worker reaches "
                             "(a shared file system or an fsspec URL)")
        self.finished.add(index)

    def summaries(self, total: int, known: dict) -> list:
        """Every chunk's summary: those of this run from ``known``, the others from the parts folder."""
        return [known[i] if i in known else self.parts.read_json(f"part-{i:06d}.json") for i in range(total)]

    def assemble(self, total: int, extra: dict | None = None) -> None:
        """Put the parts together as the output (dataset folder, one Parquet or CSV file); remove the parts.
        ``extra`` (name -> bytes): files a dataset folder holds beside its parts (its summary)."""
        fmt = check_output_file(self.output)
        try:
            if fmt == "dataset":
                write_dataset(self.parts, [self.name(i) for i in range(total)], self.output, extra or {})
            else:
                writer = _join_parts if fmt == "parquet" else _csv_parts
                if self.url:
                    target, name = output_parent(self.output)
                    target.write_with(name, lambda handle: writer(self.parts, total, handle))
                else:          # the output rule, checked again just before the rename (written.write_file)
                    remove_stale_temps(self.output)
                    written.write_file(self.output, lambda tmp: _into_local(tmp, lambda h: writer(self.parts, total, h)))
        except OSError as exc:
            if self.url:
                raise InputError("output", f"cannot write {self.output}: {exc.strerror or exc}") from None
            raise written.failure("output", "write", self.output, exc) from None
        self.parts.remove_all()

    def release(self) -> None:
        """Give up the lock (the run is over, or refused)."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None


def _into_local(path, write) -> None:
    """Run ``write(handle)`` on a pyarrow output stream of the local file ``path`` (the handle type the
    part writers take, local or remote)."""
    with pafs.LocalFileSystem().open_output_stream(str(path)) as handle:
        write(handle)


def _join_parts(parts: Folder, total: int, handle) -> None:
    """The parts, in chunk order, as one Parquet file: their bytes joined, nothing re-encoded
    (parquet_concat); parts it cannot join (differing schemas) are re-encoded into the first one's schema.
    ``join`` refuses before writing a byte, so the fallback starts from an empty ``handle``."""
    names = [PartStore.name(i) for i in range(total)]
    try:
        join([lambda n=n: parts.open(n) for n in names], handle)
        return
    except ParquetJoinError:
        pass
    writer = None
    for n in names:
        with parts.open(n) as source:
            table = pq.read_table(source)
        if writer is None:
            writer = pq.ParquetWriter(handle, table.schema, **parquet_options(table.schema))
        writer.write_table(table.cast(writer.schema))
    if writer is not None:
        writer.close()


def _csv_parts(parts: Folder, total: int, handle) -> None:
    """The parts, in chunk order, as one CSV file (dictionary columns written as their strings)."""
    writer = None
    for i in range(total):
        with parts.open(PartStore.name(i)) as source:
            table = pq.read_table(source)
        plain = csv_table(table)
        writer = writer or pacsv.CSVWriter(handle, plain.schema)
        writer.write_table(plain)
    if writer is not None:
        writer.close()


def _lock(folder: Path, output: Path):
    """An exclusive lock on ``folder``/lock, held while the returned file stays open (the kernel
    drops it when the process dies); an InputError names the run that holds it. The lock file is opened
    through no link and must be a regular file (a link planted there is never written through)."""
    path = folder / "lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0),
                     0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError("output", f"{path} is a symbolic link; move {folder} away") from None
        raise written.failure("output", "create", path, exc) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError("output", f"{path} is not a regular file; move {folder} away")
    handle = open(fd, "a+", encoding="utf-8")
    if fcntl is None:
        return handle
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        owner = handle.read().strip() or "another process"
        handle.close()
        raise InputError("output", f"another comet-dse run ({owner}) is writing {output}; "
                         "wait for it to end or choose another --output") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}")
    handle.flush()
    return handle


SUMMARY_IN_DATASET = "_summary.json"    # a dataset folder's ranking; readers skip names starting with _


def summary_path(output):
    """Where the ranking of a sweep is written, so that it goes with the output it describes: inside a dataset
    folder (``SUMMARY_IN_DATASET``, listed in the folder's manifest: deleting the folder deletes it), and next
    to a single file (``<name>.summary.json``); a URL for a URL."""
    if check_output_file(output) == "dataset":
        return f"{str(output).rstrip('/')}/{SUMMARY_IN_DATASET}" if is_url(str(output)) \
            else Path(output) / SUMMARY_IN_DATASET
    if is_url(str(output)):
        return f"{str(output).rstrip('/')}.summary.json"
    output = Path(output)
    return output.with_name(output.name + ".summary.json")


def local_workers(requested: int) -> int:
    """How many worker processes this machine runs for ``requested``: at most one per CPU (os.cpu_count()).
    More only contend for the CPUs and hold memory each (``--workers 100000`` forked over 1,000 processes
    before the machine ran out of them); a remote Dask scheduler's workers are not counted here."""
    return max(1, min(int(requested), os.cpu_count() or 1))


def run_study(study: Study, output, *, engine: str = "local", workers: int = 1, scheduler: str | None = None,
              resume: bool = False, progress: bool = True, on_chunk=None, top_k: int = 5, on_start=None) -> dict:
    """Evaluate the whole study into ``output``; returns the ranking (rank.merge) plus run counts.

    ``output``: a ``.parquet`` or ``.csv`` file, or a name without a suffix for a
    dataset folder of Parquet parts; a local path or an fsspec URL (``storage``).
    ``on_start(points, chunks, chunks already done)`` is called once the plan is
    made and the output folder locked, before any evaluation. The ranking is
    also written to ``summary_path(output)``. ``workers`` on this machine (local
    processes, a local Dask cluster) are capped at its CPUs (``local_workers``).
    """
    if not (engine == "dask" and scheduler):
        workers = local_workers(workers)
    output = str(output) if is_url(str(output)) else Path(output)
    dataset = check_output_file(output, study.files) == "dataset"
    if not is_url(str(output)) and not dataset:     # a dataset's summary is checked with its folder
        written.check_file(summary_path(output), "output", study.files)
    chunks, strategies = plan(study)
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(_dask_client(workers, scheduler)) if engine == "dask" else None
        store = PartStore(output, study, chunks, resume)      # after the scheduler answered: nothing left behind
        stack.callback(store.release)
        try:
            return _run(study, output, chunks, store, client, workers, progress, on_chunk, top_k, on_start)
        except (RunFailed, StorageError, InputError):
            raise
        except OSError as exc:        # a full disk while a part or the output is written: name the output
            raise written.failure("output", "write", output, exc) from None


def _run(study, output, chunks, store, client, workers, progress, on_chunk, top_k, on_start) -> dict:
    """run_study once the output is locked: evaluate the missing chunks (workers write their parts and
    send back a summary each), rank from the summaries, assemble the output."""
    todo = [c for c in chunks if not store.done(c.index)]
    points = sum(c.stop - c.start for c in chunks)
    if on_start is not None:
        on_start(points, len(chunks), len(chunks) - len(todo))
    bar = _progress(study.name, points, sum(c.stop - c.start for c in chunks if store.done(c.index)), progress)
    summaries = {}

    def finished(index: int, summary: dict, rows: int) -> None:
        store.arrived(index)
        summaries[index] = summary
        bar.update(rows)
        if on_chunk is not None:
            on_chunk(index)

    def payload(c: Chunk) -> Job:
        # only what the chunk reads travels to a worker: the models and its variant, not every variant,
        # and not its strategies (the worker enumerates them: strategies_of)
        slim = dataclasses.replace(study, variants={c.variant_index: study.variants[c.variant_index]},
                                   source_text="", inputs={})
        return Job(slim, c, store.token, store.parts, top_k)

    try:
        if client is not None:
            _run_dask(client, todo, payload, finished, workers)
        elif workers > 1:
            _run_processes(todo, payload, finished, workers, store.folder)
        else:
            for c in todo:
                finished(*_task(payload(c)))
    finally:
        bar.close()
    ranking = merge(store.summaries(len(chunks), summaries), study.variants, study.baseline, top_k,
                    study.token_budget)
    ranking.update({"study": study.name, "chunks": len(chunks), "points": points,
                    "skipped": len(chunks) - len(todo), "output": str(output)})
    summary = jsonout.dumps(ranking, indent=1).encode("utf-8")
    if check_output_file(output) == "dataset":
        store.assemble(len(chunks), extra={SUMMARY_IN_DATASET: summary})
    else:
        store.assemble(len(chunks))
        _write_summary(summary_path(output), summary)
    return ranking


def _write_summary(path, data: bytes) -> None:
    """The ranking (JSON) beside a single-file output: a local file through written.write_file, a URL whole."""
    if is_url(str(path)):
        parent, name = output_parent(path)
        parent.write_bytes(name, data)
    else:
        written.write_file(path, lambda tmp: Path(tmp).write_bytes(data))


def _progress(name: str, total: int, done: int, enabled: bool):
    """The progress bar of one study's design points, labelled with the study's name (a report runs several)."""
    from tqdm import tqdm

    from comet_dse.base.text import printable

    return tqdm(total=total, initial=done, unit="pt", unit_scale=True, disable=not enabled, file=sys.stderr,
                desc=printable(name), mininterval=0.5, smoothing=0.1)


def worker_setup(parent: int | None = None) -> None:
    """In a worker process: leave Ctrl-C to the parent (which stops the run and prints one line), and
    exit as soon as the parent ``parent`` (default: the current parent) is gone, even after kill -9."""
    parent = os.getppid() if parent is None else parent
    keep_freed_memory()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(parent,), name="comet-parent-watch", daemon=True).start()


def _dask_task(jobs: list) -> list:
    """_task for each of ``jobs`` (consecutive chunks: _batches) on a Dask worker, local or remote, with glibc
    set to reuse freed memory (allocator.keep_freed_memory: Dask's nanny starts workers with
    MALLOC_TRIM_THRESHOLD_=65536, which makes every temporary array a page-faulting mmap; a sweep on Dask
    took 58 s where local processes took 16 s)."""
    keep_freed_memory()
    return [_task(job) for job in jobs]


def _batches(chunks: list, rows: int) -> list:
    """Consecutive chunks in groups of at most ``rows`` rows (at least one chunk each): a Dask task each,
    so that the scheduler, whose cost is per task, handles fewer and larger tasks than chunks."""
    out, size = [], 0
    for c in chunks:
        n = c.stop - c.start
        if out and size + n <= rows:
            out[-1].append(c)
            size += n
        else:
            out.append([c])
            size = n
    return out


def dask_setup(worker) -> None:
    """Dask preload hook (``preload=["comet_dse.design_space.engine"]``): worker_setup in each local Dask worker."""
    worker_setup()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _run_processes(todo: list, payload, finished, workers: int, parts=None) -> None:
    """A pool of local processes; at most 2 chunks in flight per worker (bounded memory).

    Workers ignore Ctrl-C and exit with their parent (worker_setup); on an
    interruption the queued chunks are cancelled and the running ones finish.
    A worker that dies (killed, out of memory) breaks the pool: that is a
    failure of the machine, not of the input, and ends the run with one line
    (``RunFailed``, exit status 1) naming the parts folder ``parts`` that
    ``--resume`` continues from.
    """
    import concurrent.futures as cf
    import multiprocessing
    from concurrent.futures.process import BrokenProcessPool

    context = multiprocessing.get_context("fork") if hasattr(os, "fork") else None
    try:
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=worker_setup,
                                    initargs=(os.getpid(),)) as pool:
            try:
                pending, queue = set(), list(todo)
                while queue or pending:
                    while queue and len(pending) < 2 * workers:
                        pending.add(pool.submit(_task, payload(queue.pop(0))))
                    done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                    for future in done:
                        finished(*future.result())
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    except BrokenProcessPool:
        raise RunFailed(f"a worker process died (killed, or out of memory); the finished chunks are kept in "
                        f"{parts}: run again with --resume") from None


@contextlib.contextmanager
def _dask_client(workers: int, scheduler: str | None):
    """A Dask client: of the scheduler at ``scheduler`` (an InputError within SCHEDULER_TIMEOUT_S if it
    does not answer), or of a local cluster of ``workers`` processes (which ignore Ctrl-C and exit with
    this process: worker_setup). The local cluster logs nothing: a failed task reaches the driver as its
    exception, and an interruption's closing connections are not errors to show."""
    warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)  # a chunk's strategies
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError("engine", "dask is not installed; pip install 'comet-dse[distributed]'") from None
    cluster = client = None
    try:
        if scheduler:
            client = _connect(Client, scheduler)
        else:
            with _starting_workers():
                cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                                       dashboard_address=":0", silence_logs=logging.CRITICAL, preload=[__name__])
            client = Client(cluster)
        yield client
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()


def _connect(client_type, scheduler: str):
    """A client of the scheduler at ``scheduler``, or one InputError naming `scheduler` within about
    SCHEDULER_TIMEOUT_S: Dask's handshake is tried first (``_handshake``), since a Client waits forever
    for a port that accepts and says nothing."""
    _handshake(scheduler)
    try:
        return client_type(scheduler, timeout=SCHEDULER_TIMEOUT_S)
    except (OSError, TimeoutError):
        raise InputError("scheduler", f"no Dask scheduler answered at {scheduler!r} within "
                         f"{SCHEDULER_TIMEOUT_S} s") from None
    except (ValueError, TypeError):
        raise InputError("scheduler", f"{scheduler!r} is not a scheduler address; give tcp://HOST:PORT") from None
    except Exception as exc:              # anything else the client trips on is still not a usable scheduler
        raise InputError("scheduler", f"{scheduler!r} did not accept a Dask client ({type(exc).__name__}); "
                         "give the address of a running Dask scheduler, tcp://HOST:PORT") from None


def _handshake(scheduler: str) -> None:
    """Open one connection to ``scheduler`` and complete Dask's handshake, all within SCHEDULER_TIMEOUT_S,
    or raise an InputError naming `scheduler`. distributed's own connect bounds the TCP connection but not
    the handshake's read: a port that accepts and never answers hung the sweep, and an HTTP server's
    answer read as a frame length was a MemoryError traceback. Runs on an event loop of its own thread,
    whatever loop the caller may run."""
    import asyncio
    import concurrent.futures

    from distributed.comm import connect

    async def probe():
        comm = await asyncio.wait_for(connect(scheduler, timeout=SCHEDULER_TIMEOUT_S), SCHEDULER_TIMEOUT_S)
        await comm.close()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="comet-dask-probe") as pool:
        future = pool.submit(asyncio.run, probe())
        try:
            future.result()
        except (OSError, TimeoutError, asyncio.TimeoutError):
            raise InputError("scheduler", f"no Dask scheduler answered at {scheduler!r} within "
                             f"{SCHEDULER_TIMEOUT_S} s") from None
        except (ValueError, TypeError, KeyError):
            raise InputError("scheduler", f"{scheduler!r} is not a scheduler address; give tcp://HOST:PORT") from None
        except Exception as exc:          # a MemoryError or a protocol error: something else answered
            raise InputError("scheduler", f"{scheduler!r} answered, but not as a Dask scheduler "
                             f"({type(exc).__name__}); give the address of a running Dask scheduler, "
                             "tcp://HOST:PORT") from None


@contextlib.contextmanager
def _starting_workers():
    """While a local cluster starts: a Ctrl-C in the main thread is held (not raised inside a half-started
    cluster) and raised as KeyboardInterrupt at the end, also if it made the start fail; the processes
    started meanwhile inherit a stderr that goes nowhere (one that Ctrl-C reaches before worker_setup
    ignores it would print a traceback)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed = []
    previous = signal.signal(signal.SIGINT, lambda *_: pressed.append(True))
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    except Exception:
        if not pressed:
            raise
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt


def _run_dask(client, todo: list, payload, finished, workers: int) -> None:
    """Run the chunks on Dask in tasks of consecutive chunks (_batches, up to CHUNK_ROWS rows), at most
    2 tasks per worker in flight.

    A task whose worker dies is re-run elsewhere by the scheduler; its chunks
    are written whole under their names or not at all, and a re-run writes the
    same bytes, so rows are never lost or duplicated.
    """
    from distributed import as_completed

    queue = _batches(todo, CHUNK_ROWS)
    window = 2 * max(1, len(client.scheduler_info().get("workers", {})) or workers)
    futures = as_completed(loop=client.loop)

    def submit(batch: list) -> None:
        key = f"comet-chunks-{batch[0].index}-{batch[-1].index}"
        futures.add(client.submit(_dask_task, [payload(c) for c in batch], key=key, retries=3))

    for _ in range(min(window, len(queue))):
        submit(queue.pop(0))
    for future in futures:
        for result in future.result():
            finished(*result)
        future.release()
        if queue:
            submit(queue.pop(0))
