"""Property test of design_space/parquet_concat.py: Parquet parts joined byte for byte read back, in pyarrow,
DuckDB and Polars, as exactly the concatenation of the parts.

Hypothesis draws part files in the shapes the sweep engine writes (``storage.parquet_options``: zstd, float64
columns plain, integer, string and knob-code columns dictionary-encoded, bool columns; see
``output.to_arrow`` and ``engine.run_chunk``): empty parts, one-row parts, parts of many small row groups,
parts whose dictionary outgrows its page and falls back to plain pages, all mixed in one join. The expected
table is the pyarrow concatenation of the parts as pyarrow reads them.
"""
from __future__ import annotations

import inspect
import io
import math
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from comet_dse.design_space.parquet_concat import ParquetJoinError, _read_struct, _write_struct, join, read_footer
from comet_dse.design_space.storage import parquet_options

duckdb = pytest.importorskip("duckdb")
pl = pytest.importorskip("polars")

KINDS = ("code", "int", "string", "float", "bool")
BLOOM_WRITABLE = "bloom_filter_options" in inspect.signature(pq.ParquetWriter.__init__).parameters
ARROW_TYPES = {"int": pa.int64(), "string": pa.string(), "float": pa.float64(), "bool": pa.bool_()}
ELEMENTS = {
    "int": st.integers(-2**63, 2**63 - 1),
    "string": st.text(max_size=10),
    "float": st.floats(allow_nan=True, allow_infinity=True),
    "bool": st.booleans(),
}


# --- building part files --------------------------------------------------------------------------------------

def column_name(kind: str, index: int) -> str:
    """A column name of the engine's style (``axis_network.infiniband.link_bandwidth`` has dots)."""
    return f"axis_{index}.{kind}"


def arrow_column(kind: str, values: list, dictionary: list | None) -> pa.Array:
    """One column as the engine builds it: knob codes as int32 indices into ``dictionary``, the rest plain."""
    if kind == "code":
        return pa.DictionaryArray.from_arrays(pa.array(values, pa.int32()), pa.array(dictionary, pa.string()))
    return pa.array(values, ARROW_TYPES[kind])


def part_table(columns: list, part: dict) -> pa.Table:
    """The Arrow table of one part: ``columns`` is [(kind, dictionary or None)], ``part["values"]`` a list a
    column."""
    arrays = [arrow_column(kind, values, dictionary) for (kind, dictionary), values in zip(columns, part["values"])]
    names = [column_name(kind, i) for i, (kind, _) in enumerate(columns)]
    return pa.Table.from_arrays(arrays, names=names)


def write_part(table: pa.Table, path: Path, part: dict) -> None:
    """Write a part with the engine's writer settings, in row groups of ``row_group_size`` rows (all in one when
    None); when ``small_dictionary``, with a dictionary page limit so small that encoding falls back to plain.
    Not the engine's defaults, to cover the rest of the offsets: ``page_index`` writes a page index, ``bloom``
    bloom filters on the columns that are not bool (where pyarrow can)."""
    options = parquet_options(table.schema)
    if part["small_dictionary"]:
        options["dictionary_pagesize_limit"] = 16
    if part["bloom"] and BLOOM_WRITABLE:
        ndv = max(table.num_rows, 1)
        options["bloom_filter_options"] = {f.name: {"ndv": ndv} for f in table.schema if f.type != pa.bool_()}
    pq.write_table(table, path, row_group_size=part["row_group_size"], write_page_index=part["page_index"],
                   **options)


@st.composite
def columns_of(draw) -> list:
    """[(kind, dictionary)]: one to six columns; a knob-code column gets its dictionary (the same in every part,
    as the engine's CODED names and model names are)."""
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
    codes = st.lists(st.text(max_size=6), min_size=1, max_size=4, unique=True)
    return [(kind, draw(codes) if kind == "code" else None) for kind in kinds]


@st.composite
def part_of(draw, columns: list) -> dict:
    """One part: its row count (zero and one drawn often), row group size and values of every column."""
    rows = draw(st.one_of(st.just(0), st.just(1), st.integers(0, 25)))
    values = []
    for kind, dictionary in columns:
        element = st.integers(0, len(dictionary) - 1) if kind == "code" else ELEMENTS[kind]
        values.append(draw(st.lists(element, min_size=rows, max_size=rows)))
    return {"values": values, "row_group_size": draw(st.one_of(st.none(), st.integers(1, 6))),
            "small_dictionary": draw(st.booleans()), "page_index": draw(st.booleans()), "bloom": draw(st.booleans())}


@st.composite
def joins(draw) -> tuple:
    """(columns, parts): one to five parts of one schema, to be joined in order."""
    columns = draw(columns_of())
    return columns, draw(st.lists(part_of(columns), min_size=1, max_size=5))


def literal_part(values: list, row_group_size=None, small_dictionary=False, page_index=False, bloom=False) -> dict:
    """A part for an ``@example``."""
    return {"values": values, "row_group_size": row_group_size, "small_dictionary": small_dictionary,
            "page_index": page_index, "bloom": bloom}


# --- reading back -------------------------------------------------------------------------------------------------

def same_value(value) -> tuple:
    """A key that equates what a reader must give back unchanged: NaN equals NaN, -0.0 differs from 0.0."""
    if isinstance(value, float):
        return ("nan",) if math.isnan(value) else ("float", value, math.copysign(1.0, value))
    return (type(value).__name__, value)


def keys(columns: dict) -> dict:
    """{name: [same_value of each value]} of columns given as {name: values}."""
    return {name: [same_value(v) for v in values] for name, values in columns.items()}


def duckdb_type(arrow_type: pa.DataType) -> str:
    """The DuckDB type a Parquet column of ``arrow_type`` reads as (dictionary strings: VARCHAR)."""
    if pa.types.is_dictionary(arrow_type):
        return "VARCHAR"
    return {pa.int64(): "BIGINT", pa.string(): "VARCHAR", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN"}[arrow_type]


def polars_type(arrow_type: pa.DataType):
    """The Polars type a Parquet column of ``arrow_type`` reads as (dictionary strings: Categorical)."""
    if pa.types.is_dictionary(arrow_type):
        return pl.Categorical
    return {pa.int64(): pl.Int64, pa.string(): pl.String, pa.float64(): pl.Float64, pa.bool_(): pl.Boolean}[arrow_type]


def read_pyarrow(path: Path) -> tuple:
    """(column names, Arrow types, {name: values}) as pyarrow reads the file."""
    table = pq.read_table(path)
    return table.column_names, table.schema.types, {n: table.column(n).to_pylist() for n in table.column_names}


def read_duckdb(path: Path) -> tuple:
    """(column names, DuckDB type names, {name: values}) as DuckDB reads the file, in the file's row order."""
    with duckdb.connect() as con:
        described = con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [str(path)]).fetchall()
        rows = con.execute("SELECT * EXCLUDE (file_row_number) FROM read_parquet(?, file_row_number = true) "
                           "ORDER BY file_row_number", [str(path)]).fetchall()
    names = [d[0] for d in described]
    return names, [d[1] for d in described], {name: [row[i] for row in rows] for i, name in enumerate(names)}


def read_polars(path: Path) -> tuple:
    """(column names, Polars types, {name: values}) as Polars reads the file."""
    frame = pl.read_parquet(path)
    return frame.columns, frame.dtypes, {name: frame.get_column(name).to_list() for name in frame.columns}


def bloom_probes(path: Path) -> list:
    """[(column, value, row groups that hold it)]: the first value of each part's first row group in each column
    that has a bloom filter there and is not float or bool (a bloom filter is probed for equality)."""
    file, probes, seen = pq.ParquetFile(path), [], set()
    meta = file.metadata
    for k in range(meta.num_row_groups):
        for c, arrow_field in enumerate(file.schema_arrow):
            if meta.row_group(k).num_rows == 0 or meta.row_group(k).column(c).bloom_filter_offset is None or \
                    pa.types.is_floating(arrow_field.type) or arrow_field.type == pa.bool_():
                continue
            value = file.read_row_group(k, columns=[arrow_field.name]).column(0)[0].as_py()
            if (arrow_field.name, value) not in seen:
                seen.add((arrow_field.name, value))
                holders = [j for j in range(meta.num_row_groups)
                           if value in file.read_row_group(j, columns=[arrow_field.name]).column(0).to_pylist()]
                probes.append((arrow_field.name, value, holders))
    return probes


def check_bloom_probes(path: Path) -> None:
    """DuckDB, probing the joined file's bloom filters, never rules a row group out for a value it holds."""
    with duckdb.connect() as con:
        for name, value, holders in bloom_probes(path):
            excluded = dict(con.execute("SELECT row_group_id, bloom_filter_excludes FROM parquet_bloom_probe(?, ?, ?)",
                                        [str(path), name, value]).fetchall())
            assert [excluded[j] for j in holders] == [False] * len(holders), (name, value)


# Each reader, and the type it must give a column of an Arrow type.
READERS = {"pyarrow": (read_pyarrow, lambda t: t), "duckdb": (read_duckdb, duckdb_type),
           "polars": (read_polars, polars_type)}


# --- where the bytes are -----------------------------------------------------------------------------------------
# Field ids from the Parquet format's parquet.thrift, written out here rather than taken from the module under test.
FILE_ROW_GROUPS, GROUP_COLUMNS, GROUP_FILE_OFFSET = 4, 1, 5
CHUNK_OFFSET_INDEX, CHUNK_OFFSET_INDEX_LENGTH, CHUNK_COLUMN_INDEX, CHUNK_COLUMN_INDEX_LENGTH = 4, 5, 6, 7
INDEX_PAGES, PAGE_OFFSET, PAGE_SIZE = 1, 1, 2
REPORTED_OFFSETS = ("file_offset", "data_page_offset", "dictionary_page_offset", "bloom_filter_offset")


def footer_start(data: bytes) -> int:
    """Where a Parquet file's footer starts, from its last eight bytes (the footer's length, then PAR1)."""
    return len(data) - 8 - int.from_bytes(data[-8:-4], "little")


def field(fields: list, number: int):
    """The value of field ``number`` of a decoded Thrift struct, or None."""
    return next((value for n, _, value in fields if n == number), None)


def row_groups(data: bytes) -> list:
    """The decoded RowGroup structs of a Parquet file."""
    return field(read_footer(io.BytesIO(data))[0], FILE_ROW_GROUPS)[1]


def page_locations(data: bytes, chunk: list) -> list:
    """[(offset, size)] of the pages a ColumnChunk's OffsetIndex lists; [] without a page index."""
    where, length = field(chunk, CHUNK_OFFSET_INDEX), field(chunk, CHUNK_OFFSET_INDEX_LENGTH)
    if not where:
        return []
    index, end = _read_struct(data[where:where + length], 0)
    assert end == length
    return [(field(page, PAGE_OFFSET), field(page, PAGE_SIZE)) for page in field(index, INDEX_PAGES)[1]]


def column_index(data: bytes, chunk: list) -> bytes:
    """The bytes of a ColumnChunk's ColumnIndex (page statistics); b"" without a page index."""
    where, length = field(chunk, CHUNK_COLUMN_INDEX), field(chunk, CHUNK_COLUMN_INDEX_LENGTH)
    return data[where:where + length] if where else b""


def bloom_filter(data: bytes, column) -> bytes:
    """The bytes of a column chunk's bloom filter (pyarrow's ColumnChunkMetaData); b"" without one."""
    where, length = column.bloom_filter_offset, column.bloom_filter_length
    return data[where:where + length] if where else b""


def moved(offset, by: int):
    """An offset of a part as the joined file must hold it: ``by`` further on; unset (None, 0) stays unset."""
    return offset + by if offset else offset


def check_offsets(parts: list, joined: bytes) -> None:
    """Each part's bytes (4 .. its footer) sit unchanged in ``joined``, one part after another; every offset
    pyarrow reports, each RowGroup.file_offset and each page an OffsetIndex lists is the part's, moved by where
    the part's bytes now start (the page's bytes are the same); each ColumnIndex and bloom filter is found with
    the part's bytes."""
    meta, groups = pq.read_metadata(io.BytesIO(joined)), row_groups(joined)
    at, k = 4, 0
    for data in parts:
        end, by = footer_start(data), at - 4
        assert joined[at:at + end - 4] == data[4:end]
        part_meta = pq.read_metadata(io.BytesIO(data))
        for g, part_group in enumerate(row_groups(data)):
            assert field(groups[k], GROUP_FILE_OFFSET) == moved(field(part_group, GROUP_FILE_OFFSET), by)
            chunks, part_chunks = field(groups[k], GROUP_COLUMNS)[1], field(part_group, GROUP_COLUMNS)[1]
            for c, (chunk, part_chunk) in enumerate(zip(chunks, part_chunks)):
                got, want = meta.row_group(k).column(c), part_meta.row_group(g).column(c)
                assert [getattr(got, a) for a in REPORTED_OFFSETS] == \
                    [moved(getattr(want, a), by) for a in REPORTED_OFFSETS]
                pages, part_pages = page_locations(joined, chunk), page_locations(data, part_chunk)
                assert pages == [(moved(offset, by), size) for offset, size in part_pages]
                assert [joined[o:o + n] for o, n in pages] == [data[o:o + n] for o, n in part_pages]
                assert column_index(joined, chunk) == column_index(data, part_chunk)
                assert bloom_filter(joined, got) == bloom_filter(data, want)
            k += 1
        at += end - 4
    assert k == meta.num_row_groups == len(groups)


def check_join(tmp: Path, columns: list, parts: list) -> None:
    """Write ``parts``, join them with parquet_concat.join, and check where the bytes went and that pyarrow,
    DuckDB and Polars read the joined file as the pyarrow concatenation of the parts."""
    paths = []
    for i, part in enumerate(parts):
        paths.append(tmp / f"part-{i:06d}.parquet")
        write_part(part_table(columns, part), paths[-1], part)
    joined = tmp / "joined.parquet"
    with open(joined, "wb") as target:
        rows = join([lambda p=p: open(p, "rb") for p in paths], target)
    expected = pa.concat_tables([pq.read_table(p) for p in paths])
    assert rows == expected.num_rows == pq.read_metadata(joined).num_rows
    assert pq.read_schema(joined).equals(expected.schema, check_metadata=True)
    check_offsets([p.read_bytes() for p in paths], joined.read_bytes())
    want = keys({name: expected.column(name).to_pylist() for name in expected.column_names})
    for reader, (read, type_of) in READERS.items():
        names, types, values = read(joined)
        assert names == expected.column_names, reader
        assert list(types) == [type_of(t) for t in expected.schema.types], reader
        assert keys(values) == want, reader
    check_bloom_probes(joined)


# --- the property -------------------------------------------------------------------------------------------------

MIXED_COLUMNS = [("code", ["none", "selective", "full"]), ("int", None), ("string", None), ("float", None),
                 ("bool", None)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(joins())
@example(([("float", None)], [literal_part([[]])]))                                  # one empty part
@example((MIXED_COLUMNS, [                                                           # all shapes in one join
    literal_part([[], [], [], [], []]),
    literal_part([[2], [7], ["x"], [float("nan")], [True]]),
    literal_part([[0, 1, 2, 1, 0, 2, 2], list(range(7)), list("abcabca"), [0.5, -0.0, 1e300, float("inf"), 2.0, 3.0,
                                                                           -1.0], [True, False] * 3 + [True]],
                 row_group_size=2, small_dictionary=True, bloom=True),
    literal_part([[], [], [], [], []], row_group_size=1),
    literal_part([[1], [2**63 - 1], [""], [-0.0], [False]], row_group_size=1),
]))
@example((MIXED_COLUMNS[1:], [                  # regression: the second part's OffsetIndex pointed into the first
    literal_part([[1, 2, 3], ["a", "b", "c"], [1.0, 2.0, 3.0], [True, True, False]], page_index=True),
    literal_part([[4, 5], ["d", "e"], [4.0, 5.0], [False, True]], row_group_size=1, page_index=True),
]))
def test_joined_parts_read_back_as_their_concatenation(case):
    columns, parts = case
    with tempfile.TemporaryDirectory() as tmp:
        check_join(Path(tmp), columns, parts)


# --- what cannot be joined byte for byte --------------------------------------------------------------------------

THRIFT_BINARY, THRIFT_STRUCT = 8, 12


def with_footer_change(data: bytes, change) -> bytes:
    """``data`` (a Parquet file) with its footer decoded, changed in place by ``change(fields)`` and re-encoded."""
    fields, start = read_footer(io.BytesIO(data))
    change(fields)
    footer = bytearray()
    _write_struct(footer, fields)
    return data[:start] + bytes(footer) + len(footer).to_bytes(4, "little") + b"PAR1"


def first_chunk(fields: list) -> list:
    """The first ColumnChunk of a decoded FileMetaData."""
    return field(field(fields, FILE_ROW_GROUPS)[1][0], GROUP_COLUMNS)[1][0]


UNJOINABLE = {
    "encrypted file": lambda f: f.append([8, THRIFT_STRUCT, [[1, THRIFT_STRUCT, []]]]),   # encryption_algorithm
    "encrypted column": lambda f: first_chunk(f).append([9, THRIFT_BINARY, b"sealed"]),   # encrypted_column_metadata
    "chunk in another file": lambda f: first_chunk(f).insert(0, [1, THRIFT_BINARY, b"other.parquet"]),   # file_path
}


@pytest.mark.parametrize("change", UNJOINABLE.values(), ids=UNJOINABLE.keys())
def test_a_part_that_cannot_be_joined_is_refused_before_a_byte_is_written(change):
    table = pa.table({"step_time_s": pa.array([0.5, 1.5]), "tp": pa.array([2, 4], pa.int64())})
    sink = io.BytesIO()
    pq.write_table(table, sink, **parquet_options(table.schema))
    good = sink.getvalue()
    bad = with_footer_change(good, change)
    assert bad != good
    target = io.BytesIO()
    with pytest.raises(ParquetJoinError):
        join([lambda: io.BytesIO(good), lambda: io.BytesIO(bad)], target)
    assert target.getvalue() == b""


def test_parts_of_differing_schemas_are_re_encoded_into_the_first_ones(tmp_path):
    """engine._join_parts falls back to re-encoding when join refuses; it used to seek an output stream that
    cannot seek (an OSError reported as 'cannot write')."""
    import pyarrow.fs as pafs

    from comet_dse.design_space.engine import PartStore, _join_parts
    from comet_dse.design_space.storage import Folder

    folder = Folder(tmp_path / "parts")
    folder.make()
    folder.write_parquet(PartStore.name(0), pa.table({"x": pa.array([1, 2], pa.int64()), "y": [0.5, 1.5]}))
    folder.write_parquet(PartStore.name(1), pa.table({"x": pa.array([3], pa.int32()), "y": [2.5]}))
    out = tmp_path / "joined.parquet"
    with pafs.LocalFileSystem().open_output_stream(str(out)) as handle:
        _join_parts(folder, 2, handle)
    table = pq.read_table(out)
    assert table.column("x").to_pylist() == [1, 2, 3] and table.schema.field("x").type == pa.int64()
