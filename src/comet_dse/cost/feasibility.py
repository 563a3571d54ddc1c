"""Validity rules of a design point, as boolean arrays with a reason each.

An invalid or non-fitting point is a result with every reason listed, not an
exception. ``violations`` returns, for each rule, the mask of points that
break it and a function that writes the reason for one point.
"""
from __future__ import annotations

import numpy as np

from comet_dse.base.units import format_bytes
from comet_dse.cost.pipeline import embedding_slots
from comet_dse.cost.shapes import attention_efficiencies
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import ModelParallel
from comet_dse.strategy.declared import KNOB


# The rule codes, in the bit order of a result table's infeasible_mask (design_space/table.py), and what each means.
RULES = ("devices", "tp_heads", "tp_kv_heads", "tp_ffn", "batch", "pp_layers", "interleave",
         "interleave_batch", "sp_seq", "ep_experts", "cp_seq", "attention_kernel", "dtype", "memory", "pure_mp",
         "step_time")
RULE_TEXT = {
    "devices": "tp*pp*dp differs from the device count",
    "tp_heads": "tp does not divide the attention heads (the query columns with a column split)",
    "tp_kv_heads": "tp and the KV heads do not divide one another",
    "tp_ffn": "tp does not divide the FFN size",
    "batch": "dp*micro_batch does not divide the global batch",
    "pp_layers": "more pipeline stages than layers",
    "interleave": "interleaving needs pp > 1 and pp*interleave dividing the layers",
    "interleave_batch": "interleaving needs the micro-batches per pipeline to be a multiple of pp",
    "sp_seq": "sequence parallelism needs tp to divide the tokens per device",
    "ep_experts": "ep must divide the experts and dp (and needs a MoE model)",
    "cp_seq": "cp does not divide the sequence length",
    "attention_kernel": "the device has no rate for the attention kernel",
    "dtype": "the device has no rate for the dtype",
    "memory": "does not fit in device memory",
    "pure_mp": "pure model parallelism has no pipeline (pp must be 1)",
    "step_time": "the step time is not a positive finite number",
}


def _divides(a, b):
    """True where a divides b (element-wise; a and b hold whole numbers, b may be fractional)."""
    q = np.asarray(b, dtype=float) / np.asarray(a, dtype=float)
    return q == np.floor(q)


def _only_where(condition, broken):
    """``condition & broken()``, with ``broken`` (a function: the rule's own test) not evaluated where no point
    meets ``condition`` (then no point breaks the rule: all False)."""
    if not np.any(condition):
        return np.zeros(np.shape(condition), dtype=bool)
    return condition & broken()


def violations(model: Transformer, cluster: Cluster, devices: int, st: StrategyArrays, step) -> list:
    """[(code, mask, reason(i) -> str)] for every rule; mask is True where the point breaks it."""
    t, p, d, v, b, B = st.tp, st.pp, st.dp, st.interleave, st.micro_batch, st.global_batch
    a, k, L, s = model.attention.heads, model.attention.kv_heads, model.layers, model.seq_len
    pure = st.uses(ModelParallel.PURE_MP)
    columns = pure & model.attention.column_split    # COMET's column split: a share of a head per rank
    q_cols, kv_cols = a * model.attention.qk_dim, k * model.attention.qk_dim
    hbm = cluster.accelerator.state_capacity
    exp = cluster.accelerator.expansion
    has_rate = np.isfinite(st.dtype_table(cluster.accelerator.peak_flops))
    kernel_rate = attention_efficiencies(cluster, st)[0]
    cp, ep = st.cp, st.ep
    slots = L + 2.0 * embedding_slots(st)      # layer slots of the pipeline split (cost/pipeline.py)
    experts = model.moe.experts if model.moe else 1
    rules = [
        ("devices", t * cp * p * d != devices,
         lambda i: (f"tp*cp*pp*dp = {t[i]:.0f}*{cp[i]:.0f}*{p[i]:.0f}*{d[i]:.0f} = {t[i] * cp[i] * p[i] * d[i]:.0f}, "
                    f"but the cluster has {devices} devices") if cp[i] > 1 else
         f"tp*pp*dp = {t[i]:.0f}*{p[i]:.0f}*{d[i]:.0f} = {t[i] * p[i] * d[i]:.0f}, but the cluster has {devices} devices"),
        ("tp_heads", np.where(columns, ~_divides(t, q_cols), ~_divides(t, a)) if np.any(columns) else ~_divides(t, a),
         lambda i: (f"tp={t[i]:.0f} does not divide the {q_cols} query columns (column split)" if columns[i]
                    else f"tp={t[i]:.0f} does not divide the {a} attention heads")),
        ("tp_kv_heads", _only_where(np.full(np.shape(t), k != a), lambda: np.where(
            columns, ~_divides(t, kv_cols), ~(_divides(t, k) | _divides(k, t)))),
         lambda i: (f"tp={t[i]:.0f} does not divide the {kv_cols} key and value columns (column split)" if columns[i]
                    else f"tp={t[i]:.0f} and the {k} KV heads do not divide one another")),
        ("tp_ffn", ~_divides(t, model.mlp.ffn),
         lambda i: f"tp={t[i]:.0f} does not divide the FFN size {model.mlp.ffn}"),
        ("batch", ~_divides(d * b, B),
         lambda i: f"global batch {B[i]:.0f} is not a multiple of dp*micro_batch = {d[i] * b[i]:.0f}"),
        ("pp_layers", p > slots,
         lambda i: f"pp={p[i]:.0f} exceeds the {slots[i]:.0f} layer slots ({L} layers"
                   + (" + embedding + loss)" if slots[i] > L else ")")),
        ("interleave", (v > 1) & ((p == 1) | (p * v > slots)),
         lambda i: f"interleave={v[i]:.0f} needs pp > 1 and at least one layer slot per virtual stage "
                   f"(pp*interleave={p[i] * v[i]:.0f} > {slots[i]:.0f} slots: {L} layers"
                   + (" + embedding + loss)" if slots[i] > L else ")")),
        ("interleave_batch", (v > 1) & ~_divides(p, np.floor(B / np.maximum(d * b, 1))),
         lambda i: f"interleaved 1F1B needs micro-batches per pipeline ({B[i] / (d[i] * b[i]):.0f}) to be a multiple of pp={p[i]:.0f}"),
        ("sp_seq", st.sequence_parallel & ~_divides(t, s / cp),
         lambda i: f"sequence parallelism needs tp={t[i]:.0f} to divide the {s / cp[i]:g} tokens per device"),
        ("ep_experts", _only_where(ep > 1, lambda: ~_divides(ep, experts) | ~_divides(ep, d) | (model.moe is None)),
         lambda i: (f"ep={ep[i]:.0f} needs a mixture-of-experts model" if model.moe is None else
                    f"ep={ep[i]:.0f} must divide the {experts} experts and dp={d[i]:.0f}")),
        ("cp_seq", ~_divides(cp, s),
         lambda i: f"cp={cp[i]:.0f} does not divide the sequence length {s}"),
        ("attention_kernel", KNOB["attention_kernel"].applies(st) & ~np.isfinite(kernel_rate),
         lambda i: f"{cluster.accelerator.name} has no rate for the {KNOB['attention_kernel'].decode(st.attention_kernel[i]).value} "
                   f"attention kernel; it has {', '.join(sorted(cluster.accelerator.attention_efficiency))}"),
        ("dtype", ~has_rate,
         lambda i: f"{cluster.accelerator.name} has no {KNOB['dtype'].decode(st.dtype[i]).value} rate"),
        ("memory", ~step.fits,
         lambda i: _memory_reason(step, i, hbm, exp, cluster.accelerator.state_tiers, cluster.accelerator.host)),
        ("pure_mp", pure & (p > 1),
         lambda i: f"pure model parallelism (COMET) has no pipeline: pp={p[i]:.0f} must be 1"),
        # never report a wrong answer as feasible: a step time the inputs' bounds should have made finite
        ("step_time", ~(np.isfinite(step.step_time) & (step.step_time > 0)),
         lambda i: f"the step time ({step.step_time[i]!r} s) is not a positive finite number: a rate or an "
                   "efficiency lies outside its plausible range"),
    ]
    return rules


def _memory_reason(step, i, hbm, expansion, tiers: str = "HBM", host=None) -> str:
    """Why point ``i`` does not fit; ``hbm``: the bytes that hold state on the device (``tiers``: which memories);
    ``host``: the host memory tier offloaded activations wait in (activation_offload)."""
    need = step.memory_total[i]
    on_host = step.host_bytes[i] if step.host_bytes is not None else 0.0
    if on_host > (host.capacity if host else 0.0):
        if host is None:
            return (f"offloads {format_bytes(on_host)} of activations per device to host memory, which this "
                    "accelerator does not list (memory.host)")
        return (f"offloads {format_bytes(on_host)} of activations per device to host memory, which holds "
                f"{format_bytes(host.capacity)} per device")
    parts = ", ".join(f"{name} {format_bytes(val[i])}" for name, val in step.memory.items() if val[i] > 0)
    verb = "hold" if " and " in tiers else "holds"
    if expansion is None:
        return f"needs {format_bytes(need)} per device ({parts}), {tiers} {verb} {format_bytes(hbm)}"
    return (f"needs {format_bytes(need)} per device ({parts}), {tiers} {verb} {format_bytes(hbm)} "
            f"and the {expansion.name} tier {format_bytes(expansion.capacity)}")


def feasible_mask(rules: list):
    """True where no rule is broken."""
    bad = np.zeros_like(rules[0][1], dtype=bool)
    for _, mask, _ in rules:
        bad = bad | mask
    return ~bad


def reasons_for(rules: list, i: int) -> list:
    """Every reason point ``i`` is infeasible (empty when feasible)."""
    return [reason(i) for _, mask, reason in rules if mask[i]]
