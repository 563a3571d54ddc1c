"""`comet-dse calibrate`: fit named physical parameters of a cluster to measured runs.

A runs file is a CSV, one measured run per row (docs/calibration.md):
``model`` (a preset name, or a model YAML / Hugging Face config.json path
relative to the CSV) or the architecture columns of the validation files
(``model_style`` gpt or llama, ``layers``, ``hidden``, ``heads``, ``ffn``,
``vocab``, ``seq_len``, ...); ``gpus``; any strategy knob as a column named
like the knob (``tp``, ``pp``, ``recompute``, ``zero``, ...);
``metric`` (``iter_s``, ``tokens_per_s`` or ``mfu``) and ``measured``.

The fit moves named parameters of the cluster (``PARAMETERS``), each inside
physical bounds, to minimise the squared relative error of the predicted step
times (scipy.optimize.least_squares, trust-region reflective). Parameters the
runs cannot move (sensitivity below ``MIN_SENSITIVITY``) stay at the preset's
value and are named. Every run is also predicted by a fit that did not see it:
leave-one-out up to MAX_LEAVE_ONE_OUT runs, CV_FOLDS-fold cross-validation
past that. The batched cost model evaluates all the runs of one model and device
count at every parameter vector a Jacobian needs in one call (``RunSet``), so a
fit costs a few calls per iteration whatever the number of runs, and 2,000 runs
are fitted and cross-validated in about 20 s (benchmarks/bench_calibrate.py).
"""
from __future__ import annotations

import csv
import dataclasses as dc
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from comet_dse.base.bounds import BOUNDS, shown
from comet_dse.base.errors import InputError
from comet_dse.workload.families import transformer_only
from comet_dse.base.fingerprint import fingerprint
from comet_dse.base.loading import read_text_file
from comet_dse.base.written import sha256_hex
from comet_dse.hardware.load import FINGERPRINT
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import KNOB, Strategy, knob_values

METRICS = ("iter_s", "tokens_per_s", "mfu")
MIN_SENSITIVITY = 1e-3     # RMS change of the relative errors when a parameter crosses 10 % of its range
RUNS_PER_PARAMETER = 3
STEP = 1e-4                # finite-difference step, as a fraction of a parameter's range
CV_FOLDS = 10              # k of k-fold cross-validation, past MAX_LEAVE_ONE_OUT runs
MAX_LEAVE_ONE_OUT = 30     # up to this many runs, each run is predicted by a fit on all the others


@dataclass(frozen=True)
class Run:
    """One measured run: what ran, and its measured step time [s]."""

    label: str
    model: Transformer
    devices: int
    strategy: Strategy
    metric: str
    measured: float


@dataclass(frozen=True)
class Parameter:
    """A fittable physical parameter: name, bounds (SI units), unit text and meaning."""

    name: str
    low: float
    high: float
    unit: str
    meaning: str

    def get(self, cluster: Cluster) -> float:
        return float(_get(cluster, self.name))

    def put(self, cluster: Cluster, value) -> Cluster:
        """The cluster with this parameter at ``value`` (a number or an array over evaluation points)."""
        return _put(cluster, self.name, value)


def parameters(cluster: Cluster) -> dict:
    """name -> Parameter for ``cluster``: its compute, memory and overhead parameters and, per network
    dimension, ``network.<dim>.efficiency`` and ``network.<dim>.latency``."""
    out = {
        "gemm": Parameter("gemm", 0.2, 1.0, "fraction", "16-bit GEMM main-loop efficiency (matmul_efficiency)"),
        "gemm_fp8": Parameter("gemm_fp8", 0.2, 1.0, "fraction", "fp8 GEMM main-loop efficiency"),
        "memory": Parameter("memory", 0.2, 1.0, "fraction", "achievable fraction of HBM bandwidth"),
        "sustained": Parameter("sustained", 0.3, 1.0, "fraction",
                               "sustained fraction of the benchmark tensor rates, every dtype (tensor_sustained)"),
        "attention": Parameter("attention", 0.25, _attention_ceiling(cluster), "x",
                               "multiplier on the fused attention kernels' efficiencies"),
        "kernel_overhead": Parameter("kernel_overhead", 0.0, 50e-6, "s", "fixed cost per kernel launch"),
        "step_overhead": Parameter("step_overhead", 0.0, 60.0, "s", "fixed framework cost per step"),
        "microbatch_overhead": Parameter("microbatch_overhead", 0.0, 1.0, "s", "fixed framework cost per micro-batch"),
    }
    for dim in cluster.network:
        out[f"network.{dim.name}.efficiency"] = Parameter(
            f"network.{dim.name}.efficiency", 0.05, 1.0, "fraction", f"fraction of {dim.name} link bandwidth reached")
        out[f"network.{dim.name}.latency"] = Parameter(
            f"network.{dim.name}.latency", 0.0, 100e-6, "s", f"latency per {dim.name} message step")
    return out


def default_fit(cluster: Cluster) -> list:
    """GEMM and memory efficiency, the outermost network dimension's efficiency, a per-micro-batch overhead."""
    return ["gemm", "memory", f"network.{cluster.network[-1].name}.efficiency", "microbatch_overhead"]


def _attention_ceiling(cluster: Cluster) -> float:
    rates = cluster.accelerator.attention_efficiency
    top = max((max(r) for r in rates.values()), default=cluster.accelerator.matmul_efficiency)
    return max(1.0 / top, 0.26)


def _get(cluster: Cluster, name: str):
    acc = cluster.accelerator
    if name == "gemm":
        return acc.matmul_efficiency
    if name == "gemm_fp8":
        return acc.matmul_efficiencies().get("fp8", acc.matmul_efficiency)
    if name == "memory":
        return acc.hbm.efficiency
    if name == "sustained":
        return acc.physical_sustained("bf16")
    if name == "attention":
        return 1.0
    if name == "kernel_overhead":
        return acc.kernel_overhead
    if name in ("step_overhead", "microbatch_overhead"):
        return getattr(cluster, name)
    _, dim_name, attr = name.split(".")
    return getattr(next(d for d in cluster.network if d.name == dim_name), attr)


def _put(cluster: Cluster, name: str, value) -> Cluster:
    acc = cluster.accelerator
    if name == "gemm":
        by_dtype = {k: (value if k in ("bf16", "fp16") else v) for k, v in acc.matmul_efficiency_by_dtype.items()}
        return dc.replace(cluster, accelerator=dc.replace(acc, matmul_efficiency=value,
                                                          matmul_efficiency_by_dtype=by_dtype))
    if name == "gemm_fp8":
        by_dtype = {**acc.matmul_efficiency_by_dtype, "fp8": value}
        return dc.replace(cluster, accelerator=dc.replace(acc, matmul_efficiency_by_dtype=by_dtype))
    if name == "memory":
        return dc.replace(cluster, accelerator=dc.replace(acc, hbm=dc.replace(acc.hbm, efficiency=value)))
    if name == "sustained":         # the fitted fraction replaces any training efficiency the cluster carried
        return dc.replace(cluster, accelerator=dc.replace(acc, tensor_sustained={d: value for d in acc.peak_flops},
                                                          training_efficiency={}), efficiency_setting="physical")
    if name == "attention":
        from comet_dse.strategy.choices import AttentionKernel

        rates = acc.attention_efficiency or {k.value: (acc.matmul_efficiency,) * 2 for k in AttentionKernel}
        scaled = {k: (f * value, b * value) for k, (f, b) in rates.items()}
        return dc.replace(cluster, accelerator=dc.replace(acc, attention_efficiency=scaled))
    if name == "kernel_overhead":
        return dc.replace(cluster, accelerator=dc.replace(acc, kernel_overhead=value))
    if name in ("step_overhead", "microbatch_overhead"):
        return dc.replace(cluster, **{name: value})
    _, dim_name, attr = name.split(".")
    network = tuple(dc.replace(d, **{attr: value}) if d.name == dim_name else d for d in cluster.network)
    return dc.replace(cluster, network=network)


# --- reading runs -------------------------------------------------------------------------


def read_runs(path: Path) -> list:
    """The runs of a CSV file; every error names the row and column."""
    from comet_dse.presets.catalog import load_model

    path = Path(path)
    text = read_text_file(path, "runs")
    reader = csv.DictReader(io.StringIO(text))
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise InputError("runs", f"{path} is not a valid CSV file: {exc}") from None
    if not rows:
        raise InputError("runs", f"{path} holds no runs (a header line and one row per run)")
    header = list(reader.fieldnames)
    for column in ("gpus", "metric", "measured"):
        if column not in header:
            raise InputError(f"runs.{column}", f"is missing from {path}; columns: {', '.join(header)}")
    if "model" not in header and "model_style" not in header:
        raise InputError("runs.model", "is missing: give a `model` column (preset or file) or `model_style` "
                         "with the architecture columns of the validation files")
    unknown = sorted(set(header) - set(KNOB) - _OTHER_COLUMNS)
    if unknown:
        raise InputError(f"runs.{unknown[0]}", f"unknown column; known: model or model_style and the architecture "
                         f"columns, gpus, metric, measured, id, and the strategy knobs ({', '.join(KNOB)})")
    runs, lines = [], {}
    for i, row in enumerate(rows, start=2):
        where = f"runs line {i}"
        _check_fields(row, len(header), where)
        label = row.get("id") or row.get("label") or f"line {i}"
        if label in lines:        # --holdout names runs by id: a repeated id held out both runs
            raise InputError(f"{where}: id", f"{shown(label)} is the id of line {lines[label]} too; give each run "
                             "its own id")
        lines[label] = i
        try:
            runs.append(_run(row, label, path.parent, load_model))
        except InputError as exc:
            raise InputError(f"{where}: {exc.field}", exc.message) from None
    return runs


def _check_fields(row: dict, columns: int, where: str) -> None:
    """A row with as many fields as the header: csv.DictReader fills a short row with None and keeps the
    fields of a long one under the key None (a short row was a TypeError traceback)."""
    if None in row:
        raise InputError(where, f"has {columns + len(row[None])} fields, the header {columns}; "
                         "quote a field that holds a comma")
    missing = [name for name, value in row.items() if value is None]
    if missing:
        raise InputError(where, f"has {columns - len(missing)} fields, the header {columns} "
                         f"(no {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")


_ARCHITECTURE = {"model_style", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "dropout"}
_COUNTS = {"gpt": ("layers", "hidden", "heads", "ffn", "vocab", "seq_len"),
           "llama": ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len")}
_OTHER_COLUMNS = _ARCHITECTURE | {"model", "gpus", "metric", "measured", "id", "label", "source", "note", "params_b"}


def _run(row: dict, label: str, folder: Path, load_model) -> Run:
    from comet_dse.answers.validation import _gpt, _llama

    if row.get("model"):
        ref = row["model"]
        local = folder / ref
        model = load_model(str(local) if local.suffix in (".json", ".yaml", ".yml") else ref)
        transformer_only(model, "calibrate")
        if row.get("seq_len"):
            model = model.with_seq_len(_integer(row["seq_len"], "seq_len", "seq_len"))
    else:
        style = row.get("model_style")
        if style not in _COUNTS:
            raise InputError("model_style", f"must be gpt or llama, got {shown(style)}")
        optional = ("kv_heads",) if style == "gpt" and row.get("kv_heads") else ()
        for name in _COUNTS[style] + optional:           # checked before they divide one another
            _integer(row.get(name), name, "seq_len" if name == "seq_len" else "integer")
        model = (_gpt if style == "gpt" else _llama)(row, label)
    devices = _integer(row["gpus"], "gpus", "devices")
    knobs = knob_values(row)
    inner = knobs.get("tp", 1) * knobs.get("cp", 1) * knobs.get("pp", 1)
    knobs.setdefault("dp", max(devices // inner, 1))
    if "global_batch" not in knobs:
        raise InputError("global_batch", "is missing (sequences per iteration)")
    strategy = Strategy(**knobs)
    if strategy.devices != devices:
        raise InputError("gpus", f"{devices} differs from tp*cp*pp*dp = {strategy.devices}")
    metric = row["metric"]
    if metric not in METRICS:
        raise InputError("metric", f"must be one of {', '.join(METRICS)}, got {shown(metric)}")
    measured = _measured(row["measured"], metric, strategy.global_batch * model.seq_len)
    return Run(label=label, model=model, devices=devices, strategy=strategy, metric=metric, measured=measured)


def _measured(text: str, metric: str, tokens: int) -> float:
    """The measured value, checked against bounds.BOUNDS as the step time it stands for: iter_s itself,
    tokens/s as the tokens of a step over it; an MFU in the ``mfu`` row (its step time needs the model's
    FLOP count). ``measured=1e-300`` was a traceback from the fit."""
    row = BOUNDS["mfu" if metric == "mfu" else "measured_time"]
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise InputError("measured", f"must be a positive number, got {shown(text)}")
    as_time = tokens / value if metric == "tokens_per_s" else value
    if not row.low <= as_time <= row.high:
        what = {"iter_s": "a step time", "tokens_per_s": f"a step of {tokens:,} tokens at {value:g} tokens/s takes "
                f"{as_time:g} s; a step time", "mfu": "an MFU"}[metric]
        raise InputError("measured", f"must be a positive number: {what} in [{row.low:g}, {row.high:g}]"
                         f"{' s' if metric != 'mfu' else ''}, got {shown(text)}")
    return value


def _integer(text, name: str, bound: str) -> int:
    """A count column: an integer in the row ``bound`` of bounds.BOUNDS."""
    row = BOUNDS[bound]
    try:
        value = int(str(text).strip())
    except ValueError:                      # not a number, or more than 4,300 digits
        raise InputError(name, f"must be {row.integer_text()}, got {shown(text)}") from None
    return row.check_integer(name, value)


# --- evaluating runs at many parameter vectors ----------------------------------------------


class RunSet:
    """Runs prepared for evaluation at many parameter vectors: grouped by model and device count, each
    group's strategies stacked into arrays once.

    ``errors`` evaluates every run at every parameter vector with one call of the batched cost model per
    group: the group's runs, each repeated once per vector, with the fitted parameters as arrays over
    those points (``distinct.ungrouped``: points that differ only in the cluster are never merged). A fit's
    cost is then a few calls per iteration, whatever the number of runs (it was one call per run, and
    leave-one-out made calibration quadratic in the runs).
    """

    def __init__(self, runs: list, cluster: Cluster):
        self.runs, self.cluster = list(runs), cluster
        keys = {}
        for i, run in enumerate(self.runs):        # a model read from a row is named after its run: not a key
            keys.setdefault((dc.replace(run.model, name="", source=""), run.devices), []).append(i)
        self.groups = [(self.runs[rows[0]].model, devices, np.array(rows),
                        StrategyArrays.of([self.runs[i].strategy for i in rows]))
                       for (_, devices), rows in keys.items()]
        self.measured = np.array([measured_time(r, cluster) for r in self.runs])     # [s] per run

    def __len__(self) -> int:
        return len(self.runs)

    def subset(self, rows) -> "RunSet":
        return RunSet([self.runs[i] for i in rows], self.cluster)

    def errors(self, fitted: list, values: np.ndarray) -> np.ndarray:
        """Relative error of the predicted step time of every run at each row of ``values`` (K x P): N x K."""
        from comet_dse.cost.distinct import ungrouped
        from comet_dse.workload.families import family_of

        values = np.atleast_2d(np.asarray(values, dtype=float))
        k = len(values)
        out = np.empty((len(self.runs), k))
        for model, devices, rows, st in self.groups:
            variant = self.cluster
            for j, param in enumerate(fitted):
                variant = param.put(variant, np.tile(values[:, j], len(rows)))      # point = run x vector
            points = st.take(np.repeat(np.arange(len(rows)), k))
            with ungrouped(), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                step = family_of(model).evaluate(model, variant, devices, points)
            predicted = np.asarray(step.step_time, dtype=float).reshape(len(rows), k)
            out[rows] = predicted / self.measured[rows][:, None] - 1.0
        return out


def measured_time(run: Run, cluster: Cluster) -> float:
    """The step time a run's measurement stands for [s]: iter_s as it is; tokens/s as global batch x sequence
    / tokens/s; an MFU as model FLOPs / (devices x peak(dtype) x MFU), with the FLOPs counted as published
    MFU figures count them (every score: cost.step.model_flops(..., causal=False)), as ``comet-dse validate``
    converts its MFU rows. None of these depends on a fitted parameter."""
    from comet_dse.cost.flops import step_time_of_mfu

    if run.metric == "iter_s":
        return run.measured
    if run.metric == "tokens_per_s":
        return run.strategy.global_batch * run.model.seq_len / run.measured
    return step_time_of_mfu(run.model, run.strategy.global_batch, run.devices,
                            cluster.accelerator.flops(run.strategy.dtype.value), run.measured)


def step_errors(run: Run, cluster: Cluster, fitted: list, values: np.ndarray) -> np.ndarray:
    """Relative error of the predicted step time of ``run`` at each row of ``values`` (K x P) [-].

    The cluster takes each fitted parameter as an array over the K points, and
    the strategy is repeated K times: one call of the batched cost model.
    Measured tokens/s and MFU are turned into step times (``measured_time``).
    """
    return RunSet([run], cluster).errors(fitted, values)[0]


# --- the fit ---------------------------------------------------------------------------------


@dataclass
class Fit:
    """Fitted values (SI), their 1-sigma uncertainty, and the errors before and after."""

    names: list
    values: np.ndarray
    sigma: np.ndarray
    before: np.ndarray        # per run, relative error with the preset
    after: np.ndarray         # per run, relative error with the fitted values
    unidentifiable: list      # parameters left at the preset's value (too little sensitivity)
    sensitivity: dict         # name -> RMS change of the errors over 10 % of its range


def fit(runs, cluster: Cluster, names: list, start: np.ndarray | None = None) -> Fit:
    """Least-squares fit of ``names`` on ``runs`` (a list of Run or a RunSet; relative step-time errors),
    inside each parameter's bounds."""
    from scipy.optimize import least_squares

    runs = runs if isinstance(runs, RunSet) else RunSet(runs, cluster)
    catalogue = parameters(cluster)
    params = [catalogue[n] for n in names]
    low = np.array([p.low for p in params])
    span = np.array([p.high - p.low for p in params])
    preset = np.clip(np.array([p.get(cluster) for p in params]), low, low + span)
    before = runs.errors(params, preset[None, :])[:, 0]
    sensitivity = _sensitivity(runs, params, preset, span)
    keep = [i for i, p in enumerate(params) if sensitivity[p.name] >= MIN_SENSITIVITY]
    names_kept = [params[i].name for i in keep]
    x = preset.copy()
    sigma = np.full(len(params), np.nan)
    if keep:
        k_params = [params[i] for i in keep]
        k_low, k_span = low[keep], span[keep]
        u0 = ((start[keep] if start is not None else preset[keep]) - k_low) / k_span

        def residuals_and_jacobian(u):
            return _residuals_jacobian(runs, k_params, k_low + np.clip(u, 0, 1) * k_span, k_span)

        cache = {}

        def fun(u):
            key = u.tobytes()
            if key not in cache:
                cache.clear()
                cache[key] = residuals_and_jacobian(u)
            return cache[key][0]

        def jac(u):
            fun(u)
            return cache[u.tobytes()][1]

        result = least_squares(fun, np.clip(u0, 0, 1), jac=jac, bounds=(0.0, 1.0), method="trf", xtol=1e-10,
                               ftol=1e-12, gtol=1e-12, max_nfev=200)
        x[keep] = k_low + result.x * k_span
        sigma[keep] = _uncertainty(result.fun, result.jac) * k_span
    after = runs.errors(params, x[None, :])[:, 0]
    unidentifiable = [p.name for p in params if p.name not in names_kept]
    return Fit(names=list(names), values=x, sigma=sigma, before=before, after=after,
               unidentifiable=unidentifiable, sensitivity=sensitivity)


def _residuals_jacobian(runs: RunSet, params, x, span):
    """Relative errors at ``x`` and their forward-difference Jacobian in range-normalised coordinates."""
    n = len(params)
    points = np.repeat(x[None, :], n + 1, axis=0)
    steps = STEP * span * np.where(x + STEP * span <= np.array([p.high for p in params]), 1.0, -1.0)
    points[1:][np.arange(n), np.arange(n)] += steps
    errors = runs.errors(params, points)                                          # runs x (n + 1)
    jac = (errors[:, 1:] - errors[:, :1]) / (steps / span)[None, :]
    return errors[:, 0], jac


def _sensitivity(runs: RunSet, params, x, span) -> dict:
    """name -> RMS over the runs of the change in relative error when the parameter moves by 10 % of its range."""
    _, jac = _residuals_jacobian(runs, params, x, span)
    return {p.name: float(np.sqrt(np.mean((0.1 * jac[:, j]) ** 2))) for j, p in enumerate(params)}


def _uncertainty(residuals, jac) -> np.ndarray:
    """1-sigma of each fitted coordinate: sqrt(diag((J^T J)^-1) * SSR / (n - p)) (NaN when n <= p)."""
    n, p = jac.shape
    if n <= p:
        return np.full(p, np.nan)
    scale = float(residuals @ residuals) / (n - p)
    cov = np.linalg.pinv(jac.T @ jac) * scale
    return np.sqrt(np.maximum(np.diag(cov), 0.0))


def check_runnable(run: Run, cluster: Cluster) -> bool:
    """Refuse a run the model says cannot run as written on ``cluster``: a broken validity rule other than
    memory (a global batch the data-parallel replicas and micro-batches do not divide, more stages than
    layers...). Its step time would be a number for a strategy nobody ran. A run judged not to fit in memory is
    kept: it ran, so the model's memory verdict, not the run, is what is off (docs/validation.md,
    "Feasibility recall"). Returns whether the model judges it to fit."""
    from comet_dse.answers.estimate import estimate

    result = estimate(run.model, cluster, run.devices, run.strategy)
    broken = [(code, why) for code, why in zip(result.broken_rules, result.reasons) if code != "memory"]
    if broken:
        raise InputError(f"runs {run.label}", f"cannot run as written: {broken[0][1]}")
    return "memory" not in result.broken_rules


def check_support(runs: list, names: list) -> None:
    """Refuse to fit more parameters than the runs support (RUNS_PER_PARAMETER runs each)."""
    needed = RUNS_PER_PARAMETER * len(names)
    if len(runs) < needed:
        raise InputError("fit", f"{len(names)} parameters need at least {needed} runs ({RUNS_PER_PARAMETER} per "
                         f"parameter), the file has {len(runs)}; fit fewer with --fit "
                         f"(e.g. --fit {','.join(names[:max(1, len(runs) // RUNS_PER_PARAMETER)])})")


def cross_validation(runs: int) -> tuple:
    """(folds, its name) for ``runs`` runs: leave-one-out up to MAX_LEAVE_ONE_OUT runs, CV_FOLDS-fold
    cross-validation past it (a fit per fold, so the cost stays a few fits however many runs there are)."""
    if runs <= MAX_LEAVE_ONE_OUT:
        return runs, "leave-one-out"
    return CV_FOLDS, f"{CV_FOLDS}-fold cross-validation"


def cross_validate(runs: list, cluster: Cluster, names: list, full: Fit, progress: bool = False,
                   folds: int | None = None) -> np.ndarray:
    """Per run, its relative error predicted by a fit that did not see it: the runs are dealt into ``folds``
    folds (run i into fold i mod folds; default ``cross_validation``), and each fold is predicted by a fit
    on the others, started from the full fit."""
    folds = folds or cross_validation(len(runs))[0]
    catalogue = parameters(cluster)
    params = [catalogue[n] for n in names]
    everything = RunSet(runs, cluster)
    out = np.empty(len(runs))
    order = range(folds)
    if progress:
        from tqdm import tqdm

        name = "leave-one-out" if folds == len(runs) else f"{folds}-fold cross-validation"
        order = tqdm(order, desc=name, unit="fit", leave=False, disable=None)
    for fold in order:
        held = np.arange(fold, len(runs), folds)
        others = np.setdiff1d(np.arange(len(runs)), held)
        sub = fit(everything.subset(others), cluster, names, start=full.values)
        out[held] = everything.subset(held).errors(params, sub.values[None, :])[:, 0]
    return out


def leave_one_out(runs: list, cluster: Cluster, names: list, full: Fit, progress: bool = False) -> np.ndarray:
    """Per run, its relative error predicted by a fit on all the other runs (started from the full fit)."""
    return cross_validate(runs, cluster, names, full, progress, folds=len(runs))


def error_summary(errors: np.ndarray) -> dict:
    """{mean_abs_error, max_abs_error} of a fit's relative errors (fractions), as calibrate prints them and
    writes them into a calibrated file. The mean is numpy's (pairwise sums), which the figures of calibrated
    files have always used; stats.error_stats, which sums in order, can differ in the last bit."""
    return {"mean_abs_error": float(np.mean(np.abs(errors))), "max_abs_error": float(np.max(np.abs(errors)))}


# --- the calibrated cluster file --------------------------------------------------------------


def calibrated_data(base_data: dict, cluster: Cluster, result: Fit, runs_path: Path, loo: np.ndarray | None,
                    holdout: dict | None = None) -> dict:
    """The base cluster's mapping with the fitted values written in and a `calibration:` provenance block
    (``loo``: the cross-validated errors, by ``cross_validation``'s method for that many runs), sealed by its
    ``fingerprint`` over everything else in the file (hardware/load.py: calibration_mismatch)."""
    import copy

    data = copy.deepcopy(base_data)
    fitted = {}
    for name, value, sigma in zip(result.names, result.values, result.sigma):
        if name in result.unidentifiable:
            continue
        _write(data, cluster, name, float(value))
        fitted[name] = {"value": float(value), "sigma": None if np.isnan(sigma) else float(sigma),
                        "preset": float(_get(cluster, name)), "unit": parameters(cluster)[name].unit}
    data["name"] = f"{cluster.name}-calibrated"
    data["description"] = f"{cluster.description} (calibrated to {runs_path.name})".strip()
    data["calibration"] = {
        "base": cluster.name,
        "runs_file": runs_path.name,
        "runs_sha256": sha256_hex(runs_path),
        "runs": int(len(result.before)),
        "fitted": fitted,
        "left_at_preset": list(result.unidentifiable),
        "error_before": error_summary(result.before),
        "error_in_sample": error_summary(result.after),
        **({"cross_validation": cross_validation(len(loo))[1], "error_cross_validated": error_summary(loo)}
           if loo is not None else {}),
        **({"error_held_out": holdout} if holdout else {}),
    }
    data["calibration"]["fingerprint"] = fingerprint(data, (FINGERPRINT,))
    return data


def _write(data: dict, cluster: Cluster, name: str, value: float) -> None:
    acc = data["accelerator"]
    if name == "gemm":
        if isinstance(acc.get("matmul_efficiency"), dict):
            for key in ("bf16", "fp16"):
                if key in acc["matmul_efficiency"]:
                    acc["matmul_efficiency"][key] = round(value, 4)
        else:
            acc["matmul_efficiency"] = round(value, 4)
    elif name == "gemm_fp8":
        current = acc.get("matmul_efficiency")
        table = dict(current) if isinstance(current, dict) else {"bf16": current}
        table["fp8"] = round(value, 4)
        acc["matmul_efficiency"] = table
    elif name == "memory":
        acc["memory"]["hbm"]["efficiency"] = round(value, 4)
    elif name == "sustained":        # the fit stands in for the shipped training efficiency
        acc["tensor_sustained"] = round(value, 4)
        data["training_efficiency"] = "physical"
    elif name == "attention":
        rates = cluster.accelerator.attention_efficiency or {
            k: (cluster.accelerator.matmul_efficiency,) * 2 for k in ("fa2", "fa3", "cudnn")}
        acc["attention_efficiency"] = {k: {"forward": round(min(f * value, 1.0), 4),
                                           "backward": round(min(b * value, 1.0), 4)} for k, (f, b) in rates.items()}
    elif name == "kernel_overhead":
        acc["kernel_overhead"] = f"{value * 1e6:.4g} us"
    elif name in ("step_overhead", "microbatch_overhead"):
        data[name] = f"{value * 1e3:.6g} ms"
    else:
        _, dim_name, attr = name.split(".")
        dim = next(d for d in data["network"] if d["name"] == dim_name)
        dim[attr] = f"{value * 1e6:.4g} us" if attr == "latency" else round(value, 4)
