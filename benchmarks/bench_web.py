"""Speed of the explorer page's answer (``comet_dse.web.view.compute``), as a ratio and a rate.

Run:  python benchmarks/bench_web.py [--repeat 7]

The view the page computes on every change of a control, for GPT-3 175B on 1,024
H100s (dgx-h100), global batch 1,536: about 40 K strategies searched (TP across nodes allowed: the explorer's checkbox), the best
ones listed, the splits, the chosen strategy's estimate and eight doublings, at
three HBM capacities (80, 64 and 48 GiB, as when the HBM box is changed). The
reference, measured in the same process just before each view, is one batched
``evaluate_columns`` of the same strategies on the same cluster: the model
evaluation the view cannot do without. Prints, per capacity, the median over
--repeat rounds of the view's time as a multiple of the reference's (what to
compare between revisions and machines), and the view's median milliseconds and
strategies per second (for information: they move with the machine and its
load). The first view, which loads the presets and enumerates the strategies
(cached afterwards, as on the page), is timed once and not counted. The page's
round trip in a browser (the Dash callback, Plotly's drawing) is not included.

This replaces the test that asserted the view took under half a second
(tests/test_web.py): tests assert no speed (docs/reliability.md).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from comet_dse.answers.overrides import apply_overrides
from comet_dse.base.allocator import keep_freed_memory
from comet_dse.design_space.space import enumerate_strategies
from comet_dse.design_space.table import evaluate_columns
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.web.view import Controls, compute, overrides_for, strategy_space

MODEL, CLUSTER, DEVICES, BATCH = "gpt3-175b", "dgx-h100", 1024, 1536
CAPACITIES_GIB = (80, 64, 48)


def timed(fn) -> tuple:
    """(seconds, result) of one call."""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="rounds over the three capacities (default 7)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    keep_freed_memory()       # as the command line does before it allocates anything (comet_dse/base/allocator.py)

    base = Controls(model=MODEL, cluster=CLUSTER, devices=DEVICES, global_batch=BATCH, tp_across_nodes=True)
    first, view = timed(lambda: compute(base))
    model, cluster = load_model(MODEL), load_cluster(CLUSTER)
    st = enumerate_strategies(model, DEVICES, BATCH, strategy_space(base, cluster))     # what the view searches
    assert view.evaluated == len(st), (view.evaluated, len(st))
    cases = []
    for gib in CAPACITIES_GIB:
        settings, expansion = overrides_for(cluster, {"hbm_capacity": gib})
        changed = apply_overrides(cluster, settings, expansion, where="cluster") if settings or expansion else cluster
        controls = Controls(**{**base.__dict__, "resources": {"hbm_capacity": gib}})
        cases.append((gib, changed, controls))
        compute(controls)                                      # warm: as on the page after its first answer
        evaluate_columns(model, changed, DEVICES, st)

    views = {gib: [] for gib in CAPACITIES_GIB}
    refs = {gib: [] for gib in CAPACITIES_GIB}
    for _ in range(args.repeat):
        for gib, changed, controls in cases:
            refs[gib].append(timed(lambda: evaluate_columns(model, changed, DEVICES, st))[0])
            views[gib].append(timed(lambda: compute(controls))[0])

    print(f"explorer view: {MODEL} on {DEVICES:,} x {CLUSTER}, global batch {BATCH:,}: {len(st):,} strategies, "
          f"median of {args.repeat}")
    print(f"first view (presets loaded, strategies enumerated): {first * 1e3:,.0f} ms, not counted")
    print(f"{'HBM':>8}  {'view / evaluate':>15}  {'view ms':>8}  {'evaluate ms':>11}  {'strategies/s (view)':>19}")
    ratios = []
    for gib in CAPACITIES_GIB:
        ratio = statistics.median(v / r for v, r in zip(views[gib], refs[gib]))
        ratios.append(ratio)
        view_s, ref_s = statistics.median(views[gib]), statistics.median(refs[gib])
        print(f"{gib:>4} GiB  {ratio:>14.2f}x  {view_s * 1e3:>8,.0f}  {ref_s * 1e3:>11,.0f}  "
              f"{len(st) / view_s:>19,.0f}")
    print(f"view / one batched evaluation of its strategies: {statistics.median(ratios):.2f}x "
          "(median over the capacities)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
