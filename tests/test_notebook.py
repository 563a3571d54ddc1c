"""The example notebook (examples/whatif.ipynb) runs from top to bottom, as CI executes it, shows its figure
inline, and is committed with the outputs it produces (so that it reads on GitHub without running it)."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "whatif.ipynb"


def code_outputs(nb) -> list:
    """The outputs of each code cell of ``nb``, in order."""
    return [cell.outputs for cell in nb.cells if cell.cell_type == "code"]


def output_kinds(outputs: list) -> set:
    """What a cell's outputs hold: stream names (stdout, stderr), MIME types of rich outputs, 'error'."""
    kinds = set()
    for output in outputs:
        if output.get("output_type") == "stream":
            kinds.add(output.get("name"))
        elif output.get("output_type") == "error":
            kinds.add("error")
        else:
            kinds.update(output.get("data", {}))
    return kinds


@pytest.fixture(scope="module")
def notebooks() -> tuple:
    """(the committed notebook, the same notebook executed now)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    committed = nbformat.read(NOTEBOOK, as_version=4)
    executed = copy.deepcopy(committed)
    nbclient.NotebookClient(executed, timeout=120, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return committed, executed


def test_example_notebook_runs(notebooks):
    _, nb = notebooks
    text = "\n".join(o.get("text", "") for outputs in code_outputs(nb) for o in outputs)
    assert "fits from" in text and "with it:" in text
    assert not any("error" in output_kinds(outputs) for outputs in code_outputs(nb))


def test_example_notebook_shows_its_figure_inline(notebooks):
    _, nb = notebooks
    assert any("image/png" in output_kinds(outputs) for outputs in code_outputs(nb))


def test_committed_notebook_holds_the_outputs_it_produces(notebooks):
    committed, executed = notebooks
    now, stored = code_outputs(executed), code_outputs(committed)
    assert len(now) == len(stored)
    for index, (outputs, kept) in enumerate(zip(now, stored)):       # a warning (stderr) today is not committed
        assert output_kinds(kept) == output_kinds(outputs) - {"stderr"}, f"code cell {index}: commit it executed"
    assert not any("error" in output_kinds(kept) or "stderr" in output_kinds(kept) for kept in stored)


def test_committed_notebook_names_nothing_of_the_machine_it_ran_on(notebooks):
    committed, _ = notebooks
    text = NOTEBOOK.read_text(encoding="utf-8")
    for path in (ROOT, Path.home()):
        assert len(path.parts) < 2 or str(path) not in text
    assert not any("execution" in cell.metadata for cell in committed.cells)       # nbclient's timings
