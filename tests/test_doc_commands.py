"""Every `comet-dse` command README.md, docs/ and studies/README.md show in a code block is one the tool takes as
written: it parses with the command line's own parser, the study, runs and cluster files it names from
this repository exist, and those that only read and print (estimate, search, whatif, plan, presets, validate,
on files that exist) run to exit status 0. The usage lines (with placeholders such as MODEL, N, [--json]) name only options their
command has. What the commands print is checked by test_doc_figures.py; docs/api.md's Python by test_api.py.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from comet_dse.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "studies" / "README.md"]
PLACEHOLDER = re.compile(r"\[|\$|\b[A-Z][A-Z_]+\b")        # [--json], $1, MODEL, STUDY_DIR: a usage line


def documented_commands() -> list:
    """(file, command line) for every `comet-dse ...` in a fenced code block, continuation lines joined,
    after `&&` or `;`, without a trailing comment."""
    found = []
    for doc in DOCS:
        for block in re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(encoding="utf-8"), re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                for part in re.split(r"&&|;", line.split(" #")[0]):
                    if part.strip().startswith("comet-dse "):
                        found.append((doc.relative_to(ROOT).as_posix(), " ".join(part.split())))
    return found


COMMANDS = documented_commands()
RUNNABLE = [(doc, line) for doc, line in COMMANDS if not PLACEHOLDER.search(line.split(" ", 1)[1])]
USAGE = [(doc, line) for doc, line in COMMANDS if (doc, line) not in RUNNABLE]


def test_the_docs_show_commands():
    assert len(RUNNABLE) >= 30 and len(USAGE) >= 10


@pytest.mark.parametrize("doc, line", RUNNABLE, ids=[f"{d}: {line[:60]}" for d, line in RUNNABLE])
def test_a_documented_command_parses_as_written(doc, line):
    argv = shlex.split(line)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{doc}: `{line}` is refused by the parser (exit status {exc.code})")
    for arg in argv:
        if re.match(r"(studies|examples|benchmarks)/.*\.(yaml|csv)$", arg):
            assert (ROOT / arg).is_file(), f"{doc}: `{line}` names {arg}, which is not in the repository"


def _options(command: str) -> set:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]     # argparse's subparsers
    return {flag for action in sub._actions for flag in action.option_strings}


@pytest.mark.parametrize("doc, line", USAGE, ids=[f"{d}: {line[:40]}" for d, line in USAGE])
def test_a_usage_line_names_only_options_its_command_has(doc, line):
    command = line.split()[1]
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line))
    assert named <= _options(command), f"{doc}: `{line}` names {sorted(named - _options(command))}"


READ_ONLY = ("estimate", "search", "whatif", "plan", "presets", "validate")


def _runs_here(line: str) -> bool:
    """A command that only reads and prints, on files of this repository (not a hypothetical my-h100.yaml)."""
    argv = shlex.split(line)[1:]
    files = [a for a in argv if a.endswith((".yaml", ".csv", ".json"))]
    return (argv[0] in READ_ONLY and not {"--output", "--figure"} & set(argv)
            and all((ROOT / f).is_file() for f in files))


PRINTING = [(doc, line) for doc, line in RUNNABLE if _runs_here(line)]


@pytest.mark.parametrize("doc, line", PRINTING, ids=[f"{d}: {line[:60]}" for d, line in PRINTING])
def test_a_documented_command_that_prints_runs(doc, line, monkeypatch):
    from comet_dse.cli import main

    monkeypatch.chdir(ROOT)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(shlex.split(line)[1:])
    assert code == 0, f"{doc}: `{line}` exits {code}: {err.getvalue()}"
    assert out.getvalue().strip(), f"{doc}: `{line}` printed nothing"
