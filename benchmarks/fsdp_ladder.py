"""How the model reads PyTorch FSDP runs it was not fitted on (fsdp_public.csv: llm-foundry's MPT benchmarks),
and what the attention kernel each run used buys.

Run:  python benchmarks/fsdp_ladder.py [--data DIR] [--markdown] [--by-sequence]

Every run is predicted at two readings of its preset (the physical, burn-test one and the shipped training
efficiency fitted on Megatron-family stacks; docs/hardware.md, "Training efficiency") and on two rungs:
  fa2     every run's attention costed as FlashAttention-2 (what the model assumed for fused attention before the
          Triton kernel had its own rates)
  kernel  the kernel each run used (llm-foundry's attn_impl: FlashAttention in Triton for most tables,
          FlashAttention-2 for four sizes of the large-scale H100 sweep; scripts/foundry_table.py)
Prints mean |error| (mean signed error) per family: accelerator x precision class (docs/validation.md, "Round 5").
--by-sequence prints instead the mean signed error with the presets as shipped by accelerator and sequence length.
Nothing here changes a preset: the rows are re-predicted with the kernel undone.
"""
from __future__ import annotations

import argparse
import dataclasses as dc
import statistics
from pathlib import Path

from comet_dse.answers.estimate import estimate
from comet_dse.answers.validation import FSDP, gpu_runs, validation_dir
from comet_dse.base.stats import error_cell
from comet_dse.base.text import markdown_table, render_table
from comet_dse.hardware.efficiency import PHYSICAL, precision_class
from comet_dse.presets.catalog import load_cluster

RUNGS = ("fa2", "kernel")
READINGS = ("physical", "shipped")


def ladder(directory: Path) -> dict:
    """(reading, rung) -> family -> [signed errors]; a family is 'accelerator | precision'."""
    runs = gpu_runs(directory, FSDP)
    clusters = {}
    out = {}
    for reading in READINGS:
        for rung in RUNGS:
            families = out.setdefault((reading, rung), {})
            for run in runs:
                key = (run.cluster, reading)
                if key not in clusters:
                    clusters[key] = load_cluster(run.cluster, efficiency=PHYSICAL if reading == "physical" else None)
                cluster = clusters[key]
                strategy = dc.replace(run.strategy, attention_kernel="fa2") if rung == "fa2" else run.strategy
                predicted = estimate(run.model, cluster, run.devices, strategy).step_time_s
                family = f"{cluster.accelerator.name} | {precision_class(run.strategy.dtype.value)}"
                families.setdefault(family, []).append((predicted - run.measured) / run.measured)
    return out


def by_sequence(directory: Path) -> dict:
    """'A100' or 'H100 16-bit' or 'H100 fp8' -> sequence length -> [signed errors], the presets as shipped (the A100
    40GB and 80GB together: the same die, both at the physical reading)."""
    out = {}
    clusters = {}
    for run in gpu_runs(directory, FSDP):
        if run.cluster not in clusters:
            clusters[run.cluster] = load_cluster(run.cluster)
        predicted = estimate(run.model, clusters[run.cluster], run.devices, run.strategy).step_time_s
        group = "A100" if "a100" in run.cluster else f"H100 {precision_class(run.strategy.dtype.value)}"
        out.setdefault(group, {}).setdefault(run.model.seq_len, []).append((predicted - run.measured) / run.measured)
    return out


def print_by_sequence(result: dict) -> None:
    """A Markdown table: one row per group, one column per sequence length: mean signed error (runs)."""
    lengths = sorted({s for group in result.values() for s in group})
    rows = [[group] + [f"{statistics.fmean(result[group][s]) * 100:+.1f} % ({len(result[group][s])})"
                       if s in result[group] else "" for s in lengths] for group in sorted(result)]
    print(markdown_table(["runs"] + [f"{s:,}" for s in lengths], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="folder of the validation CSVs")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--by-sequence", action="store_true",
                        help="print the mean signed error by sequence length instead (presets as shipped)")
    args = parser.parse_args()
    if args.by_sequence:
        print_by_sequence(by_sequence(args.data or validation_dir()))
        return
    result = ladder(args.data or validation_dir())
    columns = [(reading, rung) for reading in READINGS for rung in RUNGS]
    headers = ["accelerator", "precision", "runs"] + [f"{reading}, {rung}" for reading, rung in columns]
    rows = [[*family.split(" | "), len(result[columns[0]][family]), *(error_cell(result[c][family]) for c in columns)]
            for family in sorted(result[columns[0]])]
    print(markdown_table(headers, rows) if args.markdown else render_table(headers, rows, left=(0, 1)))
    if not args.markdown:
        print("\ncells: mean |error| (mean signed error)")


if __name__ == "__main__":
    main()
