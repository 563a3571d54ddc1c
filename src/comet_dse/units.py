"""Units: SI base units inside, parsed once at the boundary.

Inside comet-dse every quantity is a plain float (or numpy array) in SI base
units: bytes, FLOP, seconds, bytes/s, FLOP/s. Text such as ``"80 GiB"``,
``"2.039 TB/s"``, ``"312 TFLOP/s"`` or ``"5 us"`` is converted here and nowhere
else.

Prefix rules (see docs/units.md):
- FLOP, FLOP/s and bandwidth (B/s, b/s) take decimal prefixes only (k, M, G, T, P, E).
- Capacity (B) takes binary prefixes (KiB, MiB, GiB, TiB, PiB) and, when a
  datasheet states it so, decimal ones (GB = 1e9 bytes).
- Bits are accepted for bandwidth (``"200 Gb/s"``) and converted to bytes/s.
"""
from __future__ import annotations

import math
import re

from comet_dse.errors import InputError

DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

KIND_BYTES = "bytes"
KIND_BANDWIDTH = "bandwidth"
KIND_FLOPS = "flops"
KIND_TIME = "time"
KIND_COUNT = "count"

_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")

_EXAMPLES = {
    KIND_BYTES: '"80 GiB", "40 MiB", "16 GB"',
    KIND_BANDWIDTH: '"2.039 TB/s", "25 GB/s", "200 Gb/s"',
    KIND_FLOPS: '"312 TFLOP/s"',
    KIND_TIME: '"5 us", "1.2 ms"',
}


def _unit_scale(unit: str, kind: str) -> float | None:
    """Multiplier that converts one ``unit`` of ``kind`` into SI base units, or None."""
    if kind == KIND_BYTES:
        for prefix, scale in BINARY.items():
            if unit == f"{prefix}B":
                return scale
        if unit.endswith("B") and unit[:-1] in DECIMAL:
            return DECIMAL[unit[:-1]]
        return None
    if kind == KIND_BANDWIDTH:
        if unit.endswith("B/s") and unit[:-3] in DECIMAL:
            return DECIMAL[unit[:-3]]
        if unit.endswith("b/s") and unit[:-3] in DECIMAL:
            return DECIMAL[unit[:-3]] / 8.0
        return None
    if kind == KIND_FLOPS:
        for suffix in ("FLOP/s", "FLOPS", "flop/s"):
            if unit.endswith(suffix) and unit[: -len(suffix)] in DECIMAL:
                return DECIMAL[unit[: -len(suffix)]]
        return None
    if kind == KIND_TIME:
        return TIME.get(unit)
    return None


def parse_quantity(value: object, kind: str, field: str) -> float:
    """Convert ``value`` (a number in SI base units, or a string with a unit) to a float.

    Raises InputError naming ``field`` when the value is not a finite number of the right kind.
    """
    if isinstance(value, bool):
        raise InputError(field, f"expected a quantity like {_EXAMPLES.get(kind, 'a number')}, got {value!r}")
    if isinstance(value, (int, float)):
        return _finite(float(value) if abs(value) < 1e300 else math.inf, value, field)
    if not isinstance(value, str):
        raise InputError(field, f"expected a quantity like {_EXAMPLES.get(kind, 'a number')}, got {value!r}")
    match = _QUANTITY.match(value)
    if not match:
        raise InputError(field, f"cannot read {value!r}; write it like {_EXAMPLES.get(kind, 'a number')}")
    number, unit = float(match.group(1)), match.group(2)
    if unit == "":
        return _finite(number, value, field)
    scale = _unit_scale(unit, kind)
    if scale is None:
        raise InputError(field, f"unit {unit!r} is not a {kind} unit; write it like {_EXAMPLES.get(kind, 'a number')}")
    return _finite(number * scale, value, field)


def _finite(number: float, given: object, field: str) -> float:
    """``number`` unless it is infinite or NaN (then an InputError naming ``field``)."""
    if not math.isfinite(number):
        shown = given if not isinstance(given, int) or abs(given) < 10**30 else "a huge number"
        raise InputError(field, f"must be a finite number, got {shown!r}")
    return number


def format_bytes(n: float) -> str:
    """Capacity in binary units, e.g. 85899345920 -> '80.0 GiB'."""
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def format_rate(x: float, unit: str) -> str:
    """Decimal-prefixed rate, e.g. format_rate(3.12e14, 'FLOP/s') -> '312 TFLOP/s'."""
    for prefix, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def format_time(t: float) -> str:
    """Seconds with a readable unit, e.g. 0.0123 -> '12.3 ms'."""
    if abs(t) >= 1.0:
        return f"{t:.3f} s"
    if abs(t) >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"
