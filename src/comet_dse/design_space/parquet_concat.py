"""Joining Parquet files of one schema into one file without decoding or re-encoding a value.

A Parquet file is ``PAR1``, the column chunks of its row groups, a footer
(Thrift compact-protocol ``FileMetaData``), the footer's length and ``PAR1``.
Joining files copies each file's column-chunk bytes one after another and
writes one footer that lists every row group, with each byte offset shifted
by where its bytes now start. Values, pages, statistics and compression are
untouched, so the result reads as the concatenation of the inputs (each input
row group stays a row group). Only the footer is decoded, by a small generic
Thrift compact-protocol reader and writer (``_read_struct``, ``_write_struct``).

One structure outside the footer holds absolute byte offsets: a page index's
OffsetIndex (where each data page starts). A part's copied OffsetIndex would
point into the first part, so each one is decoded, its page offsets are
shifted, and it is written again after all the copied bytes, where the footer
now points (the old copy stays behind as unused bytes). A ColumnIndex (page
statistics) and a bloom filter hold no offsets: they move with their bytes.

Source: the Parquet format specification (parquet-format, ``parquet.thrift``:
FileMetaData, RowGroup, ColumnChunk, ColumnMetaData) and the Thrift compact
protocol specification.
"""
from __future__ import annotations

import struct

MAGIC = b"PAR1"
COPY_BYTES = 1 << 22

# Thrift compact-protocol type codes.
TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)

# Field ids in parquet.thrift that this module reads or rewrites.
FILE_SCHEMA, FILE_NUM_ROWS, FILE_ROW_GROUPS, FILE_KEY_VALUE, FILE_ENCRYPTION = 2, 3, 4, 5, 8
GROUP_COLUMNS, GROUP_FILE_OFFSET, GROUP_ORDINAL = 1, 5, 7
CHUNK_FILE_PATH, CHUNK_META, CHUNK_ENCRYPTED_META = 1, 3, 9
CHUNK_OFFSET_INDEX, CHUNK_OFFSET_INDEX_LENGTH = 4, 5
CHUNK_OFFSETS = (2, 6)            # file_offset, column_index_offset (the offset index is rewritten)
META_OFFSETS = (9, 10, 11, 14)    # data_page, index_page, dictionary_page, bloom_filter offsets
INDEX_PAGES, PAGE_OFFSET = 1, 1   # OffsetIndex.page_locations, PageLocation.offset


class ParquetJoinError(ValueError):
    """The inputs cannot be joined byte for byte (not Parquet, encrypted, or of different schemas)."""


# --- Thrift compact protocol: a generic reader and writer ---------------------------------------------

def _varint(buf: bytes, pos: int) -> tuple:
    shift = value = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _read_value(buf: bytes, pos: int, kind: int) -> tuple:
    """One value of compact type ``kind`` at ``pos``: (value, next position)."""
    if kind in (TRUE, FALSE):             # a bool inside a list: one byte
        return buf[pos] == TRUE, pos + 1
    if kind == BYTE:
        return struct.unpack_from("<b", buf, pos)[0], pos + 1
    if kind in (I16, I32, I64):
        raw, pos = _varint(buf, pos)
        return _zigzag(raw), pos
    if kind == DOUBLE:
        return struct.unpack_from("<d", buf, pos)[0], pos + 8
    if kind == BINARY:
        size, pos = _varint(buf, pos)
        return bytes(buf[pos:pos + size]), pos + size
    if kind in (LIST, SET):
        header = buf[pos]
        pos += 1
        size, item = header >> 4, header & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        items = []
        for _ in range(size):
            value, pos = _read_value(buf, pos, item)
            items.append(value)
        return (item, items), pos
    if kind == MAP:
        size, pos = _varint(buf, pos)
        if size == 0:
            return (0, 0, []), pos
        types = buf[pos]
        pos += 1
        pairs = []
        for _ in range(size):
            key, pos = _read_value(buf, pos, types >> 4)
            value, pos = _read_value(buf, pos, types & 0x0F)
            pairs.append((key, value))
        return (types >> 4, types & 0x0F, pairs), pos
    if kind == STRUCT:
        return _read_struct(buf, pos)
    raise ParquetJoinError(f"unknown Thrift type {kind} in a Parquet footer")


def _read_struct(buf: bytes, pos: int) -> tuple:
    """A struct as a list of [field id, type, value] in file order: (fields, next position)."""
    fields, last = [], 0
    while True:
        header = buf[pos]
        pos += 1
        if header == 0:
            return fields, pos
        delta, kind = header >> 4, header & 0x0F
        if delta:
            field = last + delta
        else:
            raw, pos = _varint(buf, pos)
            field = _zigzag(raw)
        if kind in (TRUE, FALSE):
            value = kind == TRUE
        else:
            value, pos = _read_value(buf, pos, kind)
        fields.append([field, kind, value])
        last = field


def _put_varint(out: bytearray, n: int) -> None:
    while True:
        if n < 0x80:
            out.append(n)
            return
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _put_int(out: bytearray, n: int) -> None:
    _put_varint(out, (n << 1) ^ (n >> 63))


def _write_value(out: bytearray, kind: int, value) -> None:
    if kind in (TRUE, FALSE):
        out.append(TRUE if value else FALSE)
    elif kind == BYTE:
        out += struct.pack("<b", value)
    elif kind in (I16, I32, I64):
        _put_int(out, value)
    elif kind == DOUBLE:
        out += struct.pack("<d", value)
    elif kind == BINARY:
        _put_varint(out, len(value))
        out += value
    elif kind in (LIST, SET):
        item, items = value
        if len(items) < 15:
            out.append(len(items) << 4 | item)
        else:
            out.append(0xF0 | item)
            _put_varint(out, len(items))
        for x in items:
            _write_value(out, item, x)
    elif kind == MAP:
        key_kind, value_kind, pairs = value
        _put_varint(out, len(pairs))
        if pairs:
            out.append(key_kind << 4 | value_kind)
        for k, v in pairs:
            _write_value(out, key_kind, k)
            _write_value(out, value_kind, v)
    else:
        _write_struct(out, value)


def _write_struct(out: bytearray, fields: list) -> None:
    last = 0
    for field, kind, value in fields:
        if kind in (TRUE, FALSE):
            kind = TRUE if value else FALSE
        delta = field - last
        if 0 < delta <= 15:
            out.append(delta << 4 | kind)
        else:
            out.append(kind)
            _put_int(out, field)
        if kind not in (TRUE, FALSE):
            _write_value(out, kind, value)
        last = field
    out.append(0)


# --- footers -------------------------------------------------------------------------------------------

def _get(fields: list, field: int):
    for f in fields:
        if f[0] == field:
            return f
    return None


def read_footer(handle) -> tuple:
    """(FileMetaData fields, data size) of an open Parquet file; data = bytes 4 .. footer start."""
    handle.seek(0, 2)
    size = handle.tell()
    if size < 12:
        raise ParquetJoinError("not a Parquet file (too short)")
    handle.seek(size - 8)
    tail = handle.read(8)
    if tail[4:] != MAGIC:
        raise ParquetJoinError("not a Parquet file, or an encrypted one")
    length = struct.unpack("<I", tail[:4])[0]
    start = size - 8 - length
    if start < 4:
        raise ParquetJoinError("damaged Parquet footer")
    handle.seek(start)
    fields, end = _read_struct(handle.read(length), 0)
    return fields, start


def _chunks(fields: list):
    """Every ColumnChunk of a FileMetaData, row group by row group."""
    for group in _get(fields, FILE_ROW_GROUPS)[2][1]:
        yield from _get(group, GROUP_COLUMNS)[2][1]


def _check_joinable(fields: list) -> None:
    """A ParquetJoinError unless every byte offset of the file is in its footer or an OffsetIndex: no column
    chunk in another file, no encryption (encrypted column metadata hides its offsets)."""
    if _get(fields, FILE_ENCRYPTION) is not None:
        raise ParquetJoinError("an encrypted Parquet file cannot be joined byte for byte")
    for chunk in _chunks(fields):
        if _get(chunk, CHUNK_FILE_PATH) is not None:
            raise ParquetJoinError("a column chunk lives in another file")
        if _get(chunk, CHUNK_ENCRYPTED_META) is not None:
            raise ParquetJoinError("an encrypted Parquet column cannot be joined byte for byte")


def read_offset_indexes(handle, fields: list) -> list:
    """[(ColumnChunk fields, its decoded OffsetIndex)] for every column chunk of the open file ``handle`` (of
    footer ``fields``) that has a page index."""
    found = []
    for chunk in _chunks(fields):
        where, length = _get(chunk, CHUNK_OFFSET_INDEX), _get(chunk, CHUNK_OFFSET_INDEX_LENGTH)
        if where is None or not where[2]:
            continue
        if length is None:
            raise ParquetJoinError("a Parquet offset index without its length")
        handle.seek(where[2])
        raw = handle.read(length[2])
        try:
            index, _ = _read_struct(raw, 0)
            pages = _get(index, INDEX_PAGES)[2][1]
        except (IndexError, TypeError, struct.error):
            raise ParquetJoinError("damaged Parquet offset index") from None
        if any(_get(page, PAGE_OFFSET) is None for page in pages):
            raise ParquetJoinError("damaged Parquet offset index")
        found.append((chunk, index))
    return found


def _shift(group: list, by: int, ordinal: int) -> None:
    """Move a RowGroup's byte offsets (in the footer) by ``by`` and give it position ``ordinal`` in the joined
    file; its OffsetIndexes are moved by ``_shift_pages``."""
    for f in group:
        if f[0] == GROUP_FILE_OFFSET and f[2]:          # an offset of 0 is unset: data starts at byte 4
            f[2] += by
        elif f[0] == GROUP_ORDINAL:
            f[2] = ordinal
    for chunk in _get(group, GROUP_COLUMNS)[2][1]:
        for f in chunk:
            if f[0] in CHUNK_OFFSETS and f[2]:
                f[2] += by
        meta = _get(chunk, CHUNK_META)
        for f in meta[2] if meta else ():
            if f[0] in META_OFFSETS and f[2]:
                f[2] += by


def _shift_pages(index: list, by: int) -> None:
    """Move every page location of a decoded OffsetIndex by ``by``."""
    for page in _get(index, INDEX_PAGES)[2][1]:
        _get(page, PAGE_OFFSET)[2] += by


def _place_offset_indexes(indexes: list, position: int) -> bytes:
    """The OffsetIndexes ``indexes`` ([(ColumnChunk, OffsetIndex)]) encoded one after another, to be written at
    byte ``position``; each ColumnChunk is pointed at its index there."""
    out = bytearray()
    for chunk, index in indexes:
        start = len(out)
        _write_struct(out, index)
        _get(chunk, CHUNK_OFFSET_INDEX)[2] = position + start
        _get(chunk, CHUNK_OFFSET_INDEX_LENGTH)[2] = len(out) - start
    return bytes(out)


def _copy_data(open_file, data_end: int, target) -> None:
    """Copy bytes 4 .. ``data_end`` (every row group, page index and bloom filter) of a part to ``target``."""
    with open_file() as handle:
        handle.seek(len(MAGIC))
        left = data_end - len(MAGIC)
        while left:
            block = handle.read(min(COPY_BYTES, left))
            if not block:
                raise OSError("a Parquet part ended early while it was joined")
            target.write(block)
            left -= len(block)


def join(openers: list, target) -> int:
    """Write the Parquet files that ``openers`` open (callables returning binary handles, same schema) as
    one file to ``target`` (a writable binary handle); returns the number of rows.

    Every footer (and offset index) is read before a byte is written: a ParquetJoinError (not Parquet,
    encrypted, other schemas) leaves ``target`` untouched. Each file is opened twice, one at a time.
    """
    parts = []
    for open_file in openers:
        with open_file() as handle:
            fields, data_end = read_footer(handle)
            _check_joinable(fields)
            parts.append((fields, data_end, read_offset_indexes(handle, fields)))
    if not parts:
        raise ParquetJoinError("nothing to join")
    first = parts[0][0]
    schema, kv = _get(first, FILE_SCHEMA), _get(first, FILE_KEY_VALUE)
    for fields, _, _ in parts:
        if _get(fields, FILE_SCHEMA) != schema or _get(fields, FILE_KEY_VALUE) != kv:
            raise ParquetJoinError("the parts have different schemas")
    groups, indexes, rows, position = [], [], 0, len(MAGIC)
    target.write(MAGIC)
    for open_file, (fields, data_end, part_indexes) in zip(openers, parts):
        by = position - len(MAGIC)
        for group in _get(fields, FILE_ROW_GROUPS)[2][1]:
            _shift(group, by, len(groups))
            groups.append(group)
        for chunk, index in part_indexes:
            _shift_pages(index, by)
            indexes.append((chunk, index))
        rows += _get(fields, FILE_NUM_ROWS)[2]
        _copy_data(open_file, data_end, target)
        position += data_end - len(MAGIC)
    target.write(_place_offset_indexes(indexes, position))
    footer = [list(f) for f in first]
    _get(footer, FILE_NUM_ROWS)[2] = rows
    _get(footer, FILE_ROW_GROUPS)[2] = (STRUCT, groups)
    out = bytearray()
    _write_struct(out, footer)
    target.write(bytes(out))
    target.write(struct.pack("<I", len(out)))
    target.write(MAGIC)
    return rows
