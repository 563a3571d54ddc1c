"""Writing result columns to Parquet or CSV, never half-written under the final name."""
from __future__ import annotations

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


def write_atomically(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` (.parquet or .csv) via a temporary file and a rename."""
    path = Path(path)
    fmt = output_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if fmt == "parquet":
            pq.write_table(table, tmp, compression="zstd")
        else:
            pacsv.write_csv(_plain(table), tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _plain(table: pa.Table) -> pa.Table:
    """CSV cannot hold dictionary columns: decode them to strings."""
    cols = [c.cast(pa.string()) if pa.types.is_dictionary(c.type) else c for c in table.columns]
    return pa.Table.from_arrays(cols, names=table.column_names)
