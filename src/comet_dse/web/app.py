"""The explorer page: a Dash app whose every control change is answered by ``view.compute``.

Dash serves its JavaScript (React, Plotly.js) from the installed packages (``serve_locally``), so
the page loads nothing from the internet. The page has no state on the server: each callback gets
the controls and recomputes the view from the batched model.
"""
from __future__ import annotations

import dash
from dash import ALL, Input, Output, State, dcc, html

from comet_dse.base.bounds import BOUNDS, Bound, shown
from comet_dse.base.errors import InputError
from comet_dse.base.units import (
    format_bytes, format_count, format_duration, format_energy, format_hours, format_time, format_usd, is_known,
    or_unknown,
)
from comet_dse.base.vocabulary import BANDWIDTH_CONVENTION, training_label
from comet_dse.presets.catalog import preset_names, transformer_presets
from comet_dse.strategy.text import legend
from comet_dse.web import figures
from comet_dse.web.view import STRATEGY_CONTROLS, TOP, TOPOLOGIES, Controls, compute, controls_for
from comet_dse.whole_run.economics import token_budget

GRAPH_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["sendDataToCloud"]}
DEFAULT = Controls()
DEFAULT_TOKENS = "1T"            # the token budget control's first value
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #222; }
header { background: #24364b; color: white; padding: 10px 18px; }
header h1 { font-size: 20px; margin: 0; } header p { margin: 2px 0 0; font-size: 13px; opacity: .85; }
.page { display: grid; grid-template-columns: 300px 1fr; gap: 14px; padding: 12px; }
.controls label { display: block; font-size: 12px; margin-top: 8px; color: #444; }
.controls input { width: 95%; padding: 3px; }
.controls h3 { font-size: 14px; margin: 14px 0 2px; border-bottom: 1px solid #ddd; }
.status { font-size: 13px; color: #333; margin-bottom: 6px; }
.error { color: #a00; font-weight: bold; font-size: 13px; min-height: 1em; }
.best { font-size: 14px; margin: 4px 0 8px; } .best code { background: #eef3f8; padding: 1px 4px; }
table.top { border-collapse: collapse; font-size: 12px; } table.top td, table.top th { padding: 2px 8px; }
table.top tr:nth-child(even) { background: #f4f6f8; } table.top th { text-align: left; border-bottom: 1px solid #aaa; }
.note, .legend { font-size: 11px; color: #555; margin: 4px 0; }
.figs { display: grid; grid-template-columns: 1fr 1fr; gap: 8px; }
"""


def build_app() -> dash.Dash:
    """The Dash app: layout and callbacks."""
    app = dash.Dash(__name__, title="comet-dse explore", update_title=None, serve_locally=True,
                    suppress_callback_exceptions=True)
    app.index_string = app.index_string.replace("{%css%}", "{%css%}<style>" + STYLE + "</style>")
    app.layout = _layout()
    _callbacks(app)
    _refuse_malformed_requests(app.server)
    return app


MAX_REQUEST_BYTES = 2**20     # a callback's request is a few KiB of control values; 1 MiB leaves room for any


def _refuse_malformed_requests(server) -> None:
    """A request the page would never send (a body over MAX_REQUEST_BYTES, JSON nested beyond what the
    parser takes, an output or input the app does not have) gets a 4xx and one sentence, never a 500 with a
    traceback: Flask answers 413 for the size; whatever else fails while Dash decodes or dispatches it is a
    400 naming the exception's kind."""
    from werkzeug.exceptions import HTTPException

    server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES

    @server.errorhandler(Exception)
    def malformed(exc):
        if isinstance(exc, HTTPException):
            return exc
        return (f"comet-dse explore: the request could not be answered ({type(exc).__name__}); the page sends "
                "control values only\n", 400, {"Content-Type": "text/plain; charset=utf-8"})


def _labelled(text: str, control) -> list:
    return [html.Label(text), control]


def _layout():
    models, clusters = transformer_presets(), preset_names("clusters")
    controls = html.Div(className="controls", children=[
        html.H3("Workload"),
        *_labelled("Model (preset)", dcc.Dropdown(models, DEFAULT.model, id="model", clearable=False)),
        *_labelled("or a Hugging Face config.json on this machine",
                   dcc.Input(id="model-file", type="text", placeholder="/path/to/config.json", debounce=True)),
        *_labelled("Devices", dcc.Input(id="devices", type="number", min=1, step=1, value=DEFAULT.devices,
                                        debounce=True)),
        *_labelled("Global batch (sequences; samples for a recommendation model)", dcc.Input(id="global-batch", type="number", min=1, step=1,
                                                         value=DEFAULT.global_batch, debounce=True)),
        *_labelled("Tokens (or samples) to train on (k, M, G, T, P; empty: none)",
                   dcc.Input(id="tokens", type="text", value=DEFAULT_TOKENS, debounce=True)),
        html.H3("Cluster"),
        *_labelled("Cluster (preset)", dcc.Dropdown(clusters, DEFAULT.cluster, id="cluster", clearable=False)),
        html.Div(id="resource-controls", children=_resource_controls(DEFAULT.cluster)),
        html.P(BANDWIDTH_CONVENTION, className="note"),
        html.H3("Strategy"),
        *_strategy_controls(),
        html.H3("Shown strategy"),
        *_labelled("Breakdown of rank", dcc.Dropdown(list(range(1, TOP + 1)), 1, id="rank", clearable=False)),
    ])
    results = html.Div(children=[
        html.Div(id="status", className="status"),
        html.Div(id="error", className="error", role="alert"),
        html.Div(id="best-strategy", className="best"),
        html.Div(id="training", className="best"),
        html.Div(id="best-table"),
        html.Div(className="figs", children=[
            dcc.Graph(id=name, config=GRAPH_CONFIG)
            for name in ("bathtub", "memory", "breakdown", "doubling", "designs")]),
    ])
    return html.Div([
        html.Header([html.H1("comet-dse explore"),
                     html.P("Every change re-runs the batched cost model over every strategy; nothing is "
                            "precomputed. Hover a point for why a split does not fit.")]),
        html.Div(className="page", children=[controls, results]),
    ])


def _strategy_controls() -> list:
    """One dropdown per strategy control (view.STRATEGY_CONTROLS), holding its first choice; plus TP beyond
    the scale-up domain."""
    out = []
    for knob, (label, choices) in STRATEGY_CONTROLS.items():
        out += _labelled(label, dcc.Dropdown(list(choices), choices[0], id=f"strategy-{knob}", clearable=False))
    out.append(dcc.Checklist([{"label": " TP across nodes (beyond the scale-up domain)", "value": "on"}], [],
                             id="tp-across-nodes"))
    return out


def _resource_controls(cluster: str) -> list:
    """One labelled control per resource of the cluster preset, holding the preset's value. The ids carry
    the cluster's name so that values typed for another cluster are never applied to this one."""
    out = []
    for resource, value in controls_for(cluster):
        ident = {"type": "resource", "key": resource.key, "cluster": cluster}
        if resource.unit == "topology":
            control = dcc.Dropdown(list(TOPOLOGIES), value, id=ident, clearable=False)
        else:
            control = dcc.Input(id=ident, type="number", min=0, value=value, debounce=True)
        out += _labelled(resource.caption, control)
    return out


def _callbacks(app: dash.Dash) -> None:
    @app.callback(Output("resource-controls", "children"), Input("cluster", "value"), prevent_initial_call=True)
    def reset_resources(cluster):
        try:
            return _resource_controls(_name("cluster", cluster))
        except InputError as exc:            # a crafted request (null, a number, an unknown preset): a message
            return [html.P(f"{exc}", className="error", role="alert")]

    @app.callback(
        [Output("status", "children"), Output("error", "children"), Output("best-strategy", "children"),
         Output("best-table", "children"), Output("bathtub", "figure"), Output("memory", "figure"),
         Output("breakdown", "figure"), Output("doubling", "figure"), Output("training", "children"),
         Output("designs", "figure")],
        [Input("model", "value"), Input("model-file", "value"), Input("cluster", "value"),
         Input("devices", "value"), Input("global-batch", "value"), Input("rank", "value"),
         Input({"type": "resource", "key": ALL, "cluster": ALL}, "value"), Input("tokens", "value"),
         *[Input(f"strategy-{knob}", "value") for knob in STRATEGY_CONTROLS], Input("tp-across-nodes", "value")],
        [State({"type": "resource", "key": ALL, "cluster": ALL}, "id")])
    def update(model, model_file, cluster, devices, global_batch, rank, values, tokens, *rest):
        *choices, tp_across_nodes, ids = rest                   # one value per STRATEGY_CONTROLS knob, in order
        try:
            strategy = {**dict(zip(STRATEGY_CONTROLS, choices)), "tp_across_nodes": bool(tp_across_nodes)}
            controls = controls_from(model, model_file, cluster, devices, global_batch, rank, values, ids, tokens,
                                     strategy)
            view = compute(controls)
        except InputError as exc:
            return (dash.no_update, f"{exc}", *[dash.no_update] * 8)
        return (_status(view), "", _best(view), _table(view), figures.bathtub(view), figures.memory(view),
                figures.breakdown(view), figures.doubling(view), _training(view), figures.designs(view))


def controls_from(model, model_file, cluster, devices, global_batch, rank, values, ids, tokens=None,
                  strategy: dict | None = None) -> Controls:
    """The page's control values as ``Controls``; resource values typed for another cluster are dropped;
    ``tokens``: the token budget as typed ('15T'; empty: none), checked as --tokens is; ``strategy``: the
    strategy controls (view.STRATEGY_CONTROLS, and tp_across_nodes), each checked by view.strategy_space."""
    devices = BOUNDS["devices"].check_integer("devices", devices)          # the CLI's and the API's bounds:
    global_batch = BOUNDS["global_batch"].check_integer("global batch", global_batch)   # 1e30 spun a thread
    model, cluster = _name("model", model), _name("cluster", cluster)
    model_file = "" if model_file is None else _name("model file", model_file, empty=True)
    rank = RANK.check_integer("rank", 1 if rank is None else rank)
    resources = _resource_values(values, ids, cluster)
    if tokens is not None and not isinstance(tokens, (str, int, float)):
        raise InputError("tokens", f"must be a token count such as 15T, got {shown(tokens)}")
    strategy = dict(strategy or {})
    across = bool(strategy.pop("tp_across_nodes", False))
    for knob, value in strategy.items():
        if value is not None and not isinstance(value, str):
            raise InputError(knob.replace("_", " "), f"must be one of the listed choices, got {shown(value)}")
    chosen = tuple(sorted((k, v) for k, v in strategy.items() if v is not None))
    return Controls(model=model_file.strip() or model, cluster=cluster, devices=devices,
                    global_batch=global_batch, resources=resources, rank=rank, tokens=_tokens(tokens),
                    strategy=chosen, tp_across_nodes=across)


RANK = Bound(1, TOP, "the ranks the page lists")


def _name(field: str, value, empty: bool = False) -> str:
    """A preset name or a file path as the page sends it: text (a number, a list or null from a crafted
    request was an HTTP 500), not empty unless ``empty``."""
    if not isinstance(value, str) or not (empty or value.strip()):
        raise InputError(field, f"must be {'text' if empty else 'a name'}, got {shown(value)}")
    return value


def _resource_values(values, ids, cluster: str) -> dict:
    """Resource control key -> value for ``cluster``'s controls (values typed for another cluster are
    dropped); the ids must be the page's own ({type, key, cluster} objects)."""
    if not isinstance(values, list) or not isinstance(ids, list) or len(values) != len(ids):
        raise InputError("resources", "must be the page's list of resource controls")
    out = {}
    for ident, value in zip(ids, values):
        if not isinstance(ident, dict) or not isinstance(ident.get("key"), str):
            raise InputError("resources", f"a control id must be the page's own, got {shown(ident)}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            raise InputError(ident["key"], f"must be a number, got {shown(value)}")
        if ident.get("cluster") == cluster:
            out[ident["key"]] = value
    return out


def _tokens(text) -> float | None:
    """The token budget control: empty is none; else economics.token_budget of the text, as --tokens and the
    API read it."""
    if text is None or not str(text).strip():
        return None
    return token_budget(str(text).strip(), given=repr(text))


def _training(view):
    """What training the chosen strategy on the token budget takes: time, device-hours, energy, cost
    (whole_run/economics.py; 'unknown' where the cluster has no price or power figure)."""
    t = view.chosen.get("training")
    if not t:
        return ""

    def shown(key, fmt):
        return or_unknown(t.get(key), fmt)      # None or NaN: no figure

    label = training_label
    return html.Span([f"Training rank {view.chosen.get('rank') or '-'} on {format_count(t['tokens'])} {view.unit}: ",
                      html.Span(shown("time_to_train_s", format_duration), id="time-to-train"), f" ({label('time_to_train_s')}"
                      + (f", goodput {t['goodput'] * 100:.1f} %" if is_known(t.get("goodput")) else "")
                      + (f"; {format_duration(t['time_to_train_s_range'][0])} .. "
                         f"{format_duration(t['time_to_train_s_range'][1])} with the error band"
                         if t.get("time_to_train_s_range") else "") + "), ",
                      f"{shown('device_time_s', format_hours)} {label('device_time_s')}, ",
                      f"{label('energy_j')} {shown('energy_j', format_energy)}"
                      + (f" (leaves out {' and '.join(t['energy_excludes'])}: no figure), "
                         if t.get("energy_excludes") and is_known(t.get("energy_j"))
                         else ", "),
                      f"{label('training_cost_usd')} ", html.Span(shown("training_cost_usd", format_usd), id="training-cost"),
                      f" ({t['cost_basis']}ing; docs/economics.md)"])


def _status(view) -> str:
    excluded = "; ".join(f"{text}: {n:,}" for text, n in sorted(view.excluded.items(), key=lambda kv: -kv[1])[:3])
    return (f"{view.title}. {view.evaluated:,} strategies evaluated in {view.seconds * 1000:.0f} ms, "
            f"{view.feasible:,} fit." + (f" Excluded: {excluded}." if excluded else "")
            + (f" {view.layout_note[0].upper()}{view.layout_note[1:]}." if view.layout_note else ""))


def _best(view):
    if not view.top:
        return html.Span(["No strategy fits. ", view.chosen.get("note") or ""])
    best = view.top[0]
    return html.Span(["Best: ", html.Code(best["strategy"], id="best-text"),
                      f" — {format_time(best['step_time_s'])} per step, {best['tokens_per_second']:,.0f} {view.unit}/s, "
                      f"MFU {best['mfu'] * 100:.1f} %, {format_bytes(best['memory_bytes'])} per device. ",
                      html.Span(view.chosen.get("error_band") or "", id="error-band"),
                      ". " if view.chosen.get("error_band") and view.chosen.get("efficiency") else "",
                      html.Span(view.chosen.get("efficiency") or "", id="efficiency")])


def _table(view):
    head = html.Tr([html.Th(h) for h in ("rank", "strategy", "MP x DP", "step time", f"{view.unit}/s", "MFU",
                                         "memory")])
    rows = [html.Tr([html.Td(r["rank"]), html.Td(html.Code(r["strategy"])), html.Td(f"MP{r['mp']} x DP{r['dp']}"),
                     html.Td(format_time(r["step_time_s"])), html.Td(f"{r['tokens_per_second']:,.0f}"),
                     html.Td(f"{r['mfu'] * 100:.1f} %"), html.Td(format_bytes(r["memory_bytes"]))])
            for r in view.top]
    key = legend([r["strategy"] for r in view.top] + [view.chosen.get("strategy")])
    return html.Div([html.Table([head, *rows], className="top"), html.P(key, className="legend", id="legend")])
