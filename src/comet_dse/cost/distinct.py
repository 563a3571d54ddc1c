"""Compute a group of terms once per distinct combination of the fields they depend on.

A sweep of millions of design points has a few hundred distinct micro-batch
shapes and a few hundred distinct parallel layouts. Terms that depend only on
those fields (cost/microbatch_pass.py, cost/layout.py) are computed on one
representative point per combination and gathered back to every point: the
same arithmetic on the same numbers, done less often, so the results are
bit-identical to computing every point.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses

import numpy as np

MIN_POINTS = 64         # below this, grouping costs more than it saves
MAX_SHARE = 0.25        # group only when there are at most this many combinations per point
PAIR_SHARE = 0.25       # pair two groupings (``paired_rows``) only when there are at most this many pairs per point
PAIR_TABLE = 1 << 22    # ``paired_rows`` counts the pairs first where their keys fit a table of this many (4 MiB)
_UNGROUPED = contextvars.ContextVar("comet_dse_ungrouped", default=False)   # set by ungrouped()


@contextlib.contextmanager
def ungrouped():
    """Within this block (in this thread or task), ``once_per_distinct`` computes every point, grouping none.

    For a batch whose points differ in more than the strategy columns the grouping compares: calibration
    gives the cluster's fitted parameters as arrays over the points, which a representative point
    would not carry. A context variable, so the explorer's other requests keep grouping meanwhile.
    """
    token = _UNGROUPED.set(True)
    try:
        yield
    finally:
        _UNGROUPED.reset(token)


def distinct_rows(columns: list):
    """(first, inverse) such that ``col[first][inverse] == col`` for every column, or None.

    Points are grouped by a 64-bit key of the fields that vary (Arrow's
    hash-based dictionary encoding, linear in the points, finds the groups):
    their varying bits packed side by side where they fit in 64 bits
    (``packed_key``, one key per combination), else a hash of them
    (``row_hash``), after which every point is checked to equal its group's
    representative field by field, and any mismatch (a hash collision) gives
    None, as do batches under MIN_POINTS points and batches with more than
    MAX_SHARE combinations per point, and every batch inside ``ungrouped()``.
    """
    n = len(columns[0])
    if n < MIN_POINTS or _UNGROUPED.get():
        return None
    import pyarrow as pa              # here, not at the top: importing comet_dse stays light (tests/test_api.py)
    import pyarrow.compute as pc

    varying = [col for col in columns if np.ndim(col) and _varies(col)]
    if not varying:                   # one combination: every point is the first
        return np.zeros(1, dtype=np.int64), np.zeros(n, dtype=np.int64)
    key = packed_key(varying)
    exact = key is not None           # one key per combination: no collision to check for
    encoded = pc.dictionary_encode(pa.array(key if exact else row_hash(varying)))
    if len(encoded.dictionary) > MAX_SHARE * n:
        return None
    inverse = encoded.indices.to_numpy().astype(np.intp)     # Arrow gives int32: once here, not in every take
    first = np.empty(len(encoded.dictionary), dtype=np.int64)
    first[inverse] = np.arange(n)          # a representative of each group (which one does not matter)
    if not exact and any(np.any(np.take(np.take(col, first), inverse) != col) for col in varying):
        return None
    return first, inverse


SAMPLES = 64        # points ``_varies`` compares with the first before it reads a whole column


def _varies(col) -> bool:
    """True when not every value of ``col`` equals the first (NaN counts as varying): a few evenly spaced
    points first, which settle a column that varies, then the whole column's minimum and maximum."""
    col = np.asarray(col)
    if np.any(col[:: max(1, len(col) // SAMPLES)] != col[0]):
        return True
    return bool(np.min(col) != np.max(col))


def packed_key(columns: list):
    """A 64-bit key per point that is one-to-one on the points' bits in ``columns``, or None where they do not fit.

    Each column's bits (float64 and int64 as they are, narrower types widened) are XORed with its first
    point's; the bits that differ anywhere lie between the lowest and the highest set bit of the OR of
    those, a field of that width, and the fields are packed side by side into 64 bits. Points with the
    same key have the same bits in every column (so also equal values), and points with equal bits the
    same key; None when the fields need more than 64 bits.
    """
    key, offset = None, 0
    for col in columns:
        col = np.ascontiguousarray(col)
        if col.dtype.itemsize == 8:
            bits = col.view(np.uint64)
        else:
            bits = (col.view(f"u{col.dtype.itemsize}") if col.dtype.kind == "f" else col).astype(np.uint64)
        diff = bits ^ bits[0]
        mask = int(np.bitwise_or.reduce(diff))
        if not mask:
            continue
        low = (mask & -mask).bit_length() - 1
        width = mask.bit_length() - low
        if offset + width > 64:
            return None
        field = diff >> np.uint64(low) if low else diff
        if key is None:           # the first field, at offset 0
            key = field
        else:
            key |= field << np.uint64(offset)
        offset += width
    return key


def row_hash(columns: list) -> np.ndarray:
    """A 64-bit hash of each point's values in ``columns`` (their float64 bits, mixed column by column)."""
    key = np.zeros(len(columns[0]), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i, col in enumerate(columns):
            key ^= np.ascontiguousarray(col, dtype=np.float64).view(np.uint64)
            key *= np.uint64(0x9E3779B97F4A7C15 + 2 * i)
            key ^= key >> np.uint64(29)
    return key


def map_leaves(fn, value):
    """``value`` with ``fn`` applied to each leaf: dicts, lists, tuples and dataclass instances are walked
    (and rebuilt), anything else is a leaf."""
    if isinstance(value, dict):
        return {k: map_leaves(fn, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_leaves(fn, v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: map_leaves(fn, getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    return fn(value)


def gathered(value, index):
    """``value`` with every array in it indexed by ``index`` (``map_leaves``; scalars, which hold for every
    point, kept as they are; an array whose rows are all equal becomes a read-only broadcast view of its
    first row, which holds the same numbers without copying them). An array that stands at several places in
    ``value`` (one object) is gathered once, and the result stands at each of them."""
    done = {}           # id -> (leaf, gathered): the leaf is kept so that its id is not reused meanwhile

    def once(leaf):
        if id(leaf) not in done:
            done[id(leaf)] = (leaf, _gather(leaf, index))
        return done[id(leaf)][1]

    return map_leaves(once, value)


def _gather(leaf, index):
    if np.ndim(leaf) == 0:
        return leaf
    leaf = np.asarray(leaf)
    if _rows_all_alike(leaf):
        return np.broadcast_to(leaf[:1], (len(index),) + leaf.shape[1:])
    return np.take(leaf, index, axis=0)


def _rows_all_alike(value: np.ndarray) -> bool:
    """True when every row has the same bits as the first (so -0.0 and 0.0 differ, and a NaN equals itself)."""
    if not len(value):
        return False
    if value.dtype.kind == "f":
        value = np.ascontiguousarray(value).view(f"u{value.dtype.itemsize}")
    return bool(np.all(value == value[0]))


def once_per_distinct(st, columns: list, compute):
    """``compute(st)``, evaluated on one point per distinct combination of ``columns`` and gathered back.

    ``st``: a StrategyArrays; ``columns``: arrays over its points that
    together fix everything ``compute`` reads; ``compute``: StrategyArrays ->
    a dict, list, tuple or dataclass of arrays over the points it is given.
    """
    values, rows = grouped(st, columns, compute)
    return values if rows is None else gathered(values, rows[1])


def grouped(st, columns: list, compute) -> tuple:
    """(``compute`` of one point per distinct combination of ``columns``, (first, inverse): distinct_rows), or
    (``compute(st)``, None) where the batch is not grouped; ``once_per_distinct`` without the gathering, for a
    caller that combines the groups of two such calls first (``paired_rows``)."""
    rows = distinct_rows(columns)
    if rows is None:
        return compute(st), None
    return compute(st.take(rows[0])), rows


def paired_rows(a, b, a_groups: int, b_groups: int):
    """(first, inverse) of the distinct pairs (a[i], b[i]) of two group indices (``a`` below ``a_groups``, ``b``
    below ``b_groups``), as ``distinct_rows`` gives them for columns, or None where there are more than
    PAIR_SHARE pairs per point. The key a b_groups + b is one per pair: nothing to check. Where the keys
    can take at most PAIR_TABLE values, the pairs are first counted in a table of them (a scatter and a
    count, a few times cheaper than encoding), so that a batch with too many pairs is refused early."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(a)
    key = a.astype(np.int64) * b_groups + b
    if a_groups * b_groups <= PAIR_TABLE:
        seen = np.zeros(a_groups * b_groups, dtype=bool)
        seen[key] = True
        if np.count_nonzero(seen) > PAIR_SHARE * n:
            return None
    encoded = pc.dictionary_encode(pa.array(key))
    if len(encoded.dictionary) > PAIR_SHARE * n:
        return None
    inverse = encoded.indices.to_numpy().astype(np.intp)
    first = np.empty(len(encoded.dictionary), dtype=np.intp)
    first[inverse] = np.arange(n)
    return first, inverse
