"""Where a sweep's parts and results live: a local folder or an fsspec URL, every file written atomically.

A ``Folder`` is a local path or a URL that fsspec understands (``file://``,
``s3://``, ``gs://``, ``abfs://``, ... with the matching fsspec package), seen
through a pyarrow file system, so that the driver and every worker, local or on
another machine, read and write it the same way. A file is written under a
temporary name and moved to its name when complete: on a local or shared POSIX
file system inside a private temporary folder (``written.temp_folder``:
``.<name>.tmp-<pid>-<random>@<host>``, made by mkdir with mode 0700, so never a
predictable name nor a planted link) and renamed, so a final name never holds
half a file; at a URL as ``.<name>.tmp-<pid>@<host>`` (an object store has no
links), where a file appears whole when its upload ends.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from comet_dse.base import written
from comet_dse.base.errors import InputError


def is_url(where) -> bool:
    """Whether ``where`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(where, str) and "://" in where


def parquet_options(schema: pa.Schema) -> dict:
    """How comet-dse writes Parquet: zstd, and dictionary encoding only for the columns that are not
    floating point (knob codes, names, flags, counts). Float columns (times, bytes, rates) are nearly all
    distinct, so a dictionary is built and then abandoned; written plain they encode faster and compress
    smaller (benchmarks/bench_parquet.py: 1.4x faster, 26 % smaller on a 28,440-row sweep chunk)."""
    return {"compression": "zstd", "use_dictionary": [f.name for f in schema if not pa.types.is_floating(f.type)]}


def temp_name(name: str) -> str:
    """The temporary name a file is written under before it is moved to ``name``."""
    return f".{name}.tmp-{os.getpid()}@{socket.gethostname()}"


def _filesystem(where: str) -> tuple:
    """(pyarrow file system, root path inside it) of a local path or an fsspec URL."""
    if not is_url(where):
        return pafs.LocalFileSystem(), os.path.abspath(where)
    try:
        import fsspec
    except ImportError:
        raise InputError("output", "a URL output needs fsspec; pip install 'comet-dse[distributed]'") from None
    try:
        fs, root = fsspec.core.url_to_fs(where)
    except (ImportError, ValueError) as exc:
        raise InputError("output", f"cannot open {where}: {exc}") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), root.rstrip("/")


class Folder:
    """A folder of files named by a local path or an fsspec URL; picklable (it travels to workers)."""

    def __init__(self, where):
        self.where = str(where) if is_url(str(where)) else os.path.abspath(where)
        self._fs = None

    def __getstate__(self):
        return {"where": self.where}

    def __setstate__(self, state):
        self.where, self._fs = state["where"], None

    @property
    def fs(self):
        if self._fs is None:
            self._fs, self._root = _filesystem(self.where)
        return self._fs

    @property
    def root(self) -> str:
        self.fs
        return self._root

    def path(self, name: str) -> str:
        """Path of ``name`` inside the folder, as the file system names it."""
        return f"{self.root}/{name}"

    def kind(self, name: str = "") -> str:
        """'file', 'folder' or 'missing' for ``name`` in the folder (the folder itself by default)."""
        info = self.fs.get_file_info(self.path(name) if name else self.root)
        return {pafs.FileType.File: "file", pafs.FileType.Directory: "folder"}.get(info.type, "missing")

    def make(self) -> None:
        self.fs.create_dir(self.root, recursive=True)

    def names(self) -> list:
        """Names of the files directly in the folder, sorted."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)

    def read_bytes(self, name: str) -> bytes:
        with self.fs.open_input_stream(self.path(name)) as handle:
            return handle.read()

    def read_json(self, name: str):
        return json.loads(self.read_bytes(name).decode("utf-8"))

    def open(self, name: str):
        """A seekable binary handle of ``name``."""
        return self.fs.open_input_file(self.path(name))

    def parquet_rows(self, name: str) -> int:
        with self.open(name) as handle:
            return pq.read_metadata(handle).num_rows

    def _atomic(self, name: str, write) -> None:
        if not is_url(self.where):
            self._atomic_local(name, write)
            return
        tmp = self.path(temp_name(name))
        try:
            with self.fs.open_output_stream(tmp) as handle:
                write(handle)
            self.fs.move(tmp, self.path(name))
        except BaseException:
            self.remove(temp_name(name))
            raise

    def _atomic_local(self, name: str, write) -> None:
        """_atomic on a local folder: written in a private temporary folder beside ``name``
        (written.temp_folder: a random name made by mkdir, never reached through a link), then renamed."""
        final = Path(self.path(name))
        try:
            folder = written.temp_folder(final, host=True)
        except OSError as exc:
            raise written.failure("output", "write in", final.parent, exc) from None
        try:
            with self.fs.open_output_stream(str(folder / name)) as handle:
                write(handle)
            os.replace(folder / name, final)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write ``data`` as ``name``: under a temporary name, then moved into place."""
        self._atomic(name, lambda handle: handle.write(data))

    def write_parquet(self, name: str, table: pa.Table) -> None:
        """Write ``table`` (``parquet_options``) as ``name``: under a temporary name, then moved into place."""
        self._atomic(name, lambda handle: pq.write_table(table, handle, **parquet_options(table.schema)))

    def write_with(self, name: str, write) -> None:
        """Write ``name`` by ``write(binary handle)``: under a temporary name, then moved into place."""
        self._atomic(name, write)

    def copy_to(self, name: str, target: "Folder", as_name: str) -> None:
        """Put the file ``name`` into ``target`` as ``as_name``: a hard link where both are local (no bytes
        copied), else a copy on the file system."""
        if not is_url(self.where) and not is_url(target.where):
            try:
                os.link(self.path(name), target.path(as_name))
                return
            except OSError:
                pass
        self.fs.copy_file(self.path(name), target.path(as_name))

    def remove(self, name: str) -> None:
        try:
            self.fs.delete_file(self.path(name))
        except (FileNotFoundError, OSError):
            pass

    def remove_all(self) -> None:
        """Delete the folder and everything in it (nothing if it is not there)."""
        try:
            self.fs.delete_dir(self.root)
        except (FileNotFoundError, OSError):
            pass
