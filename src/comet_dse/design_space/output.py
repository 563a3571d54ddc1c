"""Writing result columns to Parquet or CSV, never half-written under the final name.

A file is written inside a private temporary folder beside it (``written.temp_file``, or for a sweep's parts
``storage.Folder``: ``.<name>.tmp-<pid>-<random>[@<host>]``, made by mkdir with mode 0700, never a predictable
name nor a link) and renamed into place when complete; a temporary left by a process of this machine that no
longer runs is removed by the next writer (``remove_stale_temps``). A sweep's output is one
file (``.parquet``, ``.csv``) or, for a name without a suffix, a dataset folder
of Parquet parts marked by ``DATASET_MARKER`` (``write_dataset``). What may be replaced follows
base/written.py: only a file or folder this tool wrote, unchanged since.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path, PurePosixPath

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from comet_dse.base import written
from comet_dse.base.errors import InputError
from comet_dse.design_space.storage import Folder, is_url, parquet_options, temp_name
from comet_dse.strategy.choices import Choice
from comet_dse.strategy.declared import KNOBS

DATASET_MARKER = "_comet-dse.json"      # in a dataset folder this tool wrote; readers skip names starting with _
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


def output_format(path) -> str:
    """'parquet' or 'csv' (one file, by its suffix) or 'dataset' (a name without a suffix: a folder of parts)."""
    suffix = PurePosixPath(str(path).rstrip("/")).suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix == ".csv":
        return "csv"
    if not suffix:
        return "dataset"
    raise InputError("output", f"{path} must end in .parquet or .csv (one file), or have no suffix (a dataset "
                     "folder of Parquet parts)")


def remove_stale_temps(path: Path) -> None:
    """Remove the temporaries of ``path`` left by dead processes (written.remove_stale_temps); a temporary
    folder only if it is a private file folder or a dataset this tool was writing (it holds DATASET_MARKER);
    other folders are left to their owner."""
    written.remove_stale_temps(path, DATASET_MARKER)


def check_output_file(path, inputs=()) -> str:
    """The format of ``path`` (parquet, csv or dataset); an InputError if this tool may not write it
    (base/written.py: only what it wrote itself is replaced, never a link, a device or an input)."""
    fmt = output_format(path)
    if is_url(str(path)):
        return _check_url_output(str(path), fmt)
    if fmt == "dataset":
        if Path(path).exists() and not Path(path).is_dir() and not Path(path).is_symlink():
            raise InputError("output", f"{path} exists and is not a folder; a name without a suffix is a dataset "
                             "folder (give a name ending in .parquet for one file)")
        written.check_folder(path, DATASET_MARKER, "dataset", inputs=inputs)
    else:
        written.check_file(path, inputs=inputs)
    return fmt


def _check_url_output(url: str, fmt: str) -> str:
    """check_output_file for an fsspec URL: the same rules, through the URL's file system."""
    parent, name = output_parent(url)
    try:
        kind = parent.kind(name)
        if fmt == "dataset":
            if kind == "file":
                raise InputError("output", f"{url} exists and is not a folder; a name without a suffix is a dataset")
            if kind == "folder" and Folder(url).names() and DATASET_MARKER not in Folder(url).names():
                raise InputError("output", f"{url} is a folder this tool did not write; choose another name")
        elif kind == "folder":
            raise InputError("output", f"{url} is a folder; give a file name ending in .{fmt}")
        elif kind == "file" and fmt == "parquet":
            with parent.open(name) as handle:
                if "step_time_s" not in pq.read_schema(handle).names:
                    raise InputError("output", f"{url} exists and is not a comet-dse result file; choose another name")
    except (OSError, pa.ArrowException) as exc:
        raise InputError("output", f"cannot read {url}: {exc}") from None
    return fmt


def output_parent(output) -> tuple:
    """(Folder that holds ``output``, its name there), for a local path or a URL."""
    text = str(output).rstrip("/")
    if is_url(text):
        head, _, name = text.rpartition("/")
        return Folder(head), name
    path = Path(text)
    return Folder(path.parent), path.name


def write_dataset(parts: Folder, names: list, output, extra: dict | None = None) -> None:
    """The dataset folder ``output``: the part files ``names`` of ``parts`` (hard links where local), the files
    ``extra`` (name -> bytes; names starting with _, which readers skip) and DATASET_MARKER, assembled under a
    temporary name and moved into place (an earlier dataset of this tool is replaced). Readers (pyarrow,
    pandas, DuckDB, polars, Dask) take the folder as one table."""
    parent, name = output_parent(output)
    extra = extra or {}
    if not is_url(str(output)):
        _write_local_dataset(parts, names, Path(parent.root) / name, extra)
        return
    tmp = Folder(parent.path(temp_name(name)))
    tmp.make()
    for part in names:
        parts.copy_to(part, tmp, part)
    for extra_name, data in extra.items():
        tmp.write_bytes(extra_name, data)
    tmp.write_bytes(DATASET_MARKER, json.dumps({"format": "comet-dse dataset", "parts": len(names)}).encode())
    fs = parent.fs
    if parent.kind(name) == "folder":
        old = parent.path(f".{name}.tmp-old-{os.getpid()}@{socket.gethostname()}")     # a stale_temps name
        fs.move(parent.path(name), old)
        fs.move(tmp.root, parent.path(name))
        Folder(old).remove_all()
    else:
        fs.move(tmp.root, parent.path(name))


def _write_local_dataset(parts: Folder, names: list, path: Path, extra: dict) -> None:
    """write_dataset on a local path: the parts are linked into a private temporary folder
    (written.temp_folder: a name nobody can predict, never reached through a link), sealed with a manifest of
    every part (the folder is replaced later only while it holds just these, unchanged) and moved into
    place, the output rule checked again just before the move."""
    tmp = written.temp_folder(path, host=True)
    try:
        target = Folder(tmp)
        for part in names:
            parts.copy_to(part, target, part)
        for extra_name, data in extra.items():
            (tmp / extra_name).write_bytes(data)
        written.seal(tmp, DATASET_MARKER, "dataset", format="comet-dse dataset", parts=len(names))
        written.replace_folder(tmp, path, lambda: written.check_folder(path, DATASET_MARKER, "dataset"))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_atomically(table: pa.Table, path: Path, inputs=()) -> None:
    """Write ``table`` to ``path`` (.parquet or .csv), complete or not at all (written.write_file)."""
    fmt = check_output_file(path, inputs)
    if fmt == "dataset":
        raise InputError("output", f"{path} must end in .parquet or .csv")

    def write(tmp: Path) -> None:
        if fmt == "parquet":
            pq.write_table(table, tmp, **parquet_options(table.schema))
        else:
            pacsv.write_csv(_plain(table), tmp)

    written.write_file(path, write, inputs=inputs)


def _plain(table: pa.Table) -> pa.Table:
    """``table`` as a CSV file holds it (``csv_table``)."""
    return csv_table(table)


# A text cell a spreadsheet would read as a formula (OWASP, "CSV Injection"): it starts with = + - @, a tab or
# a carriage return. Such a cell is written with a ' in front, which spreadsheets take as "text, not a formula"
# and do not show; numbers are number columns and are never touched (-1.5 stays a number).
FORMULA_START = r"^([=+\-@\t\r])"


def csv_table(table: pa.Table) -> pa.Table:
    """``table`` as a CSV file holds it: dictionary columns decoded to strings (CSV has none), and every text
    cell that starts like a formula (FORMULA_START: a model named '=HYPERLINK(...)' was written as is into
    every row) prefixed with a '."""
    import pyarrow.compute as pc

    cols = []
    for column in table.columns:
        if pa.types.is_dictionary(column.type):
            column = column.cast(pa.string())
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            column = pc.replace_substring_regex(column, pattern=FORMULA_START, replacement="'\\1")
        cols.append(column)
    return pa.Table.from_arrays(cols, names=table.column_names)
