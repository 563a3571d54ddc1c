"""Sweeps that scale: workers write their parts, the output is a dataset folder or one file joined without
re-encoding, a URL output works like a path, and a killed Dask worker loses and duplicates nothing."""
import io
import pickle
import shutil
import socket
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from comet_dse.base.written import LEDGER
from comet_dse.cli import main
from comet_dse.design_space import engine
from comet_dse.design_space.output import DATASET_MARKER
from comet_dse.design_space.parquet_concat import ParquetJoinError, _write_struct, join, read_footer
from comet_dse.design_space.study import load_study
from dask_kill import sweep_killing_a_worker

STUDY = """
name: scale
models: [megatron-18b]
cluster: dgx-a100-80gb
devices: [64]
global_batch: 256
axes:
  hbm_capacity: {scale: [0.5, 1.0]}
  network.infiniband.link_bandwidth: {values: ["25 GB/s", "50 GB/s"]}
strategy:
  tp: [2, 4, 8]
  micro_batch: [1, 2]
  zero: [0, 1]
"""


@pytest.fixture
def study_path(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(engine, "CHUNK_ROWS", 300)
    path = tmp_path / "study.yaml"
    path.write_text(STUDY)
    return path


def _files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _same_dataset(folder: Path, other: Path) -> None:
    """Two dataset folders hold the same files, the same rows byte for byte, and the same ranking in their
    summaries (which name their own folder and how many chunks a resumed run skipped)."""
    files, others = _files(folder), _files(other)
    assert files.keys() == others.keys()
    parts = [name for name in files if name.endswith(".parquet")]
    assert parts and all(files[name] == others[name] for name in parts)

    def ranking_of(found: dict) -> dict:
        summary = yaml.safe_load(found[engine.SUMMARY_IN_DATASET])
        return {k: v for k, v in summary.items() if k not in ("skipped", "output")}

    assert ranking_of(files) == ranking_of(others)


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def test_join_reads_as_the_concatenation_and_copies_pages_unchanged():
    tables = [pa.table({"x": np.arange(n, dtype=float), "name": pa.array([f"r{i % 3}" for i in range(n)])
                        .dictionary_encode()}) for n in (5, 1000, 17)]
    parts = [_parquet_bytes(t) for t in tables]
    for data in parts:                      # the footer reader and writer round-trip byte for byte
        fields, start = read_footer(io.BytesIO(data))
        out = bytearray()
        _write_struct(out, fields)
        assert bytes(out) == data[start:-8]
    sink = io.BytesIO()
    assert join([lambda d=d: io.BytesIO(d) for d in parts], sink) == 1022
    joined = sink.getvalue()
    assert pq.read_table(io.BytesIO(joined)).equals(pa.concat_tables([pq.read_table(io.BytesIO(p)) for p in parts]))
    assert pq.ParquetFile(io.BytesIO(joined)).metadata.num_row_groups == 3
    for data in parts:                      # every part's pages are in the joined file as they were
        _, start = read_footer(io.BytesIO(data))
        assert data[4:start] in joined


def test_join_refuses_other_schemas_before_writing():
    parts = [_parquet_bytes(pa.table({"x": [1.0]})), _parquet_bytes(pa.table({"x": [1]}))]
    sink = io.BytesIO()
    with pytest.raises(ParquetJoinError, match="schemas"):
        join([lambda d=d: io.BytesIO(d) for d in parts], sink)
    assert sink.getvalue() == b""


def test_dataset_output_is_one_table_equal_to_the_single_file(study_path, tmp_path):
    study = load_study(study_path)
    ranking = engine.run_study(study, tmp_path / "one.parquet", progress=False)
    engine.run_study(load_study(study_path), tmp_path / "ds", progress=False, workers=2)
    folder = tmp_path / "ds"
    names = sorted(p.name for p in folder.iterdir())
    assert names == [DATASET_MARKER, engine.SUMMARY_IN_DATASET] + [f"part-{i:06d}.parquet"
                                                                   for i in range(ranking["chunks"])]
    single = pq.read_table(tmp_path / "one.parquet")
    assert pq.read_table(folder).equals(single)                    # pyarrow reads the folder as one table
    pd = pytest.importorskip("pandas")
    assert len(pd.read_parquet(folder)) == single.num_rows
    assert not (tmp_path / "ds.parts").exists() and not (tmp_path / "ds.summary.json").exists()
    summary = yaml.safe_load((folder / engine.SUMMARY_IN_DATASET).read_text())     # the ranking goes with the folder
    assert (summary["study"], summary["points"], summary["output"]) == (ranking["study"], ranking["points"], str(folder))
    engine.run_study(load_study(study_path), folder, progress=False)   # an earlier dataset is replaced
    assert pq.read_table(folder).equals(single)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [LEDGER]    # no temporaries


def test_interrupted_dataset_sweep_resumes_to_identical_files(study_path, tmp_path):
    engine.run_study(load_study(study_path), tmp_path / "clean", progress=False)

    def stop(index):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.run_study(load_study(study_path), tmp_path / "resumed", progress=False, on_chunk=stop)
    assert not (tmp_path / "resumed").exists()                  # no final name before the whole result
    ranking = engine.run_study(load_study(study_path), tmp_path / "resumed", progress=False, resume=True)
    assert ranking["skipped"] == 1
    _same_dataset(tmp_path / "resumed", tmp_path / "clean")


def test_dataset_output_refuses_a_foreign_folder_or_a_file(study_path, tmp_path, capsys):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("keep me")
    (tmp_path / "afile").write_text("x")
    for target, needle in ((tmp_path / "theirs", "did not write"), (tmp_path / "afile", "is not a folder")):
        assert main(["sweep", str(study_path), "--output", str(target), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert (tmp_path / "theirs" / "notes.txt").read_text() == "keep me"


def test_url_output_equals_a_path_output(study_path, tmp_path):
    pytest.importorskip("fsspec")
    engine.run_study(load_study(study_path), tmp_path / "local.parquet", progress=False)
    url = f"file://{tmp_path}/remote/r.parquet"
    ranking = engine.run_study(load_study(study_path), url, progress=False, workers=2)
    assert ranking["output"] == url
    assert (tmp_path / "remote" / "r.parquet").read_bytes() == (tmp_path / "local.parquet").read_bytes()
    assert (tmp_path / "remote" / "r.parquet.summary.json").is_file()
    assert not (tmp_path / "remote" / "r.parquet.parts").exists()


def test_a_worker_sends_back_a_summary_not_the_rows(study_path, tmp_path):
    study = load_study(study_path)
    chunks, _ = engine.plan(study)
    store = engine.PartStore(tmp_path / "r", study, chunks, resume=False)
    try:
        job = engine.Job(study, chunks[0], store.token, store.parts, 5)
        result = engine._task(job)
    finally:
        store.release()
    assert result[0] == 0 and result[2] == chunks[0].stop - chunks[0].start
    assert len(pickle.dumps(result)) < 16_000                   # the rows stay where the worker wrote them
    assert pq.read_metadata(store.path(0)).num_rows == result[2]


def test_temporaries_of_dead_workers_on_this_machine_are_removed(study_path, tmp_path):
    parts = tmp_path / "r.parquet.parts"
    engine.run_study(load_study(study_path), tmp_path / "r.parquet", progress=False)
    dead = tmp_path / f".r.parquet.tmp-{2**22 + 7}@{socket.gethostname()}"
    other_host = tmp_path / f".r.parquet.tmp-{2**22 + 7}@another-host"
    dead.write_text("x")
    other_host.write_text("x")
    engine.run_study(load_study(study_path), tmp_path / "r.parquet", progress=False)
    assert not dead.exists() and other_host.exists() and not parts.exists()


def test_dask_dataset_sweep_survives_a_killed_worker(study_path, tmp_path):
    """LocalCluster with worker processes: a worker killed mid-sweep loses and duplicates no row."""
    distributed = pytest.importorskip("distributed")
    engine.run_study(load_study(study_path), tmp_path / "serial", progress=False)
    ranking, killed = sweep_killing_a_worker(distributed, load_study(study_path), tmp_path / "dask")
    assert killed and ranking["skipped"] == 0
    _same_dataset(tmp_path / "dask", tmp_path / "serial")


def test_the_allocator_is_set_once_and_by_the_command_line(monkeypatch, capsys):
    from comet_dse.base import allocator
    from comet_dse.cli import entry

    calls = []
    monkeypatch.setattr(entry, "keep_freed_memory", lambda: calls.append(1))
    assert main(["presets"]) == 0
    capsys.readouterr()
    assert calls == [1]
    allocator.keep_freed_memory()
    allocator.keep_freed_memory()               # idempotent, never raises (nothing without glibc)
    assert allocator._TUNED == [True]


def test_a_dataset_sweep_leaves_nothing_beside_its_folder(study_path, tmp_path):
    """The ranking of a dataset sweep lives in its folder (listed in its manifest): deleting the folder
    deletes it, nothing (no summary, no ledger) is left beside it, and a later run to the same name runs."""
    out = tmp_path / "out"
    folder = out / "ds"
    engine.run_study(load_study(study_path), folder, progress=False)
    assert engine.summary_path(folder) == folder / engine.SUMMARY_IN_DATASET and engine.summary_path(folder).is_file()
    assert sorted(p.name for p in out.iterdir()) == ["ds"]
    shutil.rmtree(folder)
    assert list(out.iterdir()) == []
    ranking = engine.run_study(load_study(study_path), folder, progress=False)
    assert ranking["skipped"] == 0 and (folder / engine.SUMMARY_IN_DATASET).is_file()
    engine.run_study(load_study(study_path), folder, progress=False)            # and replaces its own, summary too
    assert sorted(p.name for p in out.iterdir()) == ["ds"]
