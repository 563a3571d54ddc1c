"""The explorer's figures as Plotly figure specifications: plain dicts that ``dcc.Graph`` draws.

Nothing here imports Plotly or Dash; each function reads a ``view.View`` and returns
``{"data": [...], "layout": {...}}``. Units are in the axis titles (seconds, GiB); the parts' and
resources' names and colours come from comet_dse.base.vocabulary.
"""
from __future__ import annotations

from comet_dse.base.vocabulary import MEMORY_PARTS, TIME_PART, memory_label, resource, time_label
from comet_dse.web.view import GiB, View, designs as cluster_designs

FONT = {"family": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", "size": 12}


def _layout(title: str, **extra) -> dict:
    layout = {"title": {"text": title, "font": {"size": 14}, "x": 0.01, "xanchor": "left", "y": 0.98,
                        "yanchor": "top"}, "font": FONT,
              "margin": {"l": 60, "r": 20, "t": 70, "b": 60}, "height": 380, "template": None,
              "plot_bgcolor": "#fafafa", "paper_bgcolor": "white",
              "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "font": {"size": 10}}}
    layout.update(extra)
    return layout


def _resource_label(name: str) -> str:
    """A resource's label (vocabulary), or its name where the vocabulary does not know it."""
    try:
        return resource(name).label
    except KeyError:
        return name


def bathtub(view: View) -> dict:
    """Step time of the fastest strategy per MP x DP split: splits that fit as a line, those that do not
    as open markers at their time with memory ignored, invalid ones as crosses on the axis; the hover
    text says why."""
    xs = [f"MP{s['mp']}" for s in view.splits]
    fits = [s for s in view.splits if s["fits"]]
    over = [s for s in view.splits if not s["fits"] and s["step_time_s"] is not None]
    invalid = [s for s in view.splits if s["step_time_s"] is None]
    times = [s["step_time_s"] for s in fits + over]
    floor = min(times) * 0.8 if times else 1.0

    def text(s):
        return f"MP{s['mp']} x DP{s['dp']}<br>{s['why']}" + (f"<br>{s['strategy']}" if s["strategy"] else "")

    data = [
        {"type": "scatter", "mode": "lines+markers", "name": "fits", "x": [f"MP{s['mp']}" for s in fits],
         "y": [s["step_time_s"] for s in fits], "text": [text(s) for s in fits],
         "hovertemplate": "%{text}<br>%{y:.3g} s per step<extra></extra>",
         "marker": {"color": "#4C72B0", "size": 9}},
        {"type": "scatter", "mode": "markers", "name": "does not fit (time with memory ignored)",
         "x": [f"MP{s['mp']}" for s in over], "y": [s["step_time_s"] for s in over],
         "text": [text(s) for s in over],
         "hovertemplate": "%{text}<br>%{y:.3g} s per step, memory ignored<extra></extra>",
         "marker": {"color": "#C44E52", "size": 10, "symbol": "circle-open", "line": {"width": 2}}},
        {"type": "scatter", "mode": "markers", "name": "invalid split", "x": [f"MP{s['mp']}" for s in invalid],
         "y": [floor] * len(invalid), "text": [text(s) for s in invalid], "hoverinfo": "text",
         "marker": {"color": "#8C8C8C", "size": 10, "symbol": "x"}},
    ]
    return {"data": data, "layout": _layout(
        "MP x DP bathtub: the fastest strategy per split",
        xaxis={"title": {"text": "model-parallel degree MP = TP x PP (DP = devices / MP)"}, "type": "category",
               "categoryorder": "array", "categoryarray": xs},
        yaxis={"title": {"text": "step time (s)"}, "type": "log"})}


def memory(view: View) -> dict:
    """Memory per device by part for each split (its fastest strategy that fits, else its leanest), with
    the device's capacity as a line: where the memory wall is."""
    parts = [p for p in MEMORY_PARTS if any(s["memory_parts"].get(p.key) for s in view.splits)]
    shown = [s for s in view.splits if s["memory_parts"]]
    xs = [f"MP{s['mp']}" for s in shown]
    data = [{"type": "bar", "name": memory_label(p.key), "x": xs,
             "y": [s["memory_parts"].get(p.key, 0.0) / GiB for s in shown], "marker": {"color": p.color},
             "hovertemplate": f"{memory_label(p.key)}: %{{y:.1f}} GiB<extra></extra>"}
            for p in parts]
    lines = [("capacity per device", view.capacity_bytes, "#C44E52")]
    if view.expansion_bytes:
        lines.append(("with the expansion tier", view.capacity_bytes + view.expansion_bytes, "#CCB974"))
    for name, value, color in lines:
        data.append({"type": "scatter", "mode": "lines", "name": f"{name}: {value / GiB:.1f} GiB", "x": xs,
                     "y": [value / GiB] * len(xs), "line": {"color": color, "dash": "dash", "width": 2},
                     "hoverinfo": "name"})
    return {"data": data, "layout": _layout(
        "Memory per device by part, per split", barmode="stack", margin={"l": 60, "r": 10, "t": 40, "b": 60},
        legend={"orientation": "v", "x": 1.01, "y": 1, "font": {"size": 10}},
        xaxis={"title": {"text": "MP (its fastest that fits, else its leanest)"}, "type": "category"},
        yaxis={"title": {"text": "GiB per device"}})}


def breakdown(view: View) -> dict:
    """Where the chosen strategy's step time goes, one bar per part (seconds)."""
    parts = {k: v for k, v in (view.chosen.get("breakdown_s") or {}).items() if v > 0}
    labels = view.chosen.get("labels") or {}
    title = (f"Breakdown of rank {view.chosen['rank']}" if view.chosen.get("rank") else "Breakdown (does not fit)")
    data = [{"type": "bar", "orientation": "h", "y": [labels.get(p) or time_label(p) for p in parts],
             "x": list(parts.values()),
             "marker": {"color": [TIME_PART[p].color if p in TIME_PART else "#999" for p in parts]},
             "hovertemplate": "%{y}: %{x:.3g} s<extra></extra>"}]
    return {"data": data, "layout": _layout(title, xaxis={"title": {"text": "seconds per step"}},
                                            yaxis={"autorange": "reversed", "automargin": True}, showlegend=False)}


def doubling(view: View) -> dict:
    """The best strategy's speedup when each resource is doubled (1 = no gain)."""
    rows = view.doubling
    data = [{"type": "bar", "orientation": "h", "y": [_resource_label(r["resource"]) for r in rows],
             "x": [r["speedup"] or 0.0 for r in rows],
             "text": [f"{r['speedup']:.2f}x" if r["speedup"] else (r["note"] or "no fit") for r in rows],
             "textposition": "auto", "marker": {"color": "#55A868"},
             "hovertemplate": "%{y} x2: %{text}<extra></extra>"}]
    return {"data": data, "layout": _layout(
        "What doubling each resource buys", xaxis={"title": {"text": "speedup of the best strategy"}},
        yaxis={"autorange": "reversed", "automargin": True}, showlegend=False,
        shapes=[{"type": "line", "x0": 1, "x1": 1, "yref": "paper", "y0": 0, "y1": 1,
                 "line": {"color": "black", "width": 1}}])}


def designs(view: View) -> dict:
    """Step time against the cluster's purchase price for each design the page evaluates (as it is and each
    resource doubled where a per-unit price says what it adds), the Pareto front as a line."""
    points = cluster_designs(view)
    front = sorted((d for d in points if d["on_front"]), key=lambda d: d["value"])
    data = [{"type": "scatter", "mode": "markers+text", "name": "design",
             "x": [d["value"] / 1e6 for d in points], "y": [d["step_time_s"] for d in points],
             "text": [d["label"] for d in points], "textposition": "top center",
             "marker": {"color": ["#C44E52" if d["on_front"] else "#8C8C8C" for d in points], "size": 9},
             "hovertemplate": "%{text}: %{y:.3g} s per step, $%{x:.3g}M<extra></extra>"},
            {"type": "scatter", "mode": "lines", "name": "Pareto front", "x": [d["value"] / 1e6 for d in front],
             "y": [d["step_time_s"] for d in front], "line": {"color": "#C44E52", "dash": "dot"},
             "hoverinfo": "skip"}]
    note = ("" if points else "no purchase price for this cluster (economics.device price): no design to place")
    if points and len(points) == 1:
        note = "no resource has a per-unit price (economics.unit_price): only the cluster as it is can be placed"
    layout = _layout("Step time against cluster price: the designs evaluated",
                     xaxis={"title": {"text": "cluster purchase price (million USD)"}},
                     yaxis={"title": {"text": "step time (s)"}}, showlegend=False)
    if note:
        layout["annotations"] = [{"text": note, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                                  "showarrow": False}]
    return {"data": data, "layout": layout}
