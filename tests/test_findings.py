"""report.yaml's findings table: specs checked before a run, values measured from the studies, findings.json."""
import json

import pytest

from comet_dse.cli import main
from comet_dse.errors import InputError
from comet_dse.report.build import build_report
from comet_dse.report.findings import TOLERANCE, matches, specs_from
from test_report_config import _study

FINDING = """title: Mine
findings:
  - finding: "x2 capacity: speedup"
    paper: {paper}
    measure: speedup
    paper_setup: {{study: tiny, variant: {{hbm_capacity: 2.0}}, over: {{hbm_capacity: 1.0}}}}
    modern_setup: {{study: tiny, variant: {{hbm_capacity: 2.0}}, over: {{hbm_capacity: 1.0}}}}
    why: the same study twice
  - finding: "the smallest split that fits at x1"
    paper: MP4_DP16
    measure: first-fit
    paper_split: MP4_DP16
    paper_setup: {{study: tiny, variant: {{hbm_capacity: 1.0}}}}
    modern_setup: {{study: tiny, variant: {{hbm_capacity: x1}}}}
"""


def test_a_ratio_is_reproduced_within_the_tolerance_and_a_split_exactly():
    assert TOLERANCE == 0.30
    assert matches(3.0, 2.2, "x") and not matches(3.0, 2.0, "x") and not matches(1.4, 4.8, "x")
    assert matches("MP8_DP8", "MP8_DP8", "split") and not matches("MP8_DP8", "MP2_DP32", "split")
    assert not matches(3.0, None, "x")


def test_the_table_is_measured_into_the_page_and_findings_json(tmp_path):
    folder = tmp_path / "mine"
    _study(folder, "tiny", figures="[capacity]")
    (folder / "report.yaml").write_text(FINDING.format(paper=1.0))
    page = build_report(folder, tmp_path / "out", progress=False)
    rows = json.loads((page.parent / "findings.json").read_text())
    assert [r["unit"] for r in rows] == ["x", "split"]
    speed, fit = rows
    assert speed["paper_setup"] == speed["modern_setup"] and speed["paper_setup"] >= 1.0
    assert speed["reproduced"] == (abs(speed["paper_setup"] - 1.0) <= 0.3)
    assert fit["paper_setup"] == fit["modern_setup"] and fit["paper_setup"].startswith("MP")
    assert (fit["paper_setup"] == "MP4_DP16") == fit["reproduced"]
    html = page.read_text()
    assert '<table class="findings">' in html and "x2 capacity: speedup" in html and "the same study twice" in html


@pytest.mark.parametrize("text, field", [
    ('findings:\n  - {finding: a, paper: 2, measure: fastest, paper_setup: {study: tiny}, '
     'modern_setup: {study: tiny}}\n', "report.findings[0].measure"),
    ('findings:\n  - {finding: a, paper: two, measure: speedup, paper_setup: {study: tiny}, '
     'modern_setup: {study: tiny}}\n', "report.findings[0].paper"),
    ('findings:\n  - {finding: a, paper: 2, measure: speedup, paper_setup: {study: tiny, variant: {}}, '
     'modern_setup: {study: tiny}}\n', "report.findings[0].paper_setup.over"),
    ('findings:\n  - {finding: a, paper: 2, measure: max-speedup, paper_setup: {study: other}, '
     'modern_setup: {study: tiny}}\n', "report.findings[0].paper_setup.study"),
    ('findings:\n  - {finding: a, paper: MP1_DP64, measure: first-fit, paper_setup: {study: tiny}, '
     'modern_setup: {study: tiny}}\n', "report.findings[0].paper_setup.variant"),     # two variants match
])
def test_a_bad_finding_is_refused_before_anything_runs(tmp_path, text, field):
    folder = tmp_path / "mine"
    _study(folder, "tiny", figures="[capacity]")
    (folder / "report.yaml").write_text("title: Mine\n" + text)
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        build_report(folder, out, progress=False)
    assert info.value.field == field
    assert not out.exists()
    assert main(["report", str(folder), "--output", str(out), "--no-progress"]) == 2


def test_specs_must_be_a_list():
    with pytest.raises(InputError) as info:
        specs_from({"finding": "a"})
    assert info.value.field == "report.findings"
