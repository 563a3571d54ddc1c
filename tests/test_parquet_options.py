"""storage.parquet_options: dictionary encoding for knob codes, names and flags, plain floats; values unchanged."""
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from comet_dse.design_space.storage import parquet_options


def _encodings(buffer) -> dict:
    meta = pq.ParquetFile(buffer).metadata.row_group(0)
    return {meta.column(i).path_in_schema: set(meta.column(i).encodings) for i in range(meta.num_columns)}


def test_floats_are_written_plain_and_the_rest_with_a_dictionary():
    table = pa.table({"step_time_s": np.linspace(1.0, 2.0, 1000), "tp": np.tile([1, 2, 4, 8], 250),
                      "feasible": np.arange(1000) % 3 == 0,
                      "model": pa.DictionaryArray.from_arrays(pa.array(np.zeros(1000, dtype=np.int32)),
                                                              pa.array(["gpt3-175b"]))})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **parquet_options(table.schema))
    buffer.seek(0)
    encodings = _encodings(buffer)
    assert not any("DICTIONARY" in e for e in encodings["step_time_s"])
    for name in ("tp", "model"):            # booleans are bit-packed by Parquet whatever is asked
        assert any("DICTIONARY" in e for e in encodings[name]), name
    buffer.seek(0)
    assert pq.read_table(buffer).equals(table)
