"""Writing result columns to Parquet or CSV, never half-written under the final name.

A file is written to a temporary name beside it (``temp_path``: ``.<name>.tmp-<pid>``)
and renamed into place when complete; a temporary left by a process that no
longer runs is removed by the next writer (``remove_stale_temps``).
"""
from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from comet_dse.errors import InputError
from comet_dse.strategy import KNOBS, Choice

# Choice knobs: their code columns are written as dictionary-encoded names.
CODED = {k.name: [m.value for m in k.kind] for k in KNOBS if issubclass(k.kind, Choice)}


def to_arrow(columns: dict) -> pa.Table:
    """Columns -> Arrow table; coded columns become dictionary-encoded strings."""
    arrays, names = [], []
    for name, values in columns.items():
        if name in CODED:
            arrays.append(pa.DictionaryArray.from_arrays(pa.array(np.asarray(values, dtype=np.int32)),
                                                         pa.array(CODED[name])))
        else:
            arrays.append(pa.array(np.ascontiguousarray(values)))
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def output_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix == ".csv":
        return "csv"
    raise InputError("output", f"{path} must end in .parquet or .csv")


def temp_path(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: ``.<name>.tmp-<pid>`` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (a process of another user counts)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return pid < 2**31
    return True


def stale_temps(path: Path) -> list:
    """The temporaries of ``path`` (``temp_path`` names) whose process no longer runs."""
    path = Path(path)
    found = []
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[1]
        if pid.isdigit() and not process_alive(int(pid)) and not tmp.is_symlink():
            found.append(tmp)
    return found


def remove_stale_temps(path: Path) -> None:
    """Remove the temporary files of ``path`` left by dead processes (folders are left to their owner)."""
    for tmp in stale_temps(path):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)


def check_output_file(path: Path) -> str:
    """The format of ``path`` (parquet or csv); an InputError if it is a folder or not a result file."""
    path = Path(path)
    fmt = output_format(path)
    if path.is_dir():
        raise InputError("output", f"{path} is a folder; give a file name ending in .{fmt}")
    if path.exists() and not path.is_file():
        raise InputError("output", f"{path} exists and is not a regular file")
    if path.is_file() and path.stat().st_size and not _is_result(path, fmt):
        raise InputError("output", f"{path} exists and is not a comet-dse result file; choose another name "
                         "or move it away")
    return fmt


def _is_result(path: Path, fmt: str) -> bool:
    """Whether ``path`` holds rows comet-dse wrote (a step_time_s column): only such a file is replaced."""
    try:
        if fmt == "parquet":
            return "step_time_s" in pq.read_schema(path).names
        with open(path, encoding="utf-8", errors="replace") as handle:
            return '"step_time_s"' in handle.readline(1 << 16)
    except (OSError, pa.ArrowException):
        return False


def write_atomically(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` (.parquet or .csv) via a temporary file and a rename."""
    path = Path(path)
    fmt = check_output_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError("output", f"cannot create {path.parent}: {exc.strerror}") from None
    remove_stale_temps(path)
    tmp = temp_path(path)
    try:
        if fmt == "parquet":
            pq.write_table(table, tmp, compression="zstd")
        else:
            pacsv.write_csv(_plain(table), tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise InputError("output", f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def _plain(table: pa.Table) -> pa.Table:
    """CSV cannot hold dictionary columns: decode them to strings."""
    cols = [c.cast(pa.string()) if pa.types.is_dictionary(c.type) else c for c in table.columns]
    return pa.Table.from_arrays(cols, names=table.column_names)
