"""A study folder chooses its report: `figures:` per study, the title and introduction in report.yaml."""
import re

import pytest

from comet_dse.base.errors import InputError
from comet_dse.cli import main
from comet_dse.design_space.study import FIGURE_KINDS, load_study
from comet_dse.report.build import DRAW, build_report, load_report_text

# A small study: megatron-22b on 64 A100s, a few hundred points.
TINY = """name: {name}
description: tiny
models: [megatron-22b]
cluster: dgx-a100-80gb
devices: 64
global_batch: 64
axes:
{axes}
strategy:
  tp: [4, 8]
  micro_batch: [1]
  interleave: [1]
  recompute: [selective]
  zero: [1]
"""
CAPACITY = "  hbm_capacity: {scale: [1.0, 2.0]}"
EXPANSION = ("  expansion_capacity: {values: [0 GiB, 8 GiB]}\n  expansion_bandwidth: {values: [64 GB/s]}\n"
             "expansion: {capacity: 8 GiB, bandwidth: 64 GB/s}")


def _study(folder, name="tiny", axes=CAPACITY, figures=None):
    folder.mkdir(exist_ok=True)
    text = TINY.format(name=name, axes=axes) + (f"figures: {figures}\n" if figures is not None else "")
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def _error(path) -> InputError:
    with pytest.raises(InputError) as info:
        load_study(path)
    return info.value


def test_every_figure_kind_has_a_drawing():
    assert set(DRAW) == set(FIGURE_KINDS)


def test_figures_default_to_speedup(tmp_path):
    assert load_study(_study(tmp_path)).figures == ("speedup",)
    assert load_study(_study(tmp_path, figures="[capacity, speedup]")).figures == ("capacity", "speedup")


def test_unknown_figure_kind_names_figures(tmp_path):
    err = _error(_study(tmp_path, figures="[capacity, bathtubs]"))
    assert err.field == "figures"
    assert "'bathtubs'" in err.message and "parallelism-splits" in err.message     # says what is valid


@pytest.mark.parametrize("figures, axes, missing", [
    ("[network]", CAPACITY, "network"),
    ("[expansion]", CAPACITY, "expansion_capacity"),
    ("[resource-doubling]", CAPACITY, "peak_flops"),
    ("[capacity]", "  hbm_bandwidth: {scale: [1.0, 2.0]}", "hbm_capacity"),
    ("[capacity]", '  hbm_capacity: {values: ["80 GiB", "160 GiB"]}', "scale"),      # multipliers, not values
])
def test_figure_kind_without_its_axes_names_figures(tmp_path, figures, axes, missing):
    err = _error(_study(tmp_path, axes=axes, figures=figures))
    assert err.field == "figures" and missing in err.message


def test_resource_doubling_needs_x1_and_x2(tmp_path):
    axes = "\n".join(f"  {a}: {{scale: [1.0, {'1.5' if a == 'network_bandwidth' else '2.0'}]}}"
                     for a in ("peak_flops", "hbm_capacity", "hbm_bandwidth", "network_bandwidth"))
    err = _error(_study(tmp_path, axes=axes, figures="[resource-doubling]"))
    assert err.field == "figures" and "network_bandwidth" in err.message and "lacks 2" in err.message


def test_two_studies_may_ask_for_the_same_figure_kind(tmp_path):
    """Figure files start with the study's name, so the paper's and today's setups can both draw one kind."""
    _study(tmp_path, "one", figures="[capacity]")
    _study(tmp_path, "two", figures="[capacity]")
    page = build_report(tmp_path, tmp_path / "out", progress=False)
    figures = sorted(p.stem for p in (page.parent / "figures").glob("*.png"))
    assert figures == ["one-capacity", "one-unlocked", "two-capacity", "two-unlocked"]


def test_two_studies_whose_figure_files_would_clash_are_refused(tmp_path, capsys):
    _study(tmp_path, "a", figures="[expansion]", axes=EXPANSION)
    _study(tmp_path, "a-expansion", figures="[capacity]")     # a-expansion-unlocked, twice
    out = tmp_path / "out"
    assert main(["report", str(tmp_path), "--output", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a-expansion-unlocked" in err[0]
    assert not out.exists()


def test_report_yaml_with_unknown_key_is_refused(tmp_path):
    _study(tmp_path)
    (tmp_path / "report.yaml").write_text("title: Mine\nsubtitle: oops\n")
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        build_report(tmp_path, out, progress=False)
    assert info.value.field == "report.subtitle"
    assert not out.exists()


def test_default_title_is_the_folder_name(tmp_path):
    folder = tmp_path / "mystudies"
    _study(folder)
    assert load_report_text(folder).title == "Studies in mystudies"
    assert load_report_text(folder).introduction == ""


def test_own_folder_gets_its_title_and_figures(tmp_path):
    folder = tmp_path / "mine"
    _study(folder, "tiny", figures="[capacity, speedup]")
    (folder / "report.yaml").write_text("title: My capacity <study>\nintroduction: Written for the test.\n")
    page = build_report(folder, tmp_path / "out", progress=False)
    html = page.read_text()
    assert "<title>My capacity &lt;study&gt;</title>" in html
    assert "<h1>My capacity &lt;study&gt; with comet-dse" in html and "COMET case studies" not in html
    assert "(Parquet). Written for the test.</p>" in html
    assert re.findall(r"<h2>(.*?)</h2>", html) == ["tiny: tiny", "Assumptions"]      # report.yaml is not a study
    figures = sorted(p.stem for p in (page.parent / "figures").glob("*.png"))
    assert figures == ["tiny-capacity", "tiny-speedup", "tiny-unlocked"]
    assert "capacity x2 makes the best strategy" in html                           # the capacity finding
