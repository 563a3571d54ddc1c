"""Reading mappings (from YAML files or presets) into typed specs, with field-named errors."""
from __future__ import annotations

from pathlib import Path

import yaml

from comet_dse.errors import InputError


def read_yaml(path: Path, what: str) -> dict:
    """Load a YAML mapping safely; errors name the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(what, f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(what, f"{path} is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(what, f"{path} is not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise InputError(what, f"{path} must hold a mapping of fields, got {type(data).__name__}")
    return data


class Fields:
    """A mapping being read field by field; every error names the dotted field path."""

    def __init__(self, data: dict, prefix: str):
        if not isinstance(data, dict):
            raise InputError(prefix, f"must be a mapping, got {type(data).__name__}")
        self.data = data
        self.prefix = prefix
        self.used: set = set()

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: object = ...) -> object:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise InputError(self.name(key), "is missing")
            return default
        return self.data[key]

    def integer(self, key: str, default: object = ..., minimum: int = 1) -> int:
        value = self.raw(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(self.name(key), f"must be an integer, got {value!r}")
        if value < minimum:
            raise InputError(self.name(key), f"must be >= {minimum}, got {value}")
        return value

    def quantity(self, key: str, kind: str, default: object = ..., high: float = float("inf"),
                 allow_zero: bool = False) -> float:
        """A positive number with a unit (units.parse_quantity), at most ``high`` in SI units.

        ``allow_zero`` admits 0 (latencies and overheads that can be negligible).
        """
        from comet_dse.units import parse_quantity

        value = self.raw(key, default)
        if value is None:
            return None
        number = parse_quantity(value, kind, self.name(key))
        if not (0.0 < number <= high or (allow_zero and number == 0.0)):
            lower = "[0" if allow_zero else "(0"
            raise InputError(self.name(key), f"{value!r} is outside the plausible range {lower}, {high:g}] in SI units")
        return number

    def fraction(self, key: str, default: object = ...) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
            raise InputError(self.name(key), f"must be a fraction in (0, 1], got {value!r}")
        return float(value)

    def choice(self, key: str, enum_type, default: object = ...):
        value = self.raw(key, default)
        if isinstance(value, enum_type):
            return value
        try:
            return enum_type(value)
        except ValueError:
            valid = ", ".join(member.value for member in enum_type)
            raise InputError(self.name(key), f"must be one of {valid}, got {value!r}") from None

    def boolean(self, key: str, default: object = ...) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise InputError(self.name(key), f"must be true or false, got {value!r}")
        return value

    def text(self, key: str, default: object = ...) -> str:
        value = self.raw(key, default)
        return str(value).strip()

    def sub(self, key: str) -> "Fields":
        return Fields(self.raw(key), self.name(key))

    def reject_unknown(self, allowed_extra: tuple = ()) -> None:
        unknown = sorted(set(self.data) - self.used - set(allowed_extra))
        if unknown:
            known = ", ".join(sorted(self.used))
            raise InputError(self.name(unknown[0]), f"unknown field; known fields are {known}")
