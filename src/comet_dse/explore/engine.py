"""Running a study in chunks: serially, on local processes, or on Dask; resumable, never half-written.

The design space is cut into chunks (one model, one device count, one cluster
variant, a slice of the strategies). Each chunk is evaluated by a pure
function and written by the driver to ``<output>.parts/part-<id>.parquet``
(atomically, once). ``--resume`` skips the chunks already there. When all are
done the parts are streamed, in chunk order, into the final file (written to a
temporary name and renamed), so an interrupted and resumed run produces the
same file as an uninterrupted one, and memory stays bounded by a few chunks.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from comet_dse.errors import InputError
from comet_dse.explore.output import output_format, to_arrow
from comet_dse.explore.rank import chunk_summary, merge
from comet_dse.explore.space import enumerate_strategies
from comet_dse.explore.study import Study
from comet_dse.explore.table import RULES, evaluate_columns

CHUNK_ROWS = 250_000
STRUCTURAL = sum(1 << i for i, code in enumerate(RULES) if code != "memory")


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
    """(chunks, strategies): strategies[(model_index, devices, global_batch)] are StrategyArrays.

    Raises InputError when a (model, devices) pair has no structurally valid strategy.
    """
    strategies, chunks = {}, []
    for mi, model in enumerate(study.models):
        for variant in study.variants:
            for devices in variant.devices:
                key = (mi, devices, variant.global_batch)
                if key in strategies:
                    continue
                st = enumerate_strategies(model, devices, variant.global_batch, study.space)
                probe = evaluate_columns(model, variant.cluster, devices, st)
                if not np.any((probe["infeasible_mask"] & STRUCTURAL) == 0):
                    raise InputError("strategy", f"no valid strategy for {model.name} on {devices} devices with "
                                     f"global batch {variant.global_batch}: every point breaks a divisibility rule")
                strategies[key] = st
    for mi in range(len(study.models)):
        for variant in study.variants:
            for devices in variant.devices:
                n = len(strategies[(mi, devices, variant.global_batch)])
                for start in range(0, n, CHUNK_ROWS):
                    chunks.append(Chunk(len(chunks), mi, devices, variant.index, start, min(n, start + CHUNK_ROWS)))
    return chunks, strategies


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
    ids["cost_usd"] = np.full(n, float(chunk.devices * (variant.cluster.device_price_usd or np.nan)))
    ids["power_w"] = np.full(n, float(chunk.devices * (variant.cluster.device_power_w or np.nan)))
    table = to_arrow({**ids, **cols})
    names = [m.name for m in study.models]
    model_col = pa.DictionaryArray.from_arrays(pa.array(ids["model"].astype(np.int32)), pa.array(names))
    return table.set_column(0, "model", model_col)


def _task(args):
    """Process-pool / Dask entry point (module level so that it pickles)."""
    study, chunk, st = args
    return chunk.index, run_chunk(study, chunk, st)


class PartStore:
    """The folder of finished chunks next to the final output."""

    def __init__(self, output: Path, study: Study, total: int, resume: bool):
        self.output = Path(output)
        self.folder = self.output.with_name(self.output.name + ".parts")
        self.plan_file = self.folder / "plan.json"
        marker = {"fingerprint": study.fingerprint(), "chunks": total}
        if self.folder.exists():
            if not resume:
                raise InputError("output", f"{self.folder} holds an earlier unfinished run; pass --resume to continue it "
                                 "or delete the folder")
            try:
                saved = json.loads(self.plan_file.read_text())
            except (OSError, json.JSONDecodeError):
                saved = None
            if saved != marker:
                raise InputError("resume", f"{self.folder} belongs to a different study or version; delete it to start over")
        else:
            self.folder.mkdir(parents=True)
            self.plan_file.write_text(json.dumps(marker))

    def path(self, index: int) -> Path:
        return self.folder / f"part-{index:06d}.parquet"

    def done(self, index: int) -> bool:
        return self.path(index).exists()

    def write(self, index: int, table: pa.Table, summary: dict) -> None:
        """Write the chunk's summary, then its rows; a chunk counts as done once its rows exist."""
        _write_text(self.folder / f"part-{index:06d}.json", json.dumps(summary))
        tmp = self.folder / f".part-{index:06d}.tmp-{os.getpid()}"
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, self.path(index))

    def summaries(self, total: int) -> list:
        return [json.loads((self.folder / f"part-{i:06d}.json").read_text()) for i in range(total)]

    def assemble(self, total: int) -> None:
        """Stream every part, in chunk order, into the final file; then remove the parts."""
        fmt = output_format(self.output)
        tmp = self.output.with_name(f".{self.output.name}.tmp-{os.getpid()}")
        writer = None
        try:
            for index in range(total):
                table = pq.read_table(self.path(index))
                if fmt == "parquet":
                    writer = writer or pq.ParquetWriter(tmp, table.schema, compression="zstd")
                    writer.write_table(table)
                else:
                    plain = pa.Table.from_arrays(
                        [c.cast(pa.string()) if pa.types.is_dictionary(c.type) else c for c in table.columns],
                        names=table.column_names)
                    writer = writer or pacsv.CSVWriter(tmp, plain.schema)
                    writer.write_table(plain)
            if writer is not None:
                writer.close()
                writer = None
            os.replace(tmp, self.output)
        finally:
            if writer is not None:
                writer.close()
            if tmp.exists():
                tmp.unlink()
        shutil.rmtree(self.folder)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def summary_path(output: Path) -> Path:
    """Where the ranking of a sweep is written: next to the output, ``<name>.summary.json``."""
    output = Path(output)
    return output.with_name(output.name + ".summary.json")


def run_study(study: Study, output: Path, *, engine: str = "local", workers: int = 1, scheduler: str | None = None,
              resume: bool = False, progress: bool = True, on_chunk=None, top_k: int = 5) -> dict:
    """Evaluate the whole study into ``output``; returns the ranking (rank.merge) plus run counts.

    The ranking is also written to ``summary_path(output)``.
    """
    output = Path(output)
    output_format(output)
    chunks, strategies = plan(study)
    store = PartStore(output, study, len(chunks), resume)
    todo = [c for c in chunks if not store.done(c.index)]
    points = sum(c.stop - c.start for c in chunks)
    bar = _progress(points, sum(c.stop - c.start for c in chunks if store.done(c.index)), progress)

    def finished(index: int, table: pa.Table) -> None:
        store.write(index, table, chunk_summary(table, top_k))
        bar.update(table.num_rows)
        if on_chunk is not None:
            on_chunk(index)

    def payload(c: Chunk):
        variant = study.variants[c.variant_index]
        st = strategies[(c.model_index, c.devices, variant.global_batch)]
        return study, c, st.take(np.arange(c.start, c.stop))

    try:
        if engine == "dask":
            _run_dask(todo, payload, finished, workers, scheduler)
        elif workers > 1:
            _run_processes(todo, payload, finished, workers)
        else:
            for c in todo:
                finished(c.index, run_chunk(*payload(c)))
    finally:
        bar.close()
    ranking = merge(store.summaries(len(chunks)), study.variants, study.baseline, top_k, study.token_budget)
    ranking.update({"study": study.name, "chunks": len(chunks), "points": points,
                    "skipped": len(chunks) - len(todo), "output": str(output)})
    store.assemble(len(chunks))
    _write_text(summary_path(output), json.dumps(ranking, indent=1))
    return ranking


def _progress(total: int, done: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="pt", unit_scale=True, disable=not enabled, file=sys.stderr,
                desc="design points", mininterval=0.5, smoothing=0.1)


def _run_processes(todo: list, payload, finished, workers: int) -> None:
    """A pool of local processes; at most 2 chunks in flight per worker (bounded memory)."""
    import concurrent.futures as cf
    import multiprocessing

    context = multiprocessing.get_context("fork") if hasattr(os, "fork") else None
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        pending, queue = set(), list(todo)
        while queue or pending:
            while queue and len(pending) < 2 * workers:
                pending.add(pool.submit(_task, payload(queue.pop(0))))
            done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for future in done:
                finished(*future.result())


def _run_dask(todo: list, payload, finished, workers: int, scheduler: str | None) -> None:
    """Dask distributed: an existing scheduler, or a local cluster of ``workers`` processes.

    A task whose worker dies is re-run elsewhere by the scheduler; the driver
    writes each chunk once, when its result arrives, so rows are never lost or
    duplicated.
    """
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise InputError("engine", "dask is not installed; pip install 'comet-dse[distributed]'") from None
    cluster = None
    if scheduler:
        client = Client(scheduler)
    else:
        cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                               dashboard_address=":0", silence_logs=40)
        client = Client(cluster)
    try:
        queue = list(todo)
        window = 2 * max(1, len(client.scheduler_info().get("workers", {})) or workers)
        futures = as_completed(loop=client.loop)
        for _ in range(min(window, len(queue))):
            c = queue.pop(0)
            futures.add(client.submit(_task, payload(c), key=f"comet-chunk-{c.index}", retries=3))
        for future in futures:
            finished(*future.result())
            future.release()
            if queue:
                c = queue.pop(0)
                futures.add(client.submit(_task, payload(c), key=f"comet-chunk-{c.index}", retries=3))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
