"""What each of issue 31's mechanisms buys, per validation family: the step-time error of every published
GPU run (h100_public.csv and gpu_public.csv) with the mechanisms switched on one at a time.

Run:  python benchmarks/validation_ladder.py [--data DIR] [--markdown]

The rungs, each on top of the one before (docs/validation.md, "Round 3"):
  0 before   tensor_sustained 1.0 on every preset, every run in comet-dse's default rank order (tp-pp-dp),
             no fused-attention rate on Blackwell (flash attention off there, as searches ran it), MoE tokens
             put in expert order for free (dispatcher fused)
  1 sustained  the presets' sustained tensor rates (gpu-fryer's 60 s burns)
  2 rank order each framework's own rank order (the rows' placement column)
  3 fa4        FlashAttention-4's rates on B200 / GB200
  4 permutation the MoE dispatcher each run used, with its permutation passes
The gradient buffer zeroed whole below ZeRO 2 and GB200 jobs in partial racks are in every rung (they are
not switches). Prints mean |error|, mean error and range per family (accelerator x precision x dense/MoE).
Nothing here changes a preset: it re-predicts the same rows with the changes undone.
"""
from __future__ import annotations

import argparse
import dataclasses as dc
from pathlib import Path

from comet_dse.answers.estimate import estimate
from comet_dse.answers.validation import gpu_runs, h100_runs, validation_dir
from comet_dse.base.stats import error_cell
from comet_dse.base.text import markdown_table, render_table
from comet_dse.hardware.efficiency import PHYSICAL, kind_of, precision_class
from comet_dse.presets.catalog import load_cluster
from comet_dse.strategy.declared import Strategy

RUNGS = ("before", "sustained", "rank order", "fa4", "permutation")


def _runs(directory: Path) -> list:
    """The published runs of today's GPUs as the rows state them (validation.PublishedRun)."""
    return h100_runs(directory, load_cluster("dgx-h100")) + gpu_runs(directory)


def _at(rung: int, cluster_name: str, strategy: Strategy):
    """The cluster and strategy of a run with the mechanisms above ``rung`` undone, at the physical reading
    (the shipped training efficiency is what the mechanisms leave; docs/hardware.md)."""
    cluster = load_cluster(cluster_name, efficiency=PHYSICAL)
    if rung < 1:
        cluster = dc.replace(cluster, accelerator=dc.replace(cluster.accelerator, tensor_sustained={}))
    changes = {}
    if rung < 2:
        changes["placement"] = "tp-pp-dp"
    if rung < 3 and strategy.attention_kernel.value == "fa4":
        changes["flash_attention"] = False
    if rung < 4:
        changes["moe_dispatcher"] = "fused"
    return cluster, dc.replace(strategy, **changes) if changes else strategy


def ladder(directory: Path) -> dict:
    """rung -> family -> [signed errors]; a family is 'accelerator | precision | kind'."""
    runs = _runs(directory)
    out = {}
    for rung, name in enumerate(RUNGS):
        families = out.setdefault(name, {})
        for run in runs:
            cluster, changed = _at(rung, run.cluster, run.strategy)
            predicted = estimate(run.model, cluster, run.devices, changed).step_time_s
            family = (f"{cluster.accelerator.name} | {precision_class(run.strategy.dtype.value)} | "
                      f"{kind_of(run.model.moe)}")
            families.setdefault(family, []).append((predicted - run.measured) / run.measured)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="folder of the validation CSVs")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    result = ladder(args.data or validation_dir())
    headers = ["accelerator", "precision", "kind", "runs", *RUNGS]
    rows = [[*family.split(" | "), len(result[RUNGS[0]][family]), *(error_cell(result[name][family]) for name in RUNGS)]
            for family in sorted(next(iter(result.values())))]
    print(markdown_table(headers, rows) if args.markdown else render_table(headers, rows, left=(0, 1, 2)))
    if not args.markdown:
        print("\ncells: mean |error| (mean signed error), rungs: " + ", ".join(RUNGS))


if __name__ == "__main__":
    main()
