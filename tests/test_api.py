"""The Python API (docs/api.md): its functions, typed results and tables, and its runnable examples."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from comet_dse import InputError, estimate, load_cluster, load_model, search, sweep, whatif
from comet_dse.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_the_names_are_the_functions():
    import comet_dse.answers.estimate  # noqa: F401 - importing the modules behind them must not replace the functions
    import comet_dse.answers.whatif  # noqa: F401

    assert comet_dse.estimate is estimate and callable(comet_dse.estimate)
    assert comet_dse.whatif is whatif and callable(comet_dse.whatif)
    assert set(comet_dse.__all__) >= {"estimate", "search", "whatif", "sweep", "load_model", "load_cluster"}


def test_import_is_light():
    """Importing the package loads neither pyarrow, pandas nor matplotlib (they come with tables and figures)."""
    import subprocess

    code = "import sys, comet_dse; print(sorted(m for m in ('pyarrow', 'pandas', 'matplotlib', 'dash') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_estimate_equals_the_command_line(capsys):
    argv = ["estimate", "--model", "megatron-1t", "--cluster", "dgx-a100-80gb", "--devices", "512", "--tp", "8",
            "--pp", "64", "--global-batch", "512", "--recompute", "selective", "--sequence-parallel",
            "--set", "hbm_bandwidth=x2", "--json"]
    assert main(argv) == 0
    cli = json.loads(capsys.readouterr().out)
    api = estimate("megatron-1t", "dgx-a100-80gb", 512, tp=8, pp=64, global_batch=512, recompute="selective",
                   sequence_parallel=True, overrides={"hbm_bandwidth": "x2"})
    assert api.to_dict() == cli
    table = api.to_arrow()
    assert table.num_rows == 1 and table.column("step_time_s")[0].as_py() == api.step_time_s
    assert table.column("tp")[0].as_py() == 8 and table.column("recompute")[0].as_py() == "selective"


def test_search_results_are_typed_and_tabular():
    model, cluster = load_model("megatron-18b"), load_cluster("dgx-a100-80gb")
    found = search(model, cluster, 64, 256, mp=[8, 16], recompute=["selective", "full"])
    table = found.to_arrow()
    assert table.num_rows == found.evaluated and found.to_arrow(feasible_only=True).num_rows == found.feasible
    assert {r["tp"] * r["pp"] for r in found.top(50)} <= {8, 16}
    best = found.best
    assert best.feasible and best.step_time_s == pytest.approx(found.top(1)[0]["step_time_s"])
    assert found.strategy(1).recompute.value in ("selective", "full")
    with pytest.raises(IndexError):
        found.strategy(found.feasible + 1)
    frame = found.to_pandas()
    assert len(frame) == found.evaluated and frame["recompute"].isin(["selective", "full"]).all()


def test_to_pandas_without_pandas_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)       # import pandas now fails
    result = estimate("megatron-18b", "dgx-a100-80gb", 8, tp=8, global_batch=8)
    with pytest.raises(ImportError, match=r"pip install 'comet-dse\[pandas\]'"):
        result.to_pandas()
    assert result.to_arrow().num_rows == 1


@pytest.mark.parametrize("call, field", [
    (lambda: load_cluster("tpu-v4", overrides={"hbm_capacity": "80TB"}), "overrides hbm_capacity"),
    (lambda: load_cluster("tpu-v4", expansion="512GiB"), "expansion"),
    (lambda: estimate("megatron-18b", "dgx-a100-80gb", 8, tp=3, global_batch=8), "devices"),
    (lambda: estimate("megatron-18b", "dgx-a100-80gb", 8, tpp=8, global_batch=8), "tpp"),
    (lambda: search("megatron-18b", "dgx-a100-80gb", 64, 256, mp=3), "strategy.mp"),
    (lambda: search("megatron-18b", "dgx-a100-80gb", 64, 256, mp=0), "strategy.mp"),
    (lambda: whatif("megatron-18b", "dgx-a100-80gb", 64, 256, factors=(0,)), "--scale"),
    (lambda: load_model("no-such-model"), "model"),
])
def test_bad_input_raises_input_error_naming_the_field(call, field):
    with pytest.raises(InputError) as info:
        call()
    assert info.value.field == field


def test_sweep_keeps_points_in_memory_or_writes_them(tmp_path):
    study = tmp_path / "s.yaml"
    study.write_text("name: s\nmodels: [megatron-18b]\ncluster: dgx-a100-80gb\ndevices: [64]\nglobal_batch: 256\n"
                     "axes:\n  hbm_capacity: {scale: [1.0, 0.5]}\nstrategy: {recompute: full, zero: [0, 1]}\n")
    result = sweep(study)
    assert result.path is None and result.table.num_rows == result.ranking["points"] > 0
    assert [v["label"] for v in result.variants] == ["hbm_capacity=x1", "hbm_capacity=x0.5"]
    written = sweep(study, output=tmp_path / "r.csv")
    assert written.path.exists() and written.table.num_rows == result.table.num_rows


def _python_blocks(path: Path) -> list:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def test_docs_api_examples_run(monkeypatch, capsys):
    """Every ```python block of docs/api.md, in order, in one namespace, from the repository root."""
    monkeypatch.chdir(ROOT)
    blocks = _python_blocks(ROOT / "docs" / "api.md")
    assert len(blocks) >= 8
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/api.md block {i + 1}", "exec"), namespace)     # noqa: S102 - our own docs
    out = capsys.readouterr().out
    assert "design points" in out and "doubling compute" in out
