"""The house of docs/architecture.md holds: each floor uses only lower floors, the root holds only its front,
the cost rooms follow the step, and the trip through them flows.

The floor and room tables are read from docs/architecture.md itself, so the map and the code cannot drift
apart: a new module or part must be placed there, and an import that goes up (or sideways between two parts
of the same floor, or two cost rooms of the same number) fails here with the module and line that does it.
Imports inside functions count too: a lazy import is still a dependency.
"""
from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "comet_dse"
MAP = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\|\s*(\d+)\s*\|([^|]+)\|")


FRONT = {"__init__", "api", "version", "cli"}   # all the package root may hold (docs/architecture.md)


def _table(section: str) -> dict:
    """Name in backticks (without .py or /) -> its number, from the numbered table under ``## section``."""
    text = MAP.read_text(encoding="utf-8").split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in text.splitlines():
        match = ROW.match(line)
        if match:
            for name in re.findall(r"`([^`]+)`", match.group(2)):
                table[name.strip("/").removesuffix(".py")] = int(match.group(1))
    return table


def floors() -> dict:
    """Top-level name (module or package, without .py or /) -> its floor, from the map's table."""
    return _table("The floors")


def rooms() -> dict:
    """cost/ module name -> its room number, from the map's table of the cost rooms."""
    return _table("The cost rooms")


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
                                  "from comet_dse import whatif", "from comet_dse.model import spec",
                                  "from comet_dse.workload.families import family_of"])
def test_the_checker_catches_an_import_that_does_not_go_down(tmp_path, line):
    """The rule can fail: cost/step.py with one more import, upward (or to its own floor), lazy, is reported."""
    copy = tmp_path / "step.py"
    source = (PACKAGE / "cost" / "step.py").read_text(encoding="utf-8")
    copy.write_text(source + f"\n\ndef _probe():\n    {line}\n", encoding="utf-8")
    table = floors()
    here = "hardware" if "model" in line else "cost"    # hardware -> model is sideways (one floor)
    assert violations(copy, here, table), line


def loose_modules(package: Path) -> list:
    """Modules at the root of ``package`` beyond its front door."""
    return sorted(p.stem for p in package.glob("*.py") if p.stem not in FRONT)


def test_the_root_holds_only_its_front():
    """The package root holds the API, the CLI package and the version; every other module sits in a part."""
    loose = loose_modules(PACKAGE)
    assert not loose, f"move these into the part they belong to (docs/architecture.md): {loose}"
    parts = {top_level(p) for p in SOURCES} - FRONT
    assert all((PACKAGE / part).is_dir() for part in parts), parts


def test_the_root_check_can_fail(tmp_path):
    """A module dropped at the root is found (the check reads the folder, not a list)."""
    for name in ("__init__.py", "api.py", "version.py", "units.py"):
        (tmp_path / name).write_text("", encoding="utf-8")
    assert loose_modules(tmp_path) == ["units"]


COST = PACKAGE / "cost"


def room_violations(path: Path, table: dict) -> list:
    """Each import of another cost room by ``path`` that is not of a lower-numbered room."""
    here = path.stem
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module == "comet_dse.cost":
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("comet_dse.cost."):
            names = [node.module.split(".")[2]]
        out += [f"cost/{here}.py:{node.lineno} imports room {n} ({table[n]}) from room {here} ({table[here]})"
                for n in names if n != here and table[n] >= table[here]]
    return out


def test_every_cost_module_is_a_room_on_the_map():
    table = rooms()
    modules = {p.stem for p in COST.glob("*.py")} - {"__init__"}
    assert modules == set(table), (f"unmapped: {sorted(modules - set(table))}; "
                                   f"mapped but missing: {sorted(set(table) - modules)}")


@pytest.mark.parametrize("path", sorted(COST.glob("*.py")), ids=lambda p: p.name)
def test_cost_rooms_import_only_earlier_rooms(path):
    if path.stem == "__init__":
        return
    wrong = room_violations(path, rooms())
    assert not wrong, "\n".join(wrong)


def test_the_room_check_catches_an_import_of_a_later_room(tmp_path):
    copy = tmp_path / "shapes.py"
    copy.write_text((COST / "shapes.py").read_text(encoding="utf-8")
                    + "\n\ndef _probe():\n    from comet_dse.cost.step import evaluate\n", encoding="utf-8")
    assert room_violations(copy, rooms())


def _running_cost_folder() -> str:
    """The folder of the cost rooms that run: the installed package's (a wheel in CI), not necessarily src/."""
    import comet_dse.cost

    return f"{Path(comet_dse.cost.__file__).parent}{os.sep}"


def room_trips(call) -> list:
    """The trips through the cost kernel while ``call()`` runs: one per call into cost/ from outside it (an
    evaluation, a validity check), each the cost rooms entered, in call order, by the functions that take the
    model as a parameter; consecutive calls in one room count once."""
    trips, folder = [], _running_cost_folder()

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(folder):
            return
        caller = frame.f_back
        if caller is None or not caller.f_code.co_filename.startswith(folder):
            trips.append([])
        if "model" in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
            room = Path(code.co_filename).stem
            if not trips[-1] or trips[-1][-1] != room:
                trips[-1].append(room)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return [trip for trip in trips if trip]


def bounced(trips: list) -> list:
    """The trips that enter a room more than twice, written out."""
    return [" -> ".join(trip) for trip in trips if max(trip.count(room) for room in trip) > 2]


TRIPS = {   # (model, cluster, devices, strategy, expansion tier): every room and branch the kernel has
    "dense": ("llama3-8b", "dgx-h100", 64, dict(tp=2, pp=4, dp=8, global_batch=256, interleave=2,
                                                pipeline_split="embedding-loss", zero=1, dtype="fp8",
                                                fp8_amax_reduction=True, hybrid_shard=True), None),
    "dense-zero3": ("llama3-8b", "dgx-h100", 64, dict(tp=2, dp=32, global_batch=256, zero=3,
                                                      grad_sync="step", micro_batch=2), None),
    "moe-layer-grads": ("mixtral-8x7b", "dgx-h100", 64, dict(tp=2, ep=8, dp=32, global_batch=256, cp=1,
                                                             grad_buffer="layer"), None),
    "moe-cp-tier": ("mixtral-8x7b", "dgx-h100", 64, dict(tp=2, cp=2, ep=4, dp=16, global_batch=256,
                                                         expansion_roofline=True), "512GiB@64GB/s"),
}
TIER_COMPUTE = {"expansion_compute": "10TFLOP/s"}     # the tier's compute roof (cost/expansion.py) takes the model


@pytest.mark.parametrize("case", sorted(TRIPS))
def test_the_trip_through_the_cost_rooms_flows(case):
    """Following the model from the API through the kernel, no cost room is entered more than twice in one
    evaluation (the trip bounced through layout.py and microbatch.py three and four times before the rooms
    followed the step)."""
    import comet_dse

    model, cluster, devices, strategy, tier = TRIPS[case]
    overrides = TIER_COMPUTE if tier else None
    trips = room_trips(lambda: comet_dse.estimate(model, cluster, devices, expansion=tier, overrides=overrides,
                                                  **strategy))
    visited = {room for trip in trips for room in trip}
    assert {"step", "cache", "shapes", "layout", "pipeline", "microbatch_pass", "layer_work", "layer_ops",
            "memory", "flops", "feasibility"} <= visited, trips
    assert ("expansion" in visited) == (tier is not None)
    assert not bounced(trips), bounced(trips)


def test_the_trip_from_the_planner_flows():
    """api.plan searches (many points: the terms grouped per layout and per micro-batch shape) and then
    estimates the best: every evaluation flows."""
    import comet_dse

    trips = room_trips(lambda: comet_dse.plan("mixtral-8x7b", "1T", 256, days=60, clusters=["dgx-h100"],
                                              devices=[64]))
    assert sum("step" in trip for trip in trips) >= 2 and not bounced(trips), bounced(trips)


def test_the_trip_check_can_fail():
    """A trip that bounces between two rooms is seen as such."""
    from comet_dse.cost import layer_work, shapes
    from comet_dse.presets.catalog import load_cluster, load_model
    from comet_dse.strategy.arrays import StrategyArrays
    from comet_dse.strategy.declared import Strategy

    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    st = StrategyArrays.of([Strategy(tp=2, dp=4, global_batch=8)])

    def bounce():
        for _ in range(3):
            layer_work.layer_work(model, shapes.context_of(model, cluster, 8, st), st)

    trips = room_trips(bounce)
    assert len(trips) == 6 and not bounced(trips)          # six calls from outside: six trips
    assert bounced([[room for trip in trips for room in trip]])   # one caller making them all: it bounces
