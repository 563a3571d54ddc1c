"""Reading mappings (from YAML files or presets) into typed specs, with field-named errors.

Every user file goes through ``read_text_file`` (a regular file, at most
MAX_FILE_BYTES, UTF-8) and then ``read_yaml`` or ``read_json``, which refuse
a key given twice, nesting deeper than MAX_DEPTH and more than MAX_NODES values
once YAML aliases are expanded (an "alias bomb"), each with one clear error.
"""
from __future__ import annotations

import difflib
import json
import os
import stat
import unicodedata
from pathlib import Path

import yaml

from comet_dse.base.bounds import BOUNDS, Bound, shown
from comet_dse.base.errors import InputError

MAX_FILE_BYTES = 2**18      # 256 KiB (parsed in under 2 s): a study, model or cluster file is a few KiB
MAX_DEPTH = 64              # nested mappings and lists
MAX_NODES = 200_000         # values in a file, counting each use of a YAML alias
_MAX_DIGITS = 4300           # Python's limit on the digits of an integer read from text (sys.get_int_max_str_digits)
MAX_INTEGER = BOUNDS["integer"].high   # largest integer field (layers, hidden, devices per node, ...)

MAX_NAME = 200              # characters in a name a file gives (a cluster's, a device's, a network dimension's)


def read_text_file(path: Path, what: str) -> str:
    """The text of a regular file of at most MAX_FILE_BYTES; a FIFO, device or folder is refused
    without blocking, and every error names ``what``."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise InputError(what, f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(what, f"{path} is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise InputError(what, f"{path} holds {info.st_size:,} bytes; at most {MAX_FILE_BYTES:,} are read")
        try:
            data = handle.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise InputError(what, f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(what, f"{path} holds more than {MAX_FILE_BYTES:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(what, f"{path} is not UTF-8 text") from None


class _DuplicateKey(Exception):
    """A mapping gives one key twice (raised while parsing, turned into an InputError)."""

    def __init__(self, key, line: int | None):
        super().__init__(key)
        self.key, self.line = key, line


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate keys and nesting deeper than MAX_DEPTH."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _TooDeep()
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:          # an unhashable key: SafeLoader reports it
                    break
                if duplicate:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1)
                seen.add(key)
        return super().construct_mapping(node, deep)


class _TooDeep(Exception):
    """Nesting deeper than MAX_DEPTH."""


def _count_nodes(root) -> int:
    """Values in a composed YAML document, each alias counted as often as it is used;
    stops counting past MAX_NODES (so that an alias bomb costs nothing)."""
    count, stack = 0, [root]
    while stack and count <= MAX_NODES:
        node = stack.pop()
        count += 1
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.extend((key, value))
    return count


def read_yaml(path: Path, what: str) -> dict:
    """Load a YAML mapping safely (no tags executed); errors name the file."""
    return parse_yaml(read_text_file(path, what), path, what)


def parse_yaml(text: str, path: Path, what: str) -> dict:
    """The YAML mapping in ``text`` (read from ``path``), with read_yaml's checks."""
    loader = None
    try:
        loader = _StrictLoader(text)           # refuses control characters YAML does not allow
        node = loader.get_single_node()
        if node is not None and _count_nodes(node) > MAX_NODES:
            raise InputError(what, f"{path} holds more than {MAX_NODES:,} values (counting YAML aliases)")
        data = loader.construct_document(node) if node is not None else None
    except InputError:
        raise
    except ValueError:                        # an integer of more than 4,300 digits (int's limit)
        raise InputError(what, f"{path} holds a number of more than {_MAX_DIGITS:,} digits") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(what, f"{path} is not valid YAML{where}") from None
    except _DuplicateKey as exc:
        raise InputError(what, f"{path} gives the key {exc.key!r} twice (line {exc.line}); give each key once") from None
    except _TooDeep:
        raise InputError(what, f"{path} nests lists or mappings more than {MAX_DEPTH} deep") from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        raise InputError(what, f"{path} must hold a mapping of fields, got {type(data).__name__}")
    return data


def read_json(path: Path, what: str) -> dict:
    """Load a JSON object (a Hugging Face config.json); duplicate keys and very deep nesting are refused."""
    text = read_text_file(path, what)

    def pairs(items):
        out = {}
        for key, value in items:
            if key in out:
                raise _DuplicateKey(key, None)
            out[key] = value
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise InputError(what, f"{path} is not valid JSON (line {exc.lineno})") from None
    except RecursionError:
        raise InputError(what, f"{path} nests lists or objects too deep") from None
    except _DuplicateKey as exc:
        raise InputError(what, f"{path} gives the key {exc.key!r} twice; give each key once") from None
    except ValueError:                        # an integer of more than 4,300 digits (int's limit)
        raise InputError(what, f"{path} holds a number of more than {_MAX_DIGITS:,} digits") from None
    if not isinstance(data, dict):
        raise InputError(what, f"{path} must hold a JSON object")
    if _json_depth(data) > MAX_DEPTH:
        raise InputError(what, f"{path} nests lists or objects more than {MAX_DEPTH} deep")
    return data


def _json_depth(root) -> int:
    """How deep lists and objects nest in ``root`` (an object of scalars: 1), without recursion."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


class Fields:
    """A mapping being read field by field; every error names the dotted field path."""

    def __init__(self, data: dict, prefix: str):
        if not isinstance(data, dict):
            raise InputError(prefix, f"must be a mapping, got {type(data).__name__}")
        self.data = data
        self.prefix = prefix
        self.used: set = set()
        self.known: set = set()          # keys asked about (has or raw): what unknown-field errors list

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def has(self, key: str) -> bool:
        self.known.add(key)
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: object = ...) -> object:
        self.used.add(key)
        self.known.add(key)
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise InputError(self.name(key), "is missing")
            return default
        return self.data[key]

    def integer(self, key: str, default: object = ..., minimum: int = 1, maximum: int = MAX_INTEGER,
                bound: str = "integer") -> int:
        """An integer field in the row ``bound`` of bounds.BOUNDS (``minimum`` and ``maximum`` narrow it)."""
        value = self.raw(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(self.name(key), f"must be an integer, got {shown(value)}")
        row = BOUNDS[bound]
        return Bound(minimum, min(maximum, row.high), row.why).check_integer(self.name(key), value)

    def quantity(self, key: str, kind: str, default: object = ..., *, bound: str) -> float:
        """A number with a unit (units.parse_quantity) in the row ``bound`` of bounds.BOUNDS."""
        from comet_dse.base.units import parse_quantity

        value = self.raw(key, default)
        if value is None:
            return None
        number = parse_quantity(value, kind, self.name(key))
        return BOUNDS[bound].check(self.name(key), number, shown(value))

    def fraction(self, key: str, default: object = ...) -> float:
        """A fraction of a peak, in the row ``efficiency`` of bounds.BOUNDS."""
        value = self.raw(key, default)
        row = BOUNDS["efficiency"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not row.low <= value <= row.high:
            raise InputError(self.name(key), f"must be a fraction in [{row.low:g}, {row.high:g}], got {shown(value)}")
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

    def name_text(self, key: str, default: object = ...) -> str:
        """A name (of a cluster, a device, a model): text of at most MAX_NAME characters without control
        characters (a newline in a cluster's name wrote keys of its own into the exported ASTRA-sim
        network.yml). Invisible format characters stay allowed: every printer escapes them (text.printable)."""
        value = self.text(key, default)
        if len(value) > MAX_NAME or any(unicodedata.category(c) == "Cc" for c in value):
            raise InputError(self.name(key), f"must be a name of at most {MAX_NAME} characters on one line, without "
                                             f"control characters, got {shown(value[:60])}")
        return value

    def sub(self, key: str) -> "Fields":
        return Fields(self.raw(key), self.name(key))

    def reject_unknown(self, allowed_extra: tuple = ()) -> None:
        """Refuse a key nobody read, naming the closest known one and listing them all."""
        unknown = sorted(set(self.data) - self.used - set(allowed_extra), key=str)
        if unknown:
            known = sorted(self.used | self.known | set(allowed_extra))
            close = difflib.get_close_matches(str(unknown[0]), known, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise InputError(self.name(str(unknown[0])), f"unknown field; {hint}known fields are {', '.join(known)}")
