"""The import direction of docs/architecture.md holds: each floor uses only lower floors.

The floor table is read from docs/architecture.md itself, so the map and the code cannot drift apart: a new
module or package must be placed on a floor there, and an import that goes up (or sideways between two
packages of the same floor) fails here with the module and line that does it. Imports inside functions
count too: a lazy import is still a dependency.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "comet_dse"
MAP = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\|\s*(\d+)\s*\|([^|]+)\|")


def floors() -> dict:
    """Top-level name (module or package, without .py or /) -> its floor, from the map's table."""
    table = {}
    for line in MAP.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            for name in re.findall(r"`([^`]+)`", match.group(2)):
                table[name.strip("/").removesuffix(".py")] = int(match.group(1))
    return table


def top_level(path: Path) -> str:
    """The top-level module or package a source file belongs to ("__init__" for the package's own)."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported(path: Path) -> list:
    """(line, top-level name) of every comet_dse module a file imports, at any depth of the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import; write it out from comet_dse")
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] if node.module != "comet_dse" else [f"comet_dse.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] != "comet_dse":
                continue
            if len(parts) == 1:
                out.append((node.lineno, "__init__"))
            elif (PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").is_file():
                out.append((node.lineno, parts[1]))
            else:                                   # a name the package exports (from comet_dse import estimate)
                out.append((node.lineno, "__init__"))
    return out


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_and_package_is_on_the_map():
    table = floors()
    missing = sorted({top_level(p) for p in SOURCES} - set(table))
    assert not missing, f"place these on a floor in docs/architecture.md: {missing}"
    gone = sorted(set(table) - {top_level(p) for p in SOURCES})
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"


def violations(path: Path, here: str, table: dict) -> list:
    """Each import of ``path`` (part of top-level ``here``) that does not go to a lower floor."""
    return [f"{path.name}:{line} imports {name} (floor {table[name]}) from {here} (floor {table[here]})"
            for line, name in imported(path) if name != here and table[name] >= table[here]]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_go_down(path):
    wrong = violations(path, top_level(path), floors())
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("line", ["from comet_dse.cli import main", "import comet_dse.web.view",
                                  "from comet_dse import whatif", "from comet_dse.cost import step"])
def test_the_checker_catches_an_import_that_does_not_go_down(tmp_path, line):
    """The rule can fail: cost/step.py with one more import, upward (or to its own floor), lazy, is reported."""
    copy = tmp_path / "step.py"
    source = (PACKAGE / "cost" / "step.py").read_text(encoding="utf-8")
    copy.write_text(source + f"\n\ndef _probe():\n    {line}\n", encoding="utf-8")
    table = floors()
    here = "presets" if "cost" in line else "cost"      # cost -> cost is allowed; presets -> cost is sideways
    assert violations(copy, here, table), line
