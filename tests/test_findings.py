"""report.yaml's findings table: specs checked before a run, values measured from the studies, findings.json."""
import json

import pytest

from comet_dse.base.errors import InputError
from comet_dse.cli import main
from comet_dse.report.build import build_report
from comet_dse.report.findings import BATHTUB_TOLERANCE, TOLERANCE, bathtub, matches, specs_from
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


def test_a_bathtub_needs_both_ends_more_than_the_tolerance_above_an_inner_minimum():
    """By hand: MP1 1.03x and MP64 2.6x of MP2 is flat on the left (3 % < 5 %): no tub; MP1 1.2x is one."""
    assert BATHTUB_TOLERANCE == 0.05
    curve = [(1, "MP1_DP64", 1.03), (2, "MP2_DP32", 1.0), (8, "MP8_DP8", 1.1), (64, "MP64_DP1", 2.6)]
    flat = bathtub(curve)
    assert flat.value == "no" and "MP1_DP64 1.03x (flat: within 5%)" in flat.note
    assert bathtub([(1, "MP1_DP64", 1.2)] + curve[1:]).value == "yes"
    assert bathtub([(1, "a", 1.0), (2, "b", 1.5), (4, "c", 2.0)]).value == "no"     # minimum at an end
    assert bathtub([(1, "a", 1.0), (2, "b", 1.5)]).value is None                      # too few splits
    assert bathtub([(1, "a", 1.06), (2, "b", 1.0), (4, "c", 1.06)]).value == "yes"    # 6 % > 5 % on both sides


def test_the_table_is_measured_into_the_page_and_findings_json(tmp_path):
    folder = tmp_path / "mine"
    _study(folder, "tiny", figures="[capacity]")
    (folder / "report.yaml").write_text(FINDING.format(paper=1.0))
    page = build_report(folder, tmp_path / "out", progress=False)
    rows = json.loads((page.parent / "findings.json").read_text())
    assert [r["unit"] for r in rows] == ["x", "split"]
    for row in rows:
        assert {"finding", "paper", "unit", "readings", "status", "evidence"} <= set(row)
        assert list(row["readings"]) == ["as written"]                 # no readings block: the studies as written
    speed, fit = rows
    value = speed["readings"]["as written"]
    assert value == speed["modern_setup"]["value"] and value >= 1.0
    assert speed["status"] == ("reproduced" if abs(value - 1.0) <= 0.3 else "not reproduced")
    assert fit["readings"]["as written"].startswith("MP")
    assert (fit["readings"]["as written"] == "MP4_DP16") == (fit["status"] == "reproduced")
    html = page.read_text()
    assert '<table class="findings">' in html and "x2 capacity: speedup" in html and "the same study twice" in html
    assert "Score: comet-dse reproduces" in html


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


def test_without_the_tolerances_a_ratio_rounds_to_the_papers_printed_value():
    from comet_dse.report.findings import matches_strict

    assert matches_strict(3.0, 3.04, "x") and not matches_strict(3.0, 3.08, "x")
    assert matches_strict(1.4, 1.449, "x") and not matches_strict(1.4, 1.46, "x")
    assert matches_strict("no", "no", "shape") and not matches_strict(3.1, None, "x")
    curve = [(1, "MP1_DP64", 1.03), (2, "MP2_DP32", 1.0), (8, "MP8_DP8", 1.1), (64, "MP64_DP1", 2.6)]
    assert bathtub(curve).value == "no" and bathtub(curve, 0.0).value == "yes"     # flat only through 5 %


def test_findings_no_reading_reproduces_together_are_marked():
    """Three readings of one question; F1 comes out under a and b, F2 only under c, F3 under b and c: F1 and F2
    need incompatible answers, the others do not. The status is the declared reading's (b)."""
    from comet_dse.report import readings as rd
    from comet_dse.report.findings import Finding, FindingSpec, Setup, Value, score

    block = rd.from_yaml({"studies": ["s"], "questions": [{"question": "q", "answers": [
        {"name": "a"}, {"name": "b"}, {"name": "c"}]}]})
    block = rd.declare(block, {"answers": {"q": {"answer": "b", "evidence": "e"}}}, "declared")
    setup = Setup("s", {}, {}, {})

    def finding(hits):
        spec = FindingSpec("f", "MP4_DP16", "first-fit", setup, setup, "", "")
        values = {n: Value("MP4_DP16" if n in hits else "MP8_DP8") for n in "abc"}
        return Finding(spec, values, Value(None), literal="a")
    table = [finding("ab"), finding("c"), finding("bc")]
    card = score(table, block)
    assert card.incompatible == ((1, 2),) and card.declared == "b" and card.headline == "b"
    assert [f.status for f in table] == ["reproduced", "not reproduced", "reproduced"]
    assert table[0].incompatible == (2,) and table[2].incompatible == ()
    assert "reproduced only under other readings: 1 of 3" in table[1].evidence()
    assert card.scores == {"a": 1, "b": 2, "c": 2} and card.best == "b"
