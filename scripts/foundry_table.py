"""Write fsdp_public.csv from the MPT throughput tables of MosaicML's llm-foundry (PyTorch FSDP under Composer).

Usage: git -C llm-foundry show 495218376830947dce625efabc4d86be7c47cc45:scripts/train/benchmarking/README.md \
           > foundry_README.md
       python scripts/foundry_table.py foundry_README.md > src/comet_dse/data/validation/fsdp_public.csv

Every row of the README's five tables ("H100 80GB BF16 (Large Scale, >= 128 GPUs)", "H100 80GB BF16", "H100 80GB
FP8", "A100 80GB ..." and "A100 40GB ...") becomes one run. The measured step time is what the row's throughput
gives: step_s = GlobalBatchSize [sequences] x SeqLen [tokens] / Throughput (T/s) [tokens/s]. The knob columns are
what the table and the benchmark's submit_benchmarks.py state (fsdp_public.md says which were assumed):
FULL_SHARD is ZeRO 3 with parameters resharded after forward, SHARD_GRAD_OP is ZeRO 3 without (FSDP keeps the
gathered parameters from forward to backward), "Activation Checkpointing True" is full recomputation.
"""
from __future__ import annotations

import csv
import sys

COMMIT = "495218376830947dce625efabc4d86be7c47cc45"
SOURCE = (f"mosaicml/llm-foundry scripts/train/benchmarking/README.md @{COMMIT}, section '{{section}}'; "
          "model: scripts/train/yamls/pretrain/mpt-{size}.yaml + submit_benchmarks.py (learned positions, biases, "
          "low_precision_layernorm, attn_impl flash)")
CLUSTERS = {"h100_80gb": "dgx-h100", "a100_80gb": "dgx-a100-80gb", "a100_40gb": "dgx-a100-40gb"}
DTYPES = {"amp_bf16": "bf16", "bf16": "bf16", "amp_fp8": "fp8"}
LARGE_SCALE = "H100 80GB BF16 (Large Scale, >= 128 GPUs)"
LARGE_SCALE_FA2 = ("1b", "3b", "7b", "70b")   # sweep.py @5e85bd62d: --attn_impl flash (flash-attn 2.4.2); 13b, 30b triton
SHARDING = {"FULL_SHARD": "true", "SHARD_GRAD_OP": "false"}      # reshard_after_forward
ASSUMED = ("grad_sync micro-batch (Composer runs FSDP's backward outside no_sync); dp_overlap (FSDP prefetches "
           "all-gathers and reduce-scatters during backward); cross-entropy in-place (MPT's fused_crossentropy loss, "
           "flash-attn's cross-entropy kernel, writes the gradient over its input: the nearest choice); the "
           "interconnect of the H100 tables is not stated (the dgx-h100 preset; a maintainer recalls 3200 Gbps per "
           "node, llm-foundry issue #1584)")
OLD_ROW = ("; a row carried over from the earliest tables (precision 'bf16', which Composer accepted only up to "
           "v0.11; PR #543: 'added back old numbers that I didn't reproduce'): its attention kernel is not recorded, "
           "triton assumed (submit_benchmarks.py's default at every commit in the folder's history)")
COLUMNS = ("id,cluster,model,seq_len,gpus,tp,pp,cp,ep,dp,zero,reshard_after_forward,grad_sync,global_batch,"
           "micro_batch,interleave,recompute,sequence_parallel,flash_attention,attention_kernel,dtype,tp_overlap,"
           "dp_overlap,pp_overlap,cp_algorithm,moe_dispatcher,ep_overlap,ep_fp8_dispatch,fp8_amax_reduction,"
           "pipeline_split,placement,cross_entropy,framework,family_framework,metric,measured,step_s,mixed_precision,"
           "published_params,section,assumed,source").split(",")


def table_rows(lines: list):
    """(section, row dict) for every data row of every Markdown table under a '## ' header."""
    section, header = "", None
    for line in lines:
        if line.startswith("## "):
            section, header = line[3:].strip(), None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|"):
            header = None
        elif header is None:
            header = cells
        elif set(cells[0]) - set("- "):
            yield section, dict(zip(header, cells))


def kernel_of(section: str, size: str) -> str:
    """The attention kernel a table's run used: submit_benchmarks.py's --attn_impl default is triton (FlashAttention
    in Triton) at every commit that wrote a table; the large-scale H100 sweep (sweep.py @5e85bd62d) passes
    --attn_impl flash (FlashAttention-2, flash-attn 2.4.2 in its install line) for 1b, 3b, 7b and 70b."""
    return "fa2" if section == LARGE_SCALE and size in LARGE_SCALE_FA2 else "triton"


def run_of(section: str, row: dict, seen: dict) -> dict:
    """The fsdp_public.csv row of one table row."""
    gpus, seq, batch = int(row["# GPUs"]), int(row["SeqLen (T)"]), int(row["GlobalBatchSize"])
    tokens_per_s = float(row["Throughput (T/s)"])
    gpu, dtype = row["GPU"], DTYPES[row["Precision"]]
    size = row["Model"]
    key = f"foundry-{gpu.replace('_', '')}-mpt{size}-s{seq}-{gpus}g-b{batch}-{dtype}"
    seen[key] = seen.get(key, 0) + 1
    return {
        "id": key if seen[key] == 1 else f"{key}-{seen[key]}",
        "cluster": CLUSTERS[gpu], "model": f"mpt-bench-{size}.yaml", "seq_len": seq, "gpus": gpus,
        "tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": gpus, "zero": 3,
        "reshard_after_forward": SHARDING[row["Sharding Strategy"]], "grad_sync": "micro-batch",
        "global_batch": batch, "micro_batch": int(row["MicroBatchSize"]), "interleave": 1,
        "recompute": "full" if row["Activation Checkpointing"] == "True" else "none",
        "sequence_parallel": "false", "flash_attention": "true", "attention_kernel": kernel_of(section, size), "dtype": dtype,
        "tp_overlap": "false", "dp_overlap": "true", "pp_overlap": "false", "cp_algorithm": "",
        "moe_dispatcher": "", "ep_overlap": "", "ep_fp8_dispatch": "", "fp8_amax_reduction": "false",
        "pipeline_split": "balanced", "placement": "tp-pp-dp", "cross_entropy": "in-place",
        "framework": "llm-foundry + Composer (PyTorch FSDP)", "family_framework": "PyTorch FSDP",
        "metric": "tokens_per_s", "measured": row["Throughput (T/s)"],
        "step_s": f"{batch * seq / tokens_per_s:.4f}", "mixed_precision": row["MP Mode"],
        "published_params": row["NumParams"], "section": section,
        "assumed": ASSUMED + (OLD_ROW if row["Precision"] == "bf16" else ""),
        "source": SOURCE.format(section=section, size=size),
    }


def main(path: str) -> int:
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    seen: dict = {}
    for section, row in table_rows(lines):
        if row.get("Activation CPUOffload", "False") != "False":
            continue                                # the model cannot offload activations (none in the tables)
        writer.writerow(run_of(section, row, seen))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
