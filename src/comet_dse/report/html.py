"""One self-contained HTML file: figures embedded as data URIs, tables, findings and every preset used."""
from __future__ import annotations

import base64
import html
from importlib import resources
from pathlib import Path

from comet_dse.base.units import format_count, format_duration, format_energy, format_time, format_usd, or_unknown
from comet_dse.base.vocabulary import BANDWIDTH_CONVENTION, TIME_PARTS, training_label
from comet_dse.strategy.text import compact_text, legend
from comet_dse.version import __version__

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
figure{margin:1.2em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.9em;color:#555}
table{border-collapse:collapse;font-size:.85em;margin:.8em 0}th,td{border:1px solid #ddd;padding:.25em .5em;
text-align:right}th{background:#f5f5f5}td.l,th.l{text-align:left}pre{background:#f7f7f7;padding:.8em;
overflow-x:auto;font-size:.8em}details{margin:.4em 0}ul.findings li{margin:.2em 0}
table.findings td{vertical-align:top}table.findings small{color:#555}p.legend{font-size:.85em;color:#555}
div.pair{display:grid;grid-template-columns:1fr 1fr;gap:1em}p.score{font-size:1.05em}
"""
# Sets the page title to "figures-ok:N" once every figure has decoded (read by the browser test).
CHECK = """
<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.title = (ok === imgs.length ? 'figures-ok:' : 'figures-broken:') + ok + '/' + imgs.length;
});
</script>
"""


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _table(headers: list, rows: list, left: int = 1) -> str:
    head = "".join(f'<th class="l">{html.escape(h)}</th>' if i < left else f"<th>{html.escape(h)}</th>"
                   for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="l">{html.escape(str(c))}</td>' if i < left else
                                    f"<td>{html.escape(str(c))}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _best_table(section) -> str:
    """Per variant its best strategy and speedup; with the study's token budget also what training the best
    on it takes (whole_run/economics.py; 'unknown' where the cluster has no price or power figure)."""
    budget = getattr(getattr(section, "study", None), "token_budget", None)
    training = (("time_to_train_s", format_duration), ("energy_j", format_energy), ("training_cost_usd", format_usd))
    rows = []
    for g in section.ranking["variants"]:
        b = g["best"]
        strategy = compact_text(b) if b else "none fits"
        rows.append([g["label"], g["devices"], f"{g['feasible']:,} / {g['points']:,}",
                     format_time(b["step_time_s"]) if b else "-", f"{b['tokens_per_second']:,.0f}" if b else "-",
                     f"{b['mfu'] * 100:.1f}%" if b else "-", strategy,
                     f"{g['speedup']:.2f}x" if g["speedup"] else "-"]
                    + ([or_unknown(b.get(k), shown) if b else "-"
                        for k, shown in training] if budget else []))
    extra = [f"{training_label(k)} ({format_count(budget)} tokens)" for k, _ in training] if budget else []
    table = _table(["cluster variant", "devices", "feasible / evaluated", "best step", "tokens/s", "MFU",
                    "best strategy", "speedup vs baseline"] + extra, rows)
    key = legend([r[6] for r in rows])
    return table + (f'<p class="legend">{html.escape(key)}</p>' if key else "")


def _vocabulary() -> str:
    """What the parts of the step time in the figures mean, and how bandwidth is counted (comet_dse.base.vocabulary)."""
    rows = "".join(f'<tr><td class="l">{html.escape(p.label)}</td><td class="l">{html.escape(p.meaning)}</td></tr>'
                   for p in TIME_PARTS)
    return (f"<details><summary>What the parts of the step time mean</summary><table>"
            f'<tr><th class="l">part</th><th class="l">what it is</th></tr>{rows}</table>'
            f"<p>{html.escape(BANDWIDTH_CONVENTION)}</p></details>")


def _figure(fig, fig_dir: Path) -> str:
    return (f"<figure>{_img(fig_dir / (fig.name + '.png'))}<figcaption><b>{html.escape(fig.title)}.</b> "
            f"{html.escape(fig.caption)}</figcaption></figure>")


def _counterpart(section, by_name: dict):
    """The section of today's strategies for the same question as a study of the paper's setup (``paper-X`` and
    ``X``), or None."""
    name = section.study.name
    return by_name.get(name[len("paper-"):]) if name.startswith("paper-") else None


def _twin(fig, section, today):
    """Of ``today``'s figures, the one of the same kind as ``fig`` (the same file suffix), or None."""
    if today is None:
        return None
    suffix = fig.name[len(section.study.file_stem):]
    return next((f for f in today.figures if f.name[len(today.study.file_stem):] == suffix), None)


def _preset_text(kind: str, name: str) -> str | None:
    path = resources.files("comet_dse").joinpath("presets", kind, f"{name}.yaml")
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _assumptions(sections: list) -> str:
    clusters = sorted({v.cluster.name for s in sections for v in s.study.variants})
    models = sorted({m.name for s in sections for m in s.study.models})
    parts = ["<p>Every number of every preset used, with its source, as shipped in the package. "
             "Study files vary some of them (the axes of each study); prices and power are editable assumptions.</p>"]
    for kind, names in (("clusters", clusters), ("models", models)):
        for name in names:
            text = _preset_text(kind, name)
            if text:
                parts.append(f"<details><summary>{kind[:-1]} <b>{html.escape(name)}</b></summary>"
                             f"<pre>{html.escape(text)}</pre></details>")
    return "\n".join(parts)


def _cell(value, unit: str) -> str:
    from comet_dse.report.findings import text

    return html.escape(text(value.value, unit)) + (f"<br><small>{html.escape(value.note)}</small>" if value.note
                                                   else "")


def _scorecard(table: list, card, readings) -> str:
    """The score in one sentence: the declared reading's (the literal one's where none is declared), with and
    without the tolerances; then the best and literal readings' and how many readings reach each score; the
    findings no reading reproduces together; the declared reading's scorecard, what each single change of its
    answers scores, and every reading's score (report/findings.py: score)."""
    from comet_dse.report.findings import LETTER_ONLY, text

    n = card.total
    decidable = sum(1 for f in table if f.status != "not determinable")
    head = card.headline
    which = "its declared reading" if card.declared else ("the literal reading" if len(card.scores) > 1 else "")
    strict = card.strict[head]
    spread = "; ".join(f"{k} of {n} under {c} reading{'s' if c > 1 else ''}" for k, c in card.distribution().items())
    sentence = (f"Score: comet-dse reproduces {card.scores[head]} of the paper's {n} findings"
                + (f" under {which} ({head})" if which else "")
                + f", {strict} without the tolerances; {n - decidable} of the {n} are not determinable from public "
                  "information.")
    letter = [f"F{i + 1}" for i, f in enumerate(table) if f.status == LETTER_ONLY]
    if letter:
        sentence += (f" Of those reproduced, {', '.join(letter)} {'is' if len(letter) == 1 else 'are'} reproduced by "
                     "the letter only (the finding's status says why).")
    if len(card.scores) > 1:
        sentence += (f" The other readings are shown beside it, never in its place: the best one (picked by its "
                     f"score, after the results) reproduces {card.scores[card.best]} ({card.best}), the literal one "
                     f"{card.scores[card.literal]} ({card.literal}); over all {len(card.scores)} readings: {spread}.")
    if card.incompatible:
        sentence += (" No single reading reproduces both of " + ", ".join(f"F{a} and F{b}" for a, b in
                                                                     card.incompatible) + ".")

    def verdict(f) -> str:
        if f.status == "not determinable":
            return "not determinable"
        if f.status in ("reproduced", LETTER_ONLY):
            return f.status
        return "not reproduced" + ("; reproduced only under other readings" if f.reproduced_under() else "")

    def yes(flag: bool, f) -> str:
        return "-" if f.status == "not determinable" else ("yes" if flag else "no")

    rows = "".join(f'<tr><td class="l">F{i + 1}</td><td class="l">{html.escape(f.spec.finding)}</td><td class="l">'
                   f"{html.escape(text(f.spec.paper, f.spec.unit))}</td><td class=\"l\">"
                   f"{_cell(f.declared_value, f.spec.unit)}</td><td>{yes(f.reproduced_declared, f)}</td>"
                   f"<td>{yes(f.reproduced_declared_strict, f)}</td><td class=\"l\">"
                   f"{html.escape(f.elsewhere() or '-')}</td><td class=\"l\"><b>{verdict(f)}</b></td></tr>"
                   for i, f in enumerate(table))
    card_table = (f"<table class=\"scorecard\"><tr><th class=\"l\"></th><th class=\"l\">finding</th>"
                  f"<th class=\"l\">paper</th><th class=\"l\">{html.escape(which or 'value')} "
                  f"({html.escape(head)})</th><th>with the tolerances</th><th>without</th>"
                  f"<th class=\"l\">readings that reproduce it</th><th class=\"l\">status</th></tr>{rows}</table>")
    parts = [f'<p class="score"><b>{html.escape(sentence)}</b></p>', card_table, _tolerances()]
    if readings.questions:
        parts.append(_declared_table(readings, card))
        qrows = "".join(f"<tr><td class=\"l\">{html.escape(q)}</td><td class=\"l\"><b>{html.escape(a.name)}</b>"
                        f"{' (literal)' if i == 0 else ''}</td><td class=\"l\">{html.escape(a.assumes)}</td>"
                        f"<td class=\"l\">{html.escape(a.evidence)}</td></tr>"
                        for q, answers in readings.questions for i, a in enumerate(answers))
        parts.append(f"<details><summary>The readings: {len(readings.questions)} questions the public material "
                     f"leaves open, every combination of their answers a reading ({len(card.scores)})</summary>"
                     f'<table class="readings"><tr><th class="l">question</th><th class="l">answer</th>'
                     f'<th class="l">assumes</th><th class="l">evidence</th></tr>{qrows}</table></details>')
        from comet_dse.report.findings import matches

        def mark(f, name: str) -> str:
            hit = f.status != "not determinable" and matches(f.spec.paper, f.values[name].value, f.spec.unit)
            return "&#10003;" if hit else ""

        heads = "".join(f"<th>F{i + 1}</th>" for i in range(n))
        body = "".join(f"<tr><td class=\"l\">{html.escape(name)}{' (declared)' if name == card.declared else ''}"
                       f"</td><td>{score}</td><td>{card.strict[name]}</td>"
                       + "".join(f"<td>{mark(f, name)}</td>" for f in table) + "</tr>"
                       for name, score in sorted(card.scores.items(), key=lambda kv: -kv[1]))
        parts.append(f"<details><summary>Every reading's score, with and without the tolerances (columns: the "
                     f"findings)</summary><table><tr><th class=\"l\">reading</th><th>score</th><th>without the "
                     f"tolerances</th>{heads}</tr>{body}</table></details>")
    return "".join(parts)


def _tolerances() -> str:
    """The two tolerances, stated once with their reasons (report/findings.py)."""
    from comet_dse.report.findings import BATHTUB_TOLERANCE, TOLERANCE

    return (f"<p><b>Tolerances.</b> A ratio counts as reproduced within {TOLERANCE:.0%} of the paper's: a "
            f"judgement, not a measurement (the paper gives its ratios to one or two digits from a simulator whose "
            f"cluster files are not public; the public inputs alone move the simulator's own MP64/MP256 ratio by "
            f"18 %). A dip of less than {BATHTUB_TOLERANCE:.0%} is flat, not a bathtub: the largest error of "
            f"comet-dse's end-to-end validation (5.3 %, docs/validation.md). Without them a ratio must round to "
            f"the paper's at its printed precision and any dip is a bathtub; the table shows both.</p>")


def _declared_table(readings, card) -> str:
    """The declared reading's answers with their evidence, and what changing any one answer scores."""
    chosen = readings.declared_reading()
    if chosen is None:
        return ""
    from comet_dse.report.readings import Reading, reading_name

    rows = []
    for i, (question, answer, evidence) in enumerate(readings.declared):
        others = []
        for alt in readings.questions[i][1]:
            if alt.name == answer:
                continue
            name = reading_name(Reading(chosen.answers[:i] + (alt,) + chosen.answers[i + 1:]))
            others.append(f"{alt.name}: {card.scores[name]} ({card.strict[name]} without the tolerances)")
        rows.append(f"<tr><td class=\"l\">{html.escape(question)}</td><td class=\"l\"><b>{html.escape(answer)}"
                    f"</b></td><td class=\"l\">{html.escape(evidence)}</td><td class=\"l\">"
                    f"{html.escape('; '.join(others))}</td></tr>")
    return (f"<details open><summary>The declared reading ({html.escape(card.declared)}), chosen from public "
            f"evidence before its score was computed, and the score with any one answer changed</summary>"
            f'<table class="readings"><tr><th class="l">question</th><th class="l">declared answer</th>'
            f'<th class="l">evidence</th><th class="l">score with this answer changed</th></tr>{"".join(rows)}'
            f"</table></details>")


def _findings_table(table: list, card=None, readings=None) -> str:
    """The COMET paper's findings beside comet-dse's: under the declared, literal and best readings of the paper's
    setup, the span over every reading and the status, and with today's strategies (report/findings.py)."""
    from comet_dse.report.findings import text

    several = card is not None and len(card.scores) > 1
    declared = card is not None and bool(card.declared)
    rows = []
    for i, f in enumerate(table):
        unit = f.spec.unit
        cells = [f"F{i + 1}", html.escape(f.spec.finding), html.escape(text(f.spec.paper, unit))]
        if declared:
            cells.append(_cell(f.declared_value, unit))
        cells += [_cell(f.paper_setup, unit)]
        if several:
            cells.append(_cell(f.values[f.best], unit))
        cells += [html.escape(f.span()), f"<b>{html.escape(f.status)}</b>", _cell(f.modern_setup, unit),
                  html.escape(f.evidence())]
        rows.append("<tr>" + "".join(f'<td class="l">{c}</td>' for c in cells) + "</tr>")
    names = ["", "COMET finding", "paper"]
    if declared:
        names.append(f"declared reading ({card.declared})")
    names.append(f"literal reading{f' ({card.literal})' if several else ''}")
    if several:
        names.append(f"best reading ({card.best})")
    names += ["over every reading", "status", "today's strategies", "evidence"]
    head = "".join(f'<th class="l">{html.escape(h)}</th>' for h in names)
    score = _scorecard(table, card, readings) if card is not None else ""
    return (f"<h2>The COMET paper's findings, reproduced</h2>{score}<p>Each finding of Kadiyala et al. "
            f"(arXiv:2211.16648) beside comet-dse with the paper's setup under every public reading of it (its "
            f"workload's shape, pure model parallelism, 16-bit gradients, checkpointed activations, and one answer "
            f"to each open question; docs/case-studies.md, \"Readings\") and with today's strategies (TP x PP, ZeRO, "
            f"recomputation). A status is relative to the declared reading (the literal one where none is "
            f"declared). The same table, with every reading's value, is in <code>findings.json</code>.</p>"
            f'<table class="findings"><tr>{head}</tr>{"".join(rows)}</table>')


def write_html(path: Path, sections: list, seconds: float, title: str, introduction: str = "",
               findings: list = (), scorecard=None, readings=None) -> None:
    """Write the report; figures are read from ``path.parent / 'figures'``.

    ``title`` heads the page; ``introduction`` (plain text) follows the generated summary;
    ``findings`` (report/findings.py: Finding) make the findings table, before the studies, with the score
    (``scorecard``, findings.score) and the ``readings`` they were measured under (report/readings.py).
    """
    fig_dir = path.parent / "figures"
    intro = f" {html.escape(introduction)}" if introduction else ""
    body = [f"<h1>{html.escape(title)} with comet-dse {__version__}</h1>",
            f"<p>{len(sections)} studies, {sum(s.ranking['points'] for s in sections):,} design points, "
            f"generated in {seconds:.0f} s. Figures are also in <code>figures/</code> (PNG and SVG), one row per "
            f"design point in <code>data/</code> (Parquet).{intro}</p>"]
    if findings:
        body.append(_findings_table(findings, scorecard, readings))
    body.append(_vocabulary())
    by_name = {s.study.name: s for s in sections}
    for s in sections:
        body.append(f"<h2>{html.escape(s.study.name)}: {html.escape(s.study.description)}</h2>")
        body.append(f"<p>Baseline: {html.escape(s.ranking['baseline'])}.</p>")
        if s.findings:
            body.append('<ul class="findings">' + "".join(f"<li>{html.escape(f)}</li>" for f in s.findings) + "</ul>")
        today = _counterpart(s, by_name)
        if today is not None:
            body.append(f"<p>Each figure of the paper's setup (left) beside the same question with today's "
                        f"strategies (right, study {html.escape(today.study.name)}).</p>")
        for fig in s.figures:
            twin = _twin(fig, s, today)
            if twin is None:
                body.append(_figure(fig, fig_dir))
            else:
                body.append(f'<div class="pair">{_figure(fig, fig_dir)}{_figure(twin, fig_dir)}</div>')
        body.append(_best_table(s))
    body.append("<h2>Assumptions</h2>")
    body.append(_assumptions(sections))
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style>{CHECK}</head><body>{''.join(body)}</body></html>")
    path.write_text(page, encoding="utf-8")
