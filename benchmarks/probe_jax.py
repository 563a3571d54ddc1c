"""Probe: how fast would the batched model be compiled with XLA (JAX)? A measurement, not a product path.

Run:  pip install jax && python benchmarks/probe_jax.py [--points 250000]

The per-point part of ``cost.step.evaluate`` (everything after the micro-batch
and layout terms are grouped, plus the validity rules) is traced with
``jax.jit`` in float64 by pointing the ``np`` name of the cost modules at
jax.numpy for the length of the trace; the grouped terms are computed with
numpy first, as ``evaluate`` does, and gathered inside the compiled function.
The same cost code runs both ways; nothing is rewritten. Prints the
compile time, the rates of the numpy path (``evaluate_columns``) and of the
compiled path (grouping included) on one core, and the largest relative
difference between the two. The numpy path stays the tool's only path:
docs/design-space.md (Speed) says why.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import pkgutil
import sys
import time
from pathlib import Path

import numpy as np

import comet_dse
from comet_dse.base.allocator import keep_freed_memory
from comet_dse.cost import feasibility, microbatch_pass, shapes, step
from comet_dse.cost.distinct import distinct_rows, map_leaves
from comet_dse.cost.layout import layout_terms
from comet_dse.design_space.space import SearchSpace, enumerate_strategies
from comet_dse.design_space.table import evaluate_columns
from comet_dse.model import spec as model_spec
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import KNOBS, LAYOUT_KNOBS, MICROBATCH_KNOBS

# every cost room and strategy module whose ``np`` is pointed at jax.numpy while tracing
TRACED_MODULES = tuple(importlib.import_module(f"comet_dse.{part}.{info.name}")
                       for part in ("cost", "strategy")
                       for info in pkgutil.iter_modules([str(Path(comet_dse.__file__).parent / part)])) + (model_spec,)


class _Namespace:
    """numpy's names, or jax.numpy's while ``traced`` is set (numpy's where jax.numpy lacks one)."""

    def __init__(self, jnp, jax):
        self.jnp, self.jax, self.traced = jnp, jax, False

    def __getattr__(self, name):
        if self.traced:
            if name == "any":
                return self._any
            if name == "broadcast":
                return lambda *xs: _Shape(self.jnp.broadcast_shapes(*(np.shape(x) for x in xs)))
            if hasattr(self.jnp, name):
                return getattr(self.jnp, name)
        return getattr(np, name)

    def _any(self, x, *args, **kwargs):
        """A guard on traced values cannot be decided at trace time: take the branch (its result is selected)."""
        return True if isinstance(x, self.jax.core.Tracer) else np.any(x, *args, **kwargs)


@dataclasses.dataclass
class _Shape:
    shape: tuple


class _Leaf:
    """Where an array of a grouped term went in the list of the compiled function's inputs."""

    def __init__(self, index: int):
        self.index = index


def _flatten(tree, leaves):
    """``tree`` with each array replaced by a _Leaf, the array appended to ``leaves``; scalars stay."""
    def to_leaf(value):
        if isinstance(value, np.ndarray) and value.ndim:
            leaves.append(np.ascontiguousarray(value))
            return _Leaf(len(leaves) - 1)
        return value
    return map_leaves(to_leaf, tree)


def _rebuild(skeleton, values, index):
    """``skeleton`` with each _Leaf replaced by its value gathered at ``index``."""
    return map_leaves(lambda leaf: values[leaf.index][index] if isinstance(leaf, _Leaf) else leaf, skeleton)


def grouped_inputs(model, cluster, devices, st):
    """numpy: the layout and micro-batch terms of the distinct rows, and each point's row (as evaluate groups)."""
    first_l, inv_l = distinct_rows([getattr(st, n) for n in LAYOUT_KNOBS])
    sub = st.take(first_l)
    lay = layout_terms(model, sub, shapes.context_of(model, cluster, devices, sub))
    strides = {k: v[inv_l] for k, v in lay.strides.items()}
    first_m, inv_m = distinct_rows([getattr(st, n) for n in MICROBATCH_KNOBS] + [strides["tp"], strides["dp"]])
    sub = st.take(first_m)
    terms = microbatch_pass.microbatch_terms(model, shapes.context_of(model, cluster, devices, sub), sub)
    leaves = []
    skeletons = (_flatten(lay, leaves), _flatten(terms, leaves))
    return skeletons, leaves, inv_l, inv_m


def compiled_evaluator(model, cluster, devices, skeletons, namespace, jax, jnp):
    lay_skeleton, terms_skeleton = skeletons

    def per_point(columns, leaves, inv_l, inv_m):
        lay = _rebuild(lay_skeleton, leaves, inv_l)
        terms = _rebuild(terms_skeleton, leaves, inv_m)
        originals = (step.layout_grouped, step.microbatch_terms_grouped)
        step.layout_grouped = lambda *args: (lay, None)
        step.microbatch_terms_grouped = lambda *args: (dict(terms), None)
        try:
            st = StrategyArrays(columns)
            result = step.evaluate(model, cluster, devices, st)
            rules = feasibility.violations(model, cluster, devices, st, result)
        finally:
            step.layout_grouped, step.microbatch_terms_grouped = originals
        mask = jnp.zeros(st.tp.shape, dtype=jnp.int64)
        for i, (_, broken, _) in enumerate(rules):
            mask = mask | (jnp.asarray(broken, dtype=jnp.int64) << i)
        out = {"step_time_s": result.step_time, "mfu": result.mfu, "memory_per_device_bytes": result.memory_total,
               "tokens_per_second": result.tokens_per_second, "infeasible_mask": mask}
        out.update({f"time_{k}_s": jnp.broadcast_to(v, st.tp.shape) for k, v in result.breakdown.items()})
        out.update({f"memory_{k}_bytes": jnp.broadcast_to(v, st.tp.shape) for k, v in result.memory.items()})
        return out

    def traced(*args):
        namespace.traced = True
        try:
            return per_point(*args)
        finally:
            namespace.traced = False

    return jax.jit(traced)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=250_000)
    args = parser.parse_args()
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("this probe needs JAX: pip install jax", file=sys.stderr)
        return 2
    jax.config.update("jax_enable_x64", True)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    keep_freed_memory()
    namespace = _Namespace(jnp, jax)
    for module in TRACED_MODULES:
        module.np = namespace

    model, cluster, devices = load_model("megatron-1t"), load_cluster("tpu-v4"), 4096
    st = enumerate_strategies(model, devices, 2048, SearchSpace(max_micro_batch=64))
    st = st.take(np.resize(np.arange(len(st)), args.points))
    columns = {k.name: getattr(st, k.name) for k in KNOBS}

    with np.errstate(all="ignore"):
        skeletons, leaves, inv_l, inv_m = grouped_inputs(model, cluster, devices, st)
    evaluator = compiled_evaluator(model, cluster, devices, skeletons, namespace, jax, jnp)
    started = time.perf_counter()
    compiled = evaluator.lower(columns, leaves, inv_l, inv_m).compile()
    compile_s = time.perf_counter() - started

    def run_compiled():
        with np.errstate(all="ignore"):
            _, values, li, mi = grouped_inputs(model, cluster, devices, st)
        return jax.block_until_ready(compiled(columns, values, li, mi))

    def best(fn, repeat=3):
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - started)
        return min(times), out

    reference = evaluate_columns(model, cluster, devices, st)
    numpy_s, reference = best(lambda: evaluate_columns(model, cluster, devices, st))
    run_compiled()
    jax_s, result = best(run_compiled)
    worst = 0.0
    for name, values in result.items():
        a, b = np.asarray(values), np.asarray(reference[name])
        if a.dtype.kind != "f":
            assert np.array_equal(a, b), name
            continue
        finite = np.isfinite(b)
        assert np.array_equal(finite, np.isfinite(a)), name
        scale = np.maximum(np.abs(b[finite]), np.finfo(float).tiny)
        worst = max(worst, float(np.max(np.abs(a[finite] - b[finite]) / scale, initial=0.0)))
    print(f"compile: {compile_s:.1f} s for {args.points:,} points (megatron-1t, tpu-v4, 4096 chips)")
    print(f"numpy evaluate_columns: {args.points / numpy_s / 1e6:.2f} M points/s on one core")
    print(f"jax.jit, grouping included: {args.points / jax_s / 1e6:.2f} M points/s on one core "
          f"({numpy_s / jax_s:.2f}x numpy)")
    print(f"largest relative difference: {worst:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
