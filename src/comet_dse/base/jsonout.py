"""Strict JSON for every JSON comet-dse writes: ``--json`` outputs, summaries, findings, chunk summaries.

Python's ``json.dumps`` writes a NaN or an infinity as bare ``NaN`` / ``Infinity``, which is not JSON
(RFC 8259): strict parsers (JavaScript's ``JSON.parse``, jq, Go) refuse the whole file. Here a value
that is not a finite number (no price given, an undefined ratio) is written as ``null``, and the
writer is told to refuse anything else that is not JSON (``allow_nan=False``).
"""
from __future__ import annotations

import json
import math
import numbers


def plain(value):
    """``value`` as plain JSON values, recursively: NaN and infinities become None, numpy scalars and arrays
    Python numbers and lists, tuples lists; strings (and str or int Enums) and None are kept."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    if hasattr(value, "tolist"):           # a numpy array or numpy bool
        return plain(value.tolist())
    return value


def dumps(value, **options) -> str:
    """``json.dumps`` of ``plain(value)`` with ``allow_nan=False``: always valid JSON."""
    return json.dumps(plain(value), allow_nan=False, **options)
