"""The terminal text of the commands: an estimate's breakdown, a search's ranking, a sweep's summary and
a study's dry run. Labels come from comet_dse.base.vocabulary, tables from comet_dse.base.text."""
from __future__ import annotations

import numpy as np

from comet_dse.answers.estimate import Estimate
from comet_dse.base.text import printable, render_table
from comet_dse.base.units import (
    format_bytes, format_count, format_duration, format_energy, format_hours, format_time, format_usd, is_finite,
    is_known, or_unknown,
)
from comet_dse.base.vocabulary import (
    ERROR_BAND_LABEL, FRONTS, breakdown_labels, legend_line, memory_label, resource, training_label,
)
from comet_dse.strategy.choices import Choice
from comet_dse.strategy.declared import KNOB, KNOBS
from comet_dse.strategy.knob import GIVEN
from comet_dse.strategy.text import compact_text, knob_lines, legend


def render_dry_run(study, points: list, limit: int | None) -> str:
    """What `sweep --dry-run` prints: the study's size and its first design points (engine.first_points)."""
    counts = sorted({n for v in study.variants for n in v.devices})
    lines = [f"study {study.name}: {study.points:,} design points: {len(study.models)} model(s) x "
             f"{len(study.variants)} cluster variant(s) on {', '.join(map(str, counts))} devices x strategies"]
    if limit is not None and study.points > limit:
        lines.append(f"above the limit of {limit:,} design points: a run would be refused (--max-points)")
    lines += ["", f"First {len(points)} design points"]
    rows = [[i + 1, model, devices, label, compact_text({k.name: getattr(s, k.name) for k in KNOBS})]
            for i, (model, devices, label, s) in enumerate(points)]
    lines.append(render_table(["#", "model", "devices", "variant", "strategy"], rows, left=(1, 3, 4)))
    return printable("\n".join(lines + _legend([r[4] for r in rows])))


def _legend(texts: list) -> list:
    """The lines that end a text holding compact strategy lines: a blank line and their legend (none if empty)."""
    key = legend(texts)
    return ["", key] if key else []


def _bar(fraction: float, width: int = 24) -> str:
    filled = int(round(max(0.0, min(1.0, fraction)) * width))
    return "#" * filled + "." * (width - filled)


def _strategy_lines(strategy: dict, microbatches: float, layers_per_stage: int) -> list:
    """The strategy's knobs, one line per group (strategy.knob_lines), with what the estimate derived."""
    groups = knob_lines(strategy)
    groups[1].append(f"{microbatches:g} micro-batches per pipeline")
    groups[2].append(f"{layers_per_stage} layers on the busiest stage")
    return [f"  {' '.join(g) if i == 0 else ', '.join(g)}" for i, g in enumerate(groups) if g]


def _family_lines(strategy: dict, family) -> list:
    """The strategy of a family other than the transformer: the knobs its tables show, the samples each of
    the dp devices takes, and dtype."""
    shown = [KNOB[n].label(KNOB[n].kind(strategy[n])) if n != "dp" else f"dp={strategy[n]}"
             for n in family.table_knobs if n in strategy]
    per_device = strategy["global_batch"] / strategy["dp"]
    return ["  " + ", ".join(shown + [f"global batch {strategy['global_batch']:,} ({per_device:,.0f} per device)",
                                      strategy["dtype"]])]


def render_estimate(est: Estimate, hbm_capacity: float, expansion_capacity: float | None,
                    tied_embeddings: bool | None = None, family=None) -> str:
    """A readable breakdown of one iteration: time by part, memory by part and tier, fit, throughput.
    ``tied_embeddings``: whether the model ties them, which says what the data-parallel part holds
    (vocabulary.dp_communication_label); None: the general label. ``family``: the model's workload family
    (its unit, and for a recommendation model its strategy lines; default the transformer)."""
    from comet_dse.workload.families import DEFAULT

    family = family or DEFAULT
    inputs = est.inputs
    st = inputs.get("strategy", {})
    lines = [
        f"{inputs.get('model')} on {inputs.get('devices')} x {inputs.get('cluster')}",
        *(_strategy_lines(st, est.microbatches, est.layers_per_stage) if family is DEFAULT
          else _family_lines(st, family)),
        "",
    ]
    if not est.runnable:
        lines += ["Step time        n/a: the strategy breaks a validity rule (below), so it cannot run", ""]
        return printable("\n".join(lines + _memory_lines(est, hbm_capacity, expansion_capacity) + _verdict(est)))
    lines += [
        f"Step time        {format_time(est.step_time_s)}",
        *([f"{ERROR_BAND_LABEL:17s}{est.error_band['text']}"] if est.error_band else []),
        *([f"{'Efficiency':17s}{est.efficiency['text']}"] if est.efficiency else []),
        f"Throughput       {est.tokens_per_second:,.0f} {family.unit}/s",
        f"MFU / HFU        {est.mfu * 100:.1f}% / {est.hfu * 100:.1f}%",
        "",
        *training_lines(est.training, family.unit),
        "Time per iteration (parts add up to the step time)",
    ]
    total = max(est.step_time_s, 1e-30)
    labels = breakdown_labels(st, tied_embeddings)
    parts = {k: v for k, v in est.breakdown_s.items() if k in family.time_parts}
    width = max(32, *(len(labels.get(k, k)) for k in parts))
    for key, value in parts.items():
        lines.append(f"  {labels.get(key, key):{width}s} {format_time(value):>11s} {value / total * 100:5.1f}%  "
                     f"{_bar(value / total)}")
    lines.append("  by phase (critical stage, bubble excluded): " + ", ".join(
        f"{k} {format_time(v)}" for k, v in est.phases_s.items()))
    lines.append("")
    return printable("\n".join(lines + _memory_lines(est, hbm_capacity, expansion_capacity) + _verdict(est)))


def training_lines(training: dict | None, unit: str = "tokens") -> list:
    """What training on the token budget takes (Estimate.training, whole_run/economics.py): time to train (with the time
    the steps take and the goodput: whole_run/goodput.py), device-hours, average power, energy and cost, renting and
    owning, each 'unknown' where a figure is missing and with its range under the error band where there is
    one (economics.with_ranges); then what was assumed. Nothing without a budget. ``unit``: what the budget
    counts (the model's workload family's: tokens, or samples for a recommendation model)."""
    if not training:
        return []
    t, inputs = training, training
    rent, own = t["training_cost_rent_usd"], t["training_cost_own_usd"]
    draws = inputs["device_power_w"]
    lines = [f"Training on {format_count(t['tokens'])} {unit} (docs/economics.md)" + _band_note(t),
             f"  {training_label('time_to_train_s'):24s} {_or_unknown(t['time_to_train_s'], format_duration)}"
             + _range(t, "time_to_train_s", format_duration),
             *goodput_lines(t),
             f"  {training_label('device_time_s'):24s} {_or_unknown(t['device_time_s'], format_hours)}"
             + _range(t, "device_time_s", format_hours),
             f"  {training_label('average_power_w'):24s} {_or_unknown(t['average_power_w'], lambda w: _watts(w) + ' at the wall')}",
             f"  {training_label('energy_j'):24s} {_or_unknown(t['energy_j'], format_energy)}"
             + _range(t, "energy_j", format_energy)
             + (f" (leaves out {' and '.join(inputs['energy_excludes'])}: no figure)"
                if inputs["energy_excludes"] and is_finite(t["energy_j"]) else ""),
             f"  {training_label('training_cost_usd'):24s} {_or_unknown(t['training_cost_usd'], format_usd)} "
             f"({inputs['cost_basis']}ing)" + _range(t, "training_cost_usd", format_usd),
             f"    {'renting':22s} {_or_unknown(rent, format_usd)}"
             + (f" = device-hours x {resource('rent').text(inputs['rent_usd_per_device_s'])}" if is_finite(rent) else
                " (no rent figure)"),
             f"    {'owning':22s} {_or_unknown(own, format_usd)}"
             + (f" = devices x {format_usd(inputs['device_price_usd'])} over {resource('lifetime').text(inputs['lifetime_s'])}"
                f" + energy at {resource('energy_price').text(inputs['energy_price_usd_per_j'])}"
                " (not the network, the facility or staff)" if is_finite(own) else
                " (" + " and ".join(w for w, v in (("no device price", inputs["device_price_usd"]),
                                                  ("no device power", draws["compute"])) if not is_finite(v)) + ")"),
             "  device draw " + (", ".join(f"{state} {_or_unknown(w, lambda x: f'{x:,.0f} W')}" for state, w in draws.items())
                                 if is_finite(draws["compute"]) else "unknown (no device power)")
             + f"; PUE {inputs['pue']:g}; {inputs['nodes']:,} nodes",
             ""]
    return lines


def goodput_lines(t: dict) -> list:
    """The lines under the time to train: what the steps take, and the goodput with where the rest goes:
    failures (the job's MTBF), restarts, work redone, checkpoints and Young's interval (whole_run/goodput.py)."""
    g = t.get("goodput_terms")
    if g is None:
        return []
    steps = f"    {'of which steps':22s} {_or_unknown(t['productive_time_s'], format_duration)}"
    if not g["enabled"]:
        return [steps + "; goodput not counted (goodput=off: no failure, restart or checkpoint)"]
    gp = t["goodput"]
    young = (f"Young's optimum sqrt(2 x {_span(g['checkpoint_stall_s'])} x {_span(g['mtbf_s'])})"
             f" = {_span(g['young_interval_s'])}")
    interval = (f"the best interval with restarts counted; {young}" if g["checkpoint_interval_given_s"] is None
                else f"as given; {young}")
    return [steps,
            f"    {'goodput':22s} " + (f"{gp * 100:.1f} %" if is_finite(gp) else "unknown")
            + (" (failures come faster than the work they redo: the run never ends)" if gp == 0 else "")
            + (f"; not counted: {', '.join(g['not_counted'])}" if g.get("not_counted") else ""),
            f"    {'failures':22s} {g['failures']:,.0f} expected (job MTBF {_span(g['mtbf_s'])}: "
            f"{resource('mtbf').text(g['mtbf_per_device_s'])} per device / devices"
            + (f", {g['mtbf_source']}" if g.get("mtbf_source") else "") + "), each a "
            f"{_span(g['restart_time_setting_s'])} restart + {_span(g['checkpoint_write_s'])} re-load"
            f" + {_span(g['interval_s'] / 2)} of work redone: "
            f"{_span(g['restart_time_s'] + g['lost_work_s'])}",
            f"    {'checkpoints':22s} {g['checkpoint']}, {format_bytes(g['checkpoint_bytes'])} each, training stops "
            f"{_span(g['checkpoint_stall_s'])}, every {_span(g['interval_s'])} of steps ({interval}): "
            f"{_span(g['checkpoint_time_s'])}"]


def _span(seconds: float) -> str:
    """A duration from seconds to days, three figures: '2.8 s', '4.2 min', '3.1 h', '61.1 days'."""
    if not is_finite(seconds):
        return "unknown" if not is_known(seconds) else "never"
    if abs(seconds) >= 3600:
        return format_duration(seconds)
    return f"{seconds / 60:.1f} min" if abs(seconds) >= 60 else f"{seconds:.3g} s"


def _range(t: dict, key: str, shown) -> str:
    """'  (low .. high with the error band)' for a figure that has a range (economics.with_ranges), else ''."""
    r = t.get(f"{key}_range")
    return f"  ({shown(r[0])} .. {shown(r[1])})" if r else ""


def _band_note(t: dict) -> str:
    """What the ranges in parentheses are, and what the figures are, where there is a band."""
    if not t.get("time_to_train_s_range"):
        return ""
    note = "; (low .. high): as the step time's error band leaves them"
    if t.get("headline") == "expected":
        note += (f"; each figure the band's expected value: the model's own divided by 1 + the band's mean error "
                 f"({t['band_mean_error'] * 100:+.1f} %; the model's own in --json, *_modelled)")
    return note


def _or_unknown(value, shown) -> str:
    """``value`` shown, or 'unknown' where it is missing (JSON null, NaN inside) or infinite (units.or_unknown
    shows an infinity)."""
    return shown(value) if is_finite(value) else "unknown"


def _watts(w: float) -> str:
    return f"{w / 1e6:,.3g} MW" if w >= 1e6 else f"{w / 1e3:,.3g} kW"


def _memory_lines(est: Estimate, hbm_capacity: float, expansion_capacity: float | None) -> list:
    """Memory per device by part and by tier."""
    lines = ["Memory per device (busiest pipeline stage)"]
    for key, value in est.memory_bytes.items():
        lines.append(f"  {memory_label(key):32s} {format_bytes(value):>11s}")
    lines.append(f"  {'total':32s} {format_bytes(est.memory_per_device_bytes):>11s}")
    if est.memory_last_stage_bytes != est.memory_per_device_bytes:     # pipelined: the last rank differs
        lines.append(f"  {'last pipeline stage, total':32s} {format_bytes(est.memory_last_stage_bytes):>11s}"
                     "  (the rank Megatron-LM logs memory from)")
    tiers = est.memory_tiers_bytes
    tier_line = f"  in HBM {format_bytes(tiers['hbm'])} of {format_bytes(hbm_capacity)}"
    if expansion_capacity:
        tier_line += f"; in the expansion tier {format_bytes(tiers['expansion'])} of {format_bytes(expansion_capacity)}"
    if tiers.get("host"):
        offloaded = est.inputs.get("strategy", {}).get("activation_offload", 0.0)
        held = "activations offloaded for backward" if offloaded else "embedding rows and their optimizer state"
        tier_line += f"; in host memory {format_bytes(tiers['host'])} ({held})"
    return lines + [tier_line, ""]


def _verdict(est: Estimate) -> list:
    if est.feasible:
        return ["Feasible: yes"]
    return ["Feasible: NO"] + [f"  - {reason}" for reason in est.reasons]


def describe_peak(flops: dict) -> str:
    """A device's peak compute in the vocabulary's unit: its bf16 rate, or its first dtype's
    ('989.4 TFLOP/s bf16')."""
    key = "bf16" if "bf16" in flops else next(iter(flops))
    return f"{resource(f'peak_flops.{key}').text(flops[key])} {key}"


def attention_note(accelerator, fused: bool) -> str | None:
    """The line an estimate or search prints where the accelerator lists no fused attention kernel rate
    (``attention_efficiency``), saying how its attention was costed: unfused (``fused`` False: no point runs
    flash attention, the default a search takes there; the s x s scores written and read), or as a fused
    kernel at the GEMM efficiency (``matmul_efficiency``), an assumption (cost/microbatch_pass.py). None where the
    accelerator lists a rate."""
    if accelerator.attention_efficiency:
        return None
    if fused:
        return (f"no fused attention rate for {accelerator.name}: fused attention costed at the GEMM efficiency, "
                f"an assumption (docs/hardware.md, \"Attention outside Hopper\")")
    return (f"no fused attention rate for {accelerator.name}: attention costed unfused "
            f"(docs/hardware.md, \"Attention outside Hopper\")")


def render_search(model: str, cluster: str, devices: int, global_batch: int, result, seconds: float, top: int,
                  basis: str = "rent", notes: tuple = (), family=None) -> str:
    """Counts, infeasible reasons and the top-k table of an exhaustive search; the cost column on the cluster's
    cost ``basis``, named in its header; each of ``notes`` on a line of its own under the counts; ``family``:
    the model's workload family (its rules, the knobs its tables show and its unit; default the transformer)."""
    from comet_dse.workload.families import DEFAULT

    family = family or DEFAULT
    cols = result.columns
    lines = [f"{model} on {devices} x {cluster}, global batch {global_batch}: {result.evaluated:,} strategies "
             f"evaluated in {seconds:.2f} s, {result.feasible:,} feasible", *notes]
    if result.infeasible_by_rule:
        lines.append("Infeasible, by rule (a strategy can break several):")
        for code in family.rules:
            if code in result.infeasible_by_rule:
                lines.append(f"  {family.rule_text[code]:70s} {result.infeasible_by_rule[code]:>10,}")
    if not result.feasible:
        lines.append("No strategy is feasible.")
        return printable("\n".join(lines))
    shown = _search_columns(cols, family.table_knobs)
    budget = "time_to_train_s" in cols
    rows = []
    for rank, i in enumerate(result.ranked[:top], start=1):
        rows.append([rank] + [_cell(k, cols[k.name][i]) for k in shown]
                    + [format_time(cols["step_time_s"][i]), f"{cols['tokens_per_second'][i]:,.0f}",
                       f"{cols['mfu'][i] * 100:.1f}%", format_bytes(cols["memory_per_device_bytes"][i])]
                    + ([_or_unknown(cols["time_to_train_s"][i], format_duration),
                        _or_unknown(cols["energy_j"][i], format_energy),
                        _or_unknown(cols["training_cost_usd"][i], format_usd)] if budget else []))
    lines += ["", f"Fastest {min(top, result.feasible)}"]
    headers = (["rank"] + [k.short for k in shown] + ["step time", f"{family.unit}/s", "MFU", "memory/device"]
               + [training_label("time_to_train_s"), training_label("energy_j"), _cost_header(basis)] * budget)
    left = tuple(i + 1 for i, k in enumerate(shown) if issubclass(k.kind, Choice) or k.kind is bool)
    lines.append(render_table(headers, rows, left=left))
    lines += ["", legend_line([(k.short, k.meaning) for k in shown])]
    return printable("\n".join(lines))


def _search_columns(cols: dict, always: tuple) -> list:
    """Knobs shown in a search table: the family's ``always`` (its ``table_knobs``), and every other knob that
    varies."""
    return [k for k in KNOBS if k.search != GIVEN and (k.name in always or len(np.unique(cols[k.name])) > 1)]


def _cell(knob, value) -> str:
    """One strategy cell of a search table: numbers as they are, switches on/off, choices by name."""
    if knob.kind is bool:
        return "on" if value else "off"
    return str(knob.decode(value))


def render_sweep(ranking: dict, seconds: float, baseline_named: bool = True) -> str:
    """Best strategy per cluster variant with the speedup over the baseline (said to be the first variant when
    the study names no ``baseline:``), then the Pareto fronts."""
    chosen = "" if baseline_named else " (the study names no baseline: every axis at its first value)"
    lines = [f"{ranking['study']}: {ranking['points']:,} design points in {ranking['chunks']} chunks, "
             f"{seconds:.1f} s ({ranking['points'] / max(seconds, 1e-9):,.0f} points/s)"
             + (f", {ranking['skipped']} chunks resumed" if ranking["skipped"] else ""),
             f"baseline: {ranking['baseline']}{chosen}", ""]
    budget = ranking.get("token_budget")
    basis = ranking.get("cost_basis", "rent")
    rows = []
    for g in ranking["variants"]:
        best = g["best"]
        rows.append([g["model"], g["devices"], g["label"], f"{g['feasible']:,}/{g['points']:,}",
                     format_time(best["step_time_s"]) if best else "-",
                     f"{best['mfu'] * 100:.1f}%" if best else "-",
                     compact_text(best) if best else "no feasible strategy",
                     f"{g['speedup']:.2f}x" if g["speedup"] else "-"]
                    + ([_known(best, "time_to_train_s", format_duration), _known(best, "energy_j", format_energy),
                        _known(best, "training_cost_usd", format_usd)] if budget else []))
    extra = [training_label("time_to_train_s"), training_label("energy_j"), _cost_header(basis)] if budget else []
    lines.append(render_table(["model", "devices", "cluster variant", "feasible", "best step", "MFU", "best strategy",
                               "speedup"] + extra, rows, left=(0, 2, 6)))
    if budget:
        unknown = any("unknown" in row[-3:] for row in rows)
        lines.append(f"Training on {format_count(budget)} tokens, goodput included; cost {basis}ing for every variant "
                     f"(the baseline's basis)"
                     + (f"; unknown: no {basis} figure, price or power (docs/economics.md)" if unknown else ""))
    lines += _legend([r[6] for r in rows])
    for f in FRONTS:
        column, shown = f.column_for(budget), _FRONT_SHOWN[f.key]
        front = (ranking.get(f.key) or []) if column else []
        if front:
            label = _cost_header(basis) if f.key == "pareto_training_cost" else f.label
            lines += ["", f"Pareto front, {'time to train' if budget else 'step time'} vs {label}:"]
            lines.append(render_table(["model", "devices", "cluster variant", label, "time"],
                                      [[p["model"], p["devices"], p["label"], shown(p[column]),
                                        format_duration(p["time_s"]) if budget else format_time(p["time_s"])]
                                       for p in front], left=(0, 2)))
    return printable("\n".join(lines))


# How a value of each Pareto front's column is shown (the fronts, their labels and columns: vocabulary.FRONTS).
_FRONT_SHOWN = {"pareto_cost": format_usd, "pareto_power": lambda w: f"{w / 1e3:,.0f} kW",
                "pareto_training_cost": format_usd, "pareto_energy": format_energy}


def _cost_header(basis: str) -> str:
    """The header of a cost column: its label and the one basis of the table ('cost (renting)')."""
    return f"{training_label('training_cost_usd')} ({basis}ing)"


def _known(best, key: str, shown) -> str:
    """A training figure of a variant's best row, shown, or 'unknown' (no price or power figure) / '-'."""
    return or_unknown(best.get(key), shown) if best else "-"


def render_network(cluster) -> str:
    """A cluster's network dimensions, innermost first: name(size, topology, bandwidth per device per
    direction, in the vocabulary's unit, as whatif and the explorer show it)."""
    return " x ".join(f"{d.name}({d.size or 'n'}, {d.topology.value}, "
                      f"{resource(f'network.{d.name}.bandwidth').text(d.bandwidth)})" for d in cluster.network)
