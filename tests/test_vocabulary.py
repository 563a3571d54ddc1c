"""One vocabulary: every output names a part, a resource and a strategy code as comet_dse.base.vocabulary and the
knob declarations say, and shows network bandwidth per device, per direction."""
from __future__ import annotations

import html
import itertools
import json
import re
from pathlib import Path

import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.answers.overrides import apply_overrides
from comet_dse.answers.whatif import whatif
from comet_dse.base import vocabulary as voc
from comet_dse.base.errors import InputError
from comet_dse.cli.render import render_network, render_search
from comet_dse.cli.whatif import render as render_whatif
from comet_dse.design_space.search import search
from comet_dse.design_space.space import SearchSpace, enumerate_strategies
from comet_dse.design_space.table import evaluate_columns
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.declared import KNOBS, Strategy
from comet_dse.strategy.text import compact_text, legend, legend_code, legend_entries
from cli_run import run

DOCS = Path(__file__).resolve().parents[1] / "docs" / "vocabulary.md"


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100")


def _estimate_args(model="megatron-18b", **knobs):
    """Command-line arguments of `estimate` on 8 A100s with the given knobs."""
    args = ["estimate", "--model", model, "--cluster", "dgx-a100-80gb", "--devices", "8", "--global-batch", "16"]
    for name, value in knobs.items():
        args += [f"--{name}", str(value)]
    return args


# ---- parts -----------------------------------------------------------------------------------------------------

def test_every_part_the_cost_model_produces_has_an_entry_in_its_order():
    model, cluster = load_model("megatron-18b"), load_cluster("dgx-a100-80gb")
    est = estimate(model, cluster, 8, Strategy(tp=2, pp=2, dp=2, global_batch=16))
    assert list(est.breakdown_s) == [p.key for p in voc.TIME_PARTS]
    assert list(est.memory_bytes) == [p.key for p in voc.MEMORY_PARTS]
    cols = evaluate_columns(model, cluster, 8, enumerate_strategies(model, 8, 16, SearchSpace(values={"tp": (2,)})))
    times = {k[len("time_"):-len("_s")] for k in cols if k.startswith("time_") and k.endswith("_s")}
    assert times == set(voc.TIME_PART)
    for part in (*voc.TIME_PARTS, *voc.MEMORY_PARTS):
        assert part.label and part.meaning and re.fullmatch(r"#[0-9A-F]{6}", part.color), part


def test_labels_are_unique_and_documented():
    text = DOCS.read_text()
    for parts in (voc.TIME_PARTS, voc.MEMORY_PARTS):
        labels = [p.label for p in parts]
        assert len(set(labels)) == len(labels)
        for p in parts:
            assert f"| `{p.key}` | {p.label} |" in text, p.key
    for r in voc.RESOURCES:
        assert f"| `{r.name}` | {r.label} | {r.si_unit or '-'} | {r.unit or '-'} |" in text, r.name


def test_estimate_text_prints_the_vocabulary_labels(capsys):
    code, out, err = run(capsys, *_estimate_args(tp=2, pp=2))
    assert code == 0, err
    labels = voc.breakdown_labels({"tp": 2, "pp": 2, "dp": 2, "cp": 1}, True)
    for key, label in labels.items():
        if key == "embedding_communication":          # a recommendation model's part: a transformer leaves it out
            assert label not in out
            continue
        assert re.search(rf"^  {re.escape(label)}\s+\S+ \S+\s+\S+%", out, re.M), (key, label)
    for part in voc.MEMORY_PARTS:
        assert re.search(rf"^  {re.escape(part.label)}\s+\S+ \S+$", out, re.M), part.key
    code, out, err = run(capsys, *_estimate_args(tp=2, pp=2), "--json")
    result = json.loads(out)
    assert list(result["breakdown_s"]) == list(voc.BREAKDOWN_LABELS)        # the JSON keys are the API
    assert list(result["memory_bytes"]) == list(voc.MEMORY_LABELS)


@pytest.mark.parametrize("model, knobs, label", [
    ("megatron-18b", {"tp": 4, "pp": 2}, voc.TIED_ONLY),                       # dp = 1: only the tied embeddings
    ("megatron-18b", {"tp": 2, "pp": 2}, voc.WITH_TIED),                       # dp = 2 and the tied embeddings
    ("megatron-18b", {"tp": 4, "pp": 1}, "data-parallel comm (exposed)"),       # one stage: nothing tied to sync
    ("llama3-8b", {"tp": 4, "pp": 2}, "data-parallel comm (exposed)"),          # untied: the part is 0
])
def test_the_data_parallel_part_says_what_it_holds(capsys, model, knobs, label):
    code, out, err = run(capsys, *_estimate_args(model, **knobs))
    assert code == 0, err
    assert re.search(rf"^  {re.escape(label)}\s", out, re.M), out
    others = {voc.TIED_ONLY, voc.WITH_TIED, "data-parallel comm (exposed)"} - {label}
    assert not any(re.search(rf"^  {re.escape(o)}\s", out, re.M) for o in others)


def test_dp_label_follows_what_the_cost_model_charges():
    model, cluster = load_model("megatron-18b"), load_cluster("dgx-a100-80gb")
    alone = estimate(model, cluster, 8, Strategy(tp=4, pp=2, dp=1, global_batch=16, dp_overlap=False))
    assert alone.breakdown_s["dp_communication"] > 0             # dp = 1, yet the part holds the embedding sync
    assert voc.dp_communication_label(1, 1, 2, True) == voc.TIED_ONLY
    assert voc.dp_communication_label(1, 2, 2, True) == voc.WITH_TIED      # CP ranks reduce gradients too
    assert voc.dp_communication_label(1, 1, 2, False) == voc.BREAKDOWN_LABELS["dp_communication"]
    assert voc.breakdown_labels()["dp_communication"] == voc.BREAKDOWN_LABELS["dp_communication"]


def test_report_parts_are_the_vocabulary_parts():
    pytest.importorskip("matplotlib")
    from comet_dse.report import analysis
    from comet_dse.report.html import _vocabulary

    tied, untied = load_model("megatron-18b"), load_model("llama3-8b")
    assert analysis.part_labels([untied]) == analysis.PART_LABELS
    assert analysis.part_labels([untied, tied])["dp_communication"] == voc.WITH_TIED
    page = _vocabulary()
    assert all(html.escape(p.label) in page for p in voc.TIME_PARTS) and html.escape(voc.BANDWIDTH_CONVENTION) in page


def _small_view():
    from comet_dse.web.view import Controls, compute

    return compute(Controls(model="megatron-18b", cluster="dgx-a100-80gb", devices=64, global_batch=256))


def test_explorer_figures_use_the_vocabulary_labels():
    from comet_dse.web import figures

    view = _small_view()
    st = view.chosen["breakdown_s"]
    degrees = {m[1]: int(m[2]) for m in re.finditer(r"\b(tp|cp|pp|dp)(\d+)\b", view.chosen["strategy"])}
    expected = voc.breakdown_labels(degrees, True)            # megatron-18b ties its embeddings
    assert view.chosen["labels"] == expected
    bars = figures.breakdown(view)["data"][0]
    assert bars["y"] == [expected[k] for k, v in st.items() if v > 0]
    assert bars["marker"]["color"] == [voc.TIME_PART[k].color for k, v in st.items() if v > 0]
    names = {trace["name"] for trace in figures.memory(view)["data"] if trace["type"] == "bar"}
    assert names and names <= set(voc.MEMORY_LABELS.values())
    assert figures.doubling(view)["data"][0]["y"] == [voc.resource(r["resource"]).label for r in view.doubling]


# ---- bandwidth: per device, per direction --------------------------------------------------------------------

def test_nvlink_bandwidth_is_the_same_per_device_number_in_whatif_explorer_and_presets(h100):
    from comet_dse.web.view import controls_for

    nvlink = next(d for d in h100.network if d.name == "nvlink")
    per_device = nvlink.link_bandwidth * nvlink.links_per_device
    assert nvlink.links_per_device > 1 and nvlink.bandwidth == per_device
    name = "network.nvlink.bandwidth"
    shown = voc.resource(name).text(per_device)

    result = whatif(load_model("megatron-1.7b"), h100, 16, 32, resources=[name], factors=(2.0,), capacity=None)
    row = next(line for line in render_whatif(result).splitlines() if line.startswith(name))
    assert shown in row and voc.BANDWIDTH_CONVENTION in render_whatif(result)
    cell = result.to_dict()["cells"][0]
    assert cell["value"] == pytest.approx(2 * per_device) and cell["unit"] == "B/s"

    control, value = next((r, v) for r, v in controls_for("dgx-h100") if r.key == name)
    assert value * control.si == pytest.approx(per_device) and "per device, per direction" in control.caption

    assert f"nvlink(8, switch, {shown})" in render_network(h100)
    ib = next(d for d in h100.network if d.name == "infiniband")
    assert f"infiniband(n, switch, {voc.resource('network.infiniband.bandwidth').text(ib.bandwidth)})" in \
        render_network(h100)


def test_presets_say_how_bandwidth_is_counted(capsys, h100):
    code, out, err = run(capsys, "presets")
    assert code == 0 and voc.BANDWIDTH_CONVENTION in out
    line = next(line for line in out.splitlines() if line.startswith("dgx-h100 "))
    nvlink = h100.network[0]
    assert render_network(h100) in line                       # per device, not one link's 25 GB/s
    assert voc.resource("network.nvlink.link_bandwidth").text(nvlink.link_bandwidth) not in line


def test_set_bandwidth_per_device_sets_the_link_bandwidth(h100):
    links = h100.network[0].links_per_device
    changed = apply_overrides(h100, [("network.nvlink.bandwidth", "900GB/s")])
    assert changed.network[0].bandwidth == pytest.approx(900e9)
    assert changed.network[0].link_bandwidth == pytest.approx(900e9 / links)
    doubled = apply_overrides(h100, [("network.nvlink.bandwidth", "x2")])
    old = apply_overrides(h100, [("network.nvlink.link_bandwidth", "x2")])      # still taken
    assert doubled.network[0].link_bandwidth == pytest.approx(old.network[0].link_bandwidth)
    with pytest.raises(InputError, match="per link"):
        apply_overrides(h100, [("network.nvlink.bandwidth", "x100000")])


def test_whatif_and_explorer_default_to_the_per_device_name(h100):
    from comet_dse.answers.whatif import default_resources, resource_value
    from comet_dse.web.view import controls_for, overrides_for

    assert "network.nvlink.bandwidth" in default_resources(h100)
    assert not any(r.endswith("link_bandwidth") for r in default_resources(h100))
    assert resource_value(h100, "network_bandwidth") == h100.network[0].bandwidth
    keys = [r.key for r, _ in controls_for("dgx-h100")]
    assert "network.infiniband.bandwidth" in keys and not any(k.endswith("link_bandwidth") for k in keys)
    values = {r.key: v for r, v in controls_for("dgx-h100")}
    assert overrides_for(h100, values) == ([], None)
    settings, _ = overrides_for(h100, {**values, "network.nvlink.bandwidth": 900})
    assert settings == [("network.nvlink.bandwidth", "900.0GB/s")]


# ---- strategy codes ------------------------------------------------------------------------------------------

def _sample_strategies() -> list:
    """Strategies that between them print every code: each knob at each of its values, on a base where
    every knob applies (all degrees above 1, flash attention on, fp8 for the fp8 dispatch)."""
    base = dict(tp=2, cp=2, ep=2, pp=2, dp=4, interleave=2, global_batch=64, flash_attention=True, zero=3,
                hybrid_shard=True, dtype="fp8")
    values = {"moe_imbalance": (1.0, 1.5), "micro_batch": (1, 4), "activation_offload": (0.0, 0.5)}
    out = []
    for k in KNOBS:
        options = values.get(k.name) or (tuple(k.kind) if k.is_choice else (False, True) if k.kind is bool else
                                         (1, 8))
        out += [Strategy(**{**base, k.name: value}) for value in options]
    out += [Strategy(tp=16, pp=16, dp=16, micro_batch=1, interleave=8, recompute="selective", sequence_parallel=True,
                     zero=2, global_batch=256)]
    return out


def test_every_code_of_every_compact_line_has_a_legend_entry():
    words = set(itertools.chain.from_iterable(compact_text(s.to_dict()).split() for s in _sample_strategies()))
    entries = dict(legend_entries())
    for word in words:
        assert legend_code(word) in entries, word
    printed = {legend_code(w) for w in words}
    assert printed == set(entries), set(entries) - printed     # every entry is a code some strategy prints
    assert all(meaning for meaning in entries.values())


def test_the_legend_lists_the_codes_that_appear():
    line = legend(["tp16 pp16 dp16 mb1 v8 selective sp z2 bf16", None])
    assert line.startswith(voc.STRATEGY_LEGEND_TITLE + ": ")
    for code in ("tpN = tensor-parallel degree", "ppN", "dpN", "mbN", "vN", "selective = ", "sp = ",
                 "z2 = ZeRO stage 2", "bf16 = "):
        assert code in line, code
    assert "z3" not in line and "flash" not in line and legend([]) == ""
    assert line in DOCS.read_text()


def test_outputs_that_print_strategy_lines_print_the_legend(capsys, tmp_path):
    model, cluster = load_model("megatron-1.7b"), load_cluster("dgx-a100-80gb")
    result = search(model, cluster, 8, 16)
    text = render_search(model.name, cluster.name, 8, 16, result, 0.1, 3)
    assert voc.STRATEGY_LEGEND_TITLE + ": tp = tensor-parallel degree" in text

    folder = tmp_path / "studies"
    folder.mkdir()
    study = folder / "s.yaml"
    study.write_text("name: s\nmodels: [megatron-1.7b]\ncluster: dgx-a100-80gb\ndevices: [8]\nglobal_batch: 16\n")
    for argv in (("sweep", study, "--dry-run"), ("report", folder, "--dry-run"),
                 ("sweep", study, "--output", tmp_path / "r.parquet", "--no-progress")):
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        assert voc.STRATEGY_LEGEND_TITLE + ": tpN = tensor-parallel degree" in out, argv

    result = whatif(model, cluster, 8, 16, resources=["hbm_capacity"], factors=(2.0,), capacity=None)
    assert voc.STRATEGY_LEGEND_TITLE + ": tpN" in render_whatif(result)


def test_html_best_table_has_the_legend():
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace

    from comet_dse.report.html import _best_table

    best = {**Strategy(tp=2, pp=2, dp=2, global_batch=16, recompute="full").to_dict(), "step_time_s": 1.0,
            "tokens_per_second": 1.0, "mfu": 0.5}
    section = SimpleNamespace(ranking={"variants": [{"label": "base", "devices": 8, "feasible": 1, "points": 1,
                                                      "best": best, "speedup": 1.0}]})
    page = _best_table(section)
    assert '<p class="legend">' + voc.STRATEGY_LEGEND_TITLE + ": tpN" in page and "full = " in page


def test_explorer_table_has_the_legend():
    pytest.importorskip("dash")
    from comet_dse.web.app import _table

    view = _small_view()
    legend_line = _table(view).children[1].children
    assert legend_line == legend([r["strategy"] for r in view.top] + [view.chosen["strategy"]])
    assert legend_line.startswith(voc.STRATEGY_LEGEND_TITLE)
