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

from comet_dse.base.errors import InputError

DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

KIND_BYTES = "bytes"
KIND_BANDWIDTH = "bandwidth"
KIND_FLOPS = "flops"
KIND_TIME = "time"
KIND_COUNT = "count"
KIND_TOKENS = "tokens"               # a count of tokens: 15T = 15e12 (decimal prefixes k M G T P)
KIND_POWER = "power"                 # W, kW, MW
KIND_DURATION = "duration"           # s, min, h, d (days), yr (Julian years of 365.25 days)
KIND_USD = "usd"                     # USD
KIND_RENT = "rent"                   # USD per device-second: USD/s, USD/h
KIND_ENERGY_PRICE = "energy price"   # USD per joule: USD/J, USD/kWh, USD/MWh

HOUR = 3600.0
DAY = 86400.0
YEAR = 365.25 * DAY                  # a Julian year
KWH = 3.6e6                          # joules in a kilowatt-hour
DURATION = {**TIME, "min": 60.0, "h": HOUR, "hour": HOUR, "hours": HOUR, "d": DAY, "day": DAY, "days": DAY,
            "yr": YEAR, "year": YEAR, "years": YEAR}

_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")

_EXAMPLES = {
    KIND_BYTES: '"80 GiB", "40 MiB", "16 GB"',
    KIND_BANDWIDTH: '"2.039 TB/s", "25 GB/s", "200 Gb/s"',
    KIND_FLOPS: '"312 TFLOP/s"',
    KIND_TIME: '"5 us", "1.2 ms"',
    KIND_TOKENS: '"15T", "2.5e12", "500G"',
    KIND_POWER: '"700 W", "10.2 kW"',
    KIND_DURATION: '"5 years", "30 d", "12 h"',
    KIND_USD: '"25000 USD"',
    KIND_RENT: '"2 USD/h" (per device-hour)',
    KIND_ENERGY_PRICE: '"0.08 USD/kWh"',
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
    if kind == KIND_TOKENS:
        return DECIMAL.get(unit) if unit not in ("", "E") else None
    if kind == KIND_POWER:
        return DECIMAL[unit[:-1]] if unit.endswith("W") and unit[:-1] in ("", "k", "M") else None
    if kind == KIND_DURATION:
        return DURATION.get(unit)
    if kind == KIND_USD:
        return 1.0 if unit == "USD" else None
    if kind == KIND_RENT:
        return {"USD/s": 1.0, "USD/h": 1.0 / HOUR, "USD/hour": 1.0 / HOUR}.get(unit)
    if kind == KIND_ENERGY_PRICE:
        return {"USD/J": 1.0, "USD/kWh": 1.0 / KWH, "USD/MWh": 1.0 / (1000 * KWH)}.get(unit)
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


_PER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(USD|W)\s*(?:/|per\s)\s*\(?\s*"
                       r"([A-Za-zµ/]+)\s*\)?\s*$")


def parse_per_unit(value: object, numerator: str, kind: str, field: str) -> float:
    """A price or a power per unit of a resource, in SI units: ``"15 USD/GiB"`` -> 15 / 2**30 USD per byte,
    ``"31 W/(TB/s)"`` -> 31 / 1e12 W per byte/s. ``numerator``: 'USD' or 'W'; ``kind``: the resource's unit
    kind (KIND_BYTES, KIND_BANDWIDTH, KIND_FLOPS). A bare number is already per SI unit. InputError naming
    ``field`` otherwise."""
    example = f'"15 {numerator}/GiB", "31 {numerator}/(TB/s)", "0.02 {numerator}/(TFLOP/s)"'
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(field, f"expected a {numerator} figure per unit like {example}, got {value!r}")
    if not isinstance(value, str):
        return _finite(float(value) if abs(value) < 1e300 else math.inf, value, field)
    bare = _QUANTITY.match(value)
    if bare and bare.group(2) == "":
        return _finite(float(bare.group(1)), value, field)
    match = _PER_UNIT.match(value)
    if not match or match.group(2) != numerator:
        raise InputError(field, f"cannot read {value!r}; write it like {example}")
    per = _unit_scale(match.group(3), kind)
    if per is None:
        raise InputError(field, f"unit {match.group(3)!r} is not a {kind} unit; write it like {example}")
    return _finite(float(match.group(1)) / per, value, field)


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


def format_duration(t: float) -> str:
    """A long time with a readable unit: days from one day on, else hours, e.g. 3.2e6 -> '37.0 days';
    'unknown' for NaN or an infinite time (never 'inf days')."""
    if not math.isfinite(t):
        return "unknown"
    if abs(t) >= DAY:
        return f"{t / DAY:,.1f} days"
    if abs(t) >= HOUR:
        return f"{t / HOUR:.1f} h"
    return format_time(t)


def format_energy(joules: float) -> str:
    """Energy in MWh from one MWh on, else kWh, e.g. 3.6e12 -> '1,000 MWh', 5.5e6 -> '1.53 kWh'."""
    if abs(joules) >= 1e3 * KWH:
        return _three(joules / (1e3 * KWH), "MWh")
    return _three(joules / KWH, "kWh")


def _three(x: float, unit: str) -> str:
    """``x`` with three significant digits, whole numbers from 1,000 on: '1.53 MWh', '1,000 MWh'."""
    return f"{x:,.0f} {unit}" if abs(x) >= 1000 else f"{x:.3g} {unit}"


def format_usd(usd: float) -> str:
    """Dollars, three significant digits and never an exponent, e.g. 1.234e6 -> '$1.23M', 950 -> '$950',
    -38400 -> '-$38.4k', 1e12 -> '$1,000B'; 'unknown' for NaN or an infinite amount (never '$infB')."""
    if not math.isfinite(usd):
        return "unknown"
    sign, usd = ("-" if usd < 0 else ""), abs(usd)
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if usd >= scale:
            return f"{sign}${_significant(usd / scale)}{unit}"
    return f"{sign}${_significant(usd)}"


def _significant(x: float) -> str:
    """A non-negative amount with three significant digits, whole from 100 on, never in exponent notation:
    1.234 -> '1.23', 12.34 -> '12.3', 999.6 -> '1,000', 12345 -> '12,345'."""
    if x >= 99.95:
        return f"{x:,.0f}"
    return f"{float(f'{x:.3g}'):g}" if x >= 1e-4 else f"{x:.4f}"


def format_hours(seconds: float) -> str:
    """Seconds as hours, e.g. device-hours: 3.6e9 -> '1,000,000'; whole hours from 100 up, three significant
    digits below (a recommendation model trains in minutes: 1,728 s -> '0.48')."""
    hours = seconds / HOUR
    return f"{hours:,.0f}" if abs(hours) >= 100 or hours == 0 else f"{hours:.3g}"


def is_known(value) -> bool:
    """Whether there is a figure: ``value`` is neither None (JSON null) nor NaN (no price or power figure,
    docs/economics.md)."""
    return value is not None and value == value


def is_finite(value) -> bool:
    """Whether ``value`` is a finite number: neither None (JSON null), NaN nor infinite."""
    return is_known(value) and abs(value) != math.inf


def or_unknown(value, shown) -> str:
    """``shown(value)``, or 'unknown' where there is no figure (is_known: None or NaN; an infinity is shown)."""
    return shown(value) if is_known(value) else "unknown"


def format_count(n: float) -> str:
    """A large count with a decimal prefix, e.g. 1.5e13 -> '15T', 2.4e6 -> '2.4M'."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n:.4g}"
