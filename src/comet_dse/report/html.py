"""One self-contained HTML file: figures embedded as data URIs, tables, findings and every preset used."""
from __future__ import annotations

import base64
import html
from importlib import resources
from pathlib import Path

from comet_dse.version import __version__
from comet_dse.strategy import compact_text, legend
from comet_dse.units import format_count, format_duration, format_energy, format_time, format_usd
from comet_dse.vocabulary import BANDWIDTH_CONVENTION, TIME_PARTS, training_label

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
figure{margin:1.2em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.9em;color:#555}
table{border-collapse:collapse;font-size:.85em;margin:.8em 0}th,td{border:1px solid #ddd;padding:.25em .5em;
text-align:right}th{background:#f5f5f5}td.l,th.l{text-align:left}pre{background:#f7f7f7;padding:.8em;
overflow-x:auto;font-size:.8em}details{margin:.4em 0}ul.findings li{margin:.2em 0}
table.findings td{vertical-align:top}table.findings small{color:#555}p.legend{font-size:.85em;color:#555}
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
    on it takes (economics.py; 'unknown' where the cluster has no price or power figure)."""
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
                    + ([(shown(b[k]) if b.get(k) is not None and b[k] == b[k] else "unknown") if b else "-"
                        for k, shown in training] if budget else []))
    extra = [f"{training_label(k)} ({format_count(budget)} tokens)" for k, _ in training] if budget else []
    table = _table(["cluster variant", "devices", "feasible / evaluated", "best step", "tokens/s", "MFU",
                    "best strategy", "speedup vs baseline"] + extra, rows)
    key = legend([r[6] for r in rows])
    return table + (f'<p class="legend">{html.escape(key)}</p>' if key else "")


def _vocabulary() -> str:
    """What the parts of the step time in the figures mean, and how bandwidth is counted (comet_dse.vocabulary)."""
    rows = "".join(f'<tr><td class="l">{html.escape(p.label)}</td><td class="l">{html.escape(p.meaning)}</td></tr>'
                   for p in TIME_PARTS)
    return (f"<details><summary>What the parts of the step time mean</summary><table>"
            f'<tr><th class="l">part</th><th class="l">what it is</th></tr>{rows}</table>'
            f"<p>{html.escape(BANDWIDTH_CONVENTION)}</p></details>")


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


def _findings_table(table: list) -> str:
    """The COMET paper's findings beside comet-dse's in both setups (report/findings.py), with why they differ."""
    from comet_dse.report.findings import TOLERANCE, text

    rows = []
    for f in table:
        unit = f.spec.unit
        verdict = ("reproduced" if f.reproduced else "not reproduced")
        cells = [html.escape(f.spec.finding), html.escape(text(f.spec.paper, unit))]
        for value, mark in ((f.paper_setup, f" <b>({verdict})</b>"), (f.modern_setup, "")):
            note = f'<br><small>{html.escape(value.note)}</small>' if value.note else ""
            cells.append(f"{html.escape(text(value.value, unit))}{mark}{note}")
        cells.append(html.escape(f.spec.why))
        rows.append("<tr>" + "".join(f'<td class="l">{c}</td>' for c in cells) + "</tr>")
    head = "".join(f'<th class="l">{html.escape(h)}</th>' for h in (
        "COMET finding", "paper", "comet-dse, the paper's assumptions", "comet-dse, today's strategies",
        "why they differ"))
    return (f"<h2>The COMET paper's findings, reproduced</h2><p>Each finding of Kadiyala et al. (arXiv:2211.16648) "
            f"beside comet-dse with the paper's assumptions (pure model parallelism, its workload's shape, "
            f"16-bit gradients, checkpointed activations) and with today's strategies (TP x PP, ZeRO, "
            f"recomputation). A split counts as reproduced when it is the same, a ratio when it is within "
            f"{TOLERANCE:.0%} of the paper's. The same table is in <code>findings.json</code>; "
            f"docs/case-studies.md explains each row.</p>"
            f'<table class="findings"><tr>{head}</tr>{"".join(rows)}</table>')


def write_html(path: Path, sections: list, seconds: float, title: str, introduction: str = "",
               findings: list = ()) -> None:
    """Write the report; figures are read from ``path.parent / 'figures'``.

    ``title`` heads the page; ``introduction`` (plain text) follows the generated summary;
    ``findings`` (report/findings.py: Finding) make the findings table, before the studies.
    """
    fig_dir = path.parent / "figures"
    intro = f" {html.escape(introduction)}" if introduction else ""
    body = [f"<h1>{html.escape(title)} with comet-dse {__version__}</h1>",
            f"<p>{len(sections)} studies, {sum(s.ranking['points'] for s in sections):,} design points, "
            f"generated in {seconds:.0f} s. Figures are also in <code>figures/</code> (PNG and SVG), one row per "
            f"design point in <code>data/</code> (Parquet).{intro}</p>"]
    if findings:
        body.append(_findings_table(findings))
    body.append(_vocabulary())
    for s in sections:
        body.append(f"<h2>{html.escape(s.study.name)}: {html.escape(s.study.description)}</h2>")
        body.append(f"<p>Baseline: {html.escape(s.ranking['baseline'])}.</p>")
        if s.findings:
            body.append('<ul class="findings">' + "".join(f"<li>{html.escape(f)}</li>" for f in s.findings) + "</ul>")
        for fig in s.figures:
            body.append(f"<figure>{_img(fig_dir / (fig.name + '.png'))}<figcaption><b>{html.escape(fig.title)}.</b> "
                        f"{html.escape(fig.caption)}</figcaption></figure>")
        body.append(_best_table(s))
    body.append("<h2>Assumptions</h2>")
    body.append(_assumptions(sections))
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style>{CHECK}</head><body>{''.join(body)}</body></html>")
    path.write_text(page, encoding="utf-8")
