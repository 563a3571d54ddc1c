"""Re-predict published measurements of real training runs (shared/validation).

Every row is predicted with the ONE ``dgx-a100-80gb`` preset. What differs
between rows is only what the authors ran: model, parallel degrees, batch,
recomputation, and the software configuration their scripts used (read from
the papers and the public run scripts, see docs/validation.md):

- Korthikanti et al. 2022 (Megatron-LM, 2022): gradient-accumulation fusion
  (--gradient-accumulation-fusion, on by default since early 2022).
- Narayanan et al. 2021 (Megatron-LM, container nvcr.io pytorch:20.12,
  examples/sc21/run_table_1.sh): fp16 gradients added into a main-gradient
  buffer by a separate kernel per micro-batch; gradients all-reduced after the
  last micro-batch's backward (no overlap) for the DDP=local rows; PyTorch DDP
  (bucketed all-reduce overlapped with backward) for the DDP=torch rows
  (1.7B to 18.4B).
"""
from __future__ import annotations

import csv
import dataclasses as dc
import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from comet_dse.answers.estimate import estimate, layer_times
from comet_dse.base.bounds import BOUNDS, shown
from comet_dse.base.errors import InputError
from comet_dse.base.stats import error_stats
from comet_dse.cost.flops import step_time_of_mfu
from comet_dse.cost.memory import footprint_bytes
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import MLP, Attention, MLPKind, Norm, PositionEmbedding, Transformer
from comet_dse.strategy.choices import GradAccumulation, Placement, Recompute
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import Strategy, knob_values

TABLE5 = "korthikanti2022_table5.csv"
TABLE1 = "narayanan2021_table1.csv"
TABLE4 = "korthikanti2022_table4.csv"
H100 = "h100_public.csv"
GPU = "gpu_public.csv"
OTHERS = "accelerators_public.csv"      # TPUs, AMD Instinct, Intel Gaudi (accelerators_public.md)
MEMORY = "memory.csv"
MOE_LAYER = "moe_layer_perf.csv"
FSDP = "fsdp_public.csv"
RECSYS = "recsys_public.csv"
# the files in gpu_public.csv's columns, each run compared on the preset it names, as shipped (gpu_comparisons)
PRESET_RUN_FILES = (GPU, OTHERS, FSDP, RECSYS)
STEP_TIME_DATASETS = (TABLE5, TABLE1, TABLE4, MOE_LAYER, H100) + PRESET_RUN_FILES   # `validate`'s step times, in order


@dataclass(frozen=True)
class Comparison:
    """One predicted-vs-measured value (seconds); for a whole run also whether the model judges it to fit
    (``fits``) and its memory per device with the reserve (``memory_bytes``, of ``capacity_bytes``)."""

    dataset: str
    label: str
    predicted: float
    measured: float
    fits: bool | None = None
    memory_bytes: float | None = None
    capacity_bytes: float | None = None
    hardware: str = ""        # the accelerator the run used (its preset's accelerator name)
    framework: str = ""       # the software that ran it (FRAMEWORKS)
    dtype: str = ""           # the training precision
    kind: str = "dense"       # "dense" or "MoE": the model family the run belongs to (answers/errorband.py)

    @property
    def error(self) -> float:
        """Relative error (predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured


# The software stack of each dataset's runs, as the sources state it (docs/validation.md).
MEGATRON_2022 = "Megatron-LM 2022"
MEGATRON_2021 = "Megatron-LM 2021"
NEMO_MLPERF = "NeMo + Megatron-Core + Transformer Engine (MLPerf)"
LLAMA3 = "Meta Llama 3 stack"

# Each framework's default order of the parallel axes on the devices, innermost first (docs/validation.md,
# "Rank order"). Megatron-LM and Megatron-Core (NeMo): tensor-, context-, expert-, data-, then pipeline-parallel
# ranks (megatron/core/parallel_state.py: RankGenerator(order="tp-cp-ep-dp-pp") unless use_tp_pp_dp_mapping,
# which the MLPerf logs print as False; Megatron-LM 2021 numbered TP groups consecutively, DP groups at
# stride TP and PP groups at stride world/PP: the same order). Llama 3 (Dubey et al. 2024, Sec. 3.3.2):
# "[TP, CP, PP, DP]".
RANK_ORDER = {MEGATRON_2022: Placement.TP_DP_PP, MEGATRON_2021: Placement.TP_DP_PP,
              NEMO_MLPERF: Placement.TP_DP_PP, LLAMA3: Placement.TP_PP_DP}


def whole_runs(comparisons: list) -> list:
    """The comparisons that are whole training steps (Table 4's per-layer times are not)."""
    return [c for c in comparisons if c.fits is not None]


def group_summary(comparisons: list, key: str) -> dict:
    """Whole runs grouped by ``key`` ("hardware", "framework" or "dtype"): group -> {runs, mean_abs_error,
    max_abs_error, mean_error, low, high} (fractions; low and high the most negative and most positive
    signed error)."""
    groups = {}
    for comp in whole_runs(comparisons):
        groups.setdefault(getattr(comp, key), []).append(comp.error)
    return {g: {"runs": len(e), **error_stats(e)} for g, e in groups.items()}


def validation_dir() -> Path:
    """Where the measurement CSVs are: $COMET_DSE_VALIDATION_DIR, ../shared/validation, or the packaged copy."""
    env = os.environ.get("COMET_DSE_VALIDATION_DIR")
    candidates = [Path(env)] if env else []
    here = Path.cwd()
    candidates += [here / "shared" / "validation", here.parent / "shared" / "validation"]
    for path in candidates:
        if (path / TABLE5).is_file():
            return path
    return Path(str(resources.files("comet_dse").joinpath("data", "validation")))


# Rows a validation CSV may hold: each costs an estimate (10-30 ms), so 2,000 rows are about a minute; the
# largest published set here (gpu_public.csv) has 153. A bigger file (100,000 rows ran for minutes without a
# word) is refused before any work.
MAX_ROWS = 2000


def _read(directory: Path, name: str) -> list:
    path = directory / name
    if not path.is_file():
        raise InputError("validation", f"{path} is missing")
    rows = []
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            rows.append(row)
            if len(rows) > MAX_ROWS:
                raise InputError("data", f"{path} holds more than {MAX_ROWS:,} rows; split it (each row is an "
                                         "estimate: the bound keeps validate to about a minute)")
    return rows


def measured_value(row: dict, column: str, dataset: str, bound: str = "measured_time", scale: float = 1.0) -> float:
    """The measured value in ``column`` of a validation CSV row, as written (``scale`` turns it into SI: 1e-3
    for ms, 2**30 for GiB): a finite positive number whose SI value lies in the ``bound`` row of
    bounds.BOUNDS, as calibrate checks its runs. measured=0 was a ZeroDivisionError traceback; nan, inf, -1
    and 1e-300 were accepted and gave a meaningless error."""
    text = row[column]
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    limits = BOUNDS[bound]
    if not (math.isfinite(value) and value > 0 and limits.low <= value * scale <= limits.high):
        label = row.get("id") or row.get("model") or row.get("experiment") or row.get("params_b") or "?"
        raise InputError("data", f"{dataset}: {column} of row {shown(str(label))} must be a positive number in "
                         f"[{limits.low / scale:g}, {limits.high / scale:g}], got {shown(text)}")
    return value


def _gpt(row: dict, name: str) -> Transformer:
    """Megatron GPT: GELU MLP, learned positions, tied embeddings, dropout unless the row says 0 (validation README)."""
    hidden, heads = int(row["hidden"]), int(row["heads"])
    return Transformer(
        name=name, layers=int(row["layers"]), hidden=hidden,
        attention=Attention(heads=heads, kv_heads=int(row.get("kv_heads") or heads), head_dim=hidden // heads),
        mlp=MLP(ffn=int(row["ffn"]), kind=MLPKind.GELU), vocab=int(row["vocab"]),
        seq_len=int(row["seq_len"]), tied_embeddings=True, position=PositionEmbedding.LEARNED,
        dropout=row.get("dropout", "") not in ("0", "0.0"),
    )


def _llama(row: dict, name: str) -> Transformer:
    """Llama: SwiGLU, RoPE, RMSNorm, grouped-query attention, no biases, no dropout, untied output projection."""
    hidden, heads = int(row["hidden"]), int(row["heads"])
    return Transformer(
        name=name, layers=int(row["layers"]), hidden=hidden,
        attention=Attention(heads=heads, kv_heads=int(row["kv_heads"]), head_dim=hidden // heads),
        mlp=MLP(ffn=int(row["ffn"]), kind=MLPKind.SWIGLU), vocab=int(row["vocab"]), seq_len=int(row["seq_len"]),
        tied_embeddings=False, position=PositionEmbedding.ROPE, dropout=False, bias=False, norm=Norm.RMSNORM,
    )


def _strategy(row: dict, **software) -> Strategy:
    """The row's knob columns (tp, pp, dp, batch sizes, recompute, ...) plus the software the authors ran."""
    return Strategy(**{**knob_values(row), **software})


def table5_comparisons(cluster: Cluster, directory: Path) -> list:
    """Korthikanti et al. 2022, Table 5: iteration time of 8 end-to-end runs."""
    out = []
    for row in _read(directory, TABLE5):
        model = _gpt(row, row["model"])
        strategy = _strategy(row, grad_accumulation=GradAccumulation.FUSED, dp_overlap=False,
                             placement=RANK_ORDER[MEGATRON_2022])
        result = estimate(model, cluster, int(row["gpus"]), strategy)
        mode = "selective+SP" if strategy.sequence_parallel else row["recompute"]
        label = f"{row['model']} {mode} {row['gpus']} GPUs (t{row['tp']} p{row['pp']} d{row['dp']})"
        out.append(_compared(TABLE5, label, result, measured_value(row, "measured_iteration_time_s", TABLE5), cluster,
                             MEGATRON_2022, strategy.dtype.value))
    return out


def table1_comparisons(cluster: Cluster, directory: Path) -> list:
    """Narayanan et al. 2021, Table 1: iteration time implied by the reported TFLOP/s."""
    out = []
    for row in _read(directory, TABLE1):
        torch_ddp = float(row["params_b"]) <= 18.4  # DDP=torch in examples/sc21/run_table_1.sh
        model = _gpt(row, f"{row['params_b']}B")
        strategy = _strategy(row, grad_accumulation=GradAccumulation.SEPARATE, dp_overlap=torch_ddp,
                             placement=RANK_ORDER[MEGATRON_2021])
        result = estimate(model, cluster, int(row["gpus"]), strategy)
        label = f"{row['params_b']}B {row['gpus']} GPUs (t{row['tp']} p{row['pp']} d{row['dp']})"
        out.append(_compared(TABLE1, label, result, measured_value(row, "derived_iteration_time_s", TABLE1), cluster,
                             MEGATRON_2021, strategy.dtype.value))
    return out


def table4_comparisons(cluster: Cluster, directory: Path) -> list:
    """Korthikanti et al. 2022, Table 4: forward and backward time of one 22B layer on 8 GPUs."""
    base = {"layers": "48", "hidden": "6144", "heads": "64", "ffn": "24576", "seq_len": "2048", "vocab": "51200"}
    model = _gpt(base, "megatron-22B layer")
    out = []
    for row in _read(directory, TABLE4):
        strategy = Strategy(tp=8, pp=1, dp=1, global_batch=4, micro_batch=4,
                            recompute=Recompute(row["recompute"]),
                            sequence_parallel=row["sequence_parallel"].lower() == "true", dtype="fp16")
        times = layer_times(model, cluster, 8, strategy)
        name = row["experiment"]
        where = {"hardware": cluster.accelerator.name, "framework": MEGATRON_2022, "dtype": "fp16"}
        forward_s = measured_value(row, "forward_ms", TABLE4, scale=1e-3) / 1e3
        backward_s = measured_value(row, "backward_ms", TABLE4, scale=1e-3) / 1e3
        out.append(Comparison(TABLE4, f"{name} forward", times.forward_s, forward_s, **where))
        out.append(Comparison(TABLE4, f"{name} backward", times.backward_s, backward_s, **where))
    return out


MOE_PERF = "Megatron-Core MoE layer benchmark"
# moe_perf's dispatchers as comet-dse's knob: DeepEP and HybridEP both run under the flex dispatcher
MOE_PERF_DISPATCHER = {"alltoall": "alltoall", "deepep": "flex", "hybridep": "flex"}


def moe_layer_model(row: dict) -> Transformer:
    """The MoE layer a row of moe_layer_perf.csv times: ``hidden``, ``num_experts`` experts of FFN
    ``moe_ffn_hidden``, ``topk`` per token, GELU experts unless ``gated`` (the test never sets a gated linear
    unit), the shared expert where the row has one, at ``seq_len`` (data/validation/moe_layer_perf.md). Only
    the MoE block is costed (cost/layer_work.py: moe_block_phase_times), so the rest of the model is
    Mixtral 8x7B's and plays no part."""
    from comet_dse.model.spec import MoE
    from comet_dse.presets.catalog import load_model

    gated = row["gated"].strip().lower() == "true"
    ffn = int(row["moe_ffn_hidden"])
    return dc.replace(load_model("mixtral-8x7b"), name=row["id"], hidden=int(row["hidden"]),
                   mlp=MLP(ffn=ffn, kind=MLPKind.SWIGLU if gated else MLPKind.GELU), seq_len=int(row["seq_len"]),
                   moe=MoE(experts=int(row["num_experts"]), top_k=int(row["topk"]), ffn=ffn,
                           shared_ffn=int(row["shared_expert_ffn_hidden"] or 0)))


def moe_layer_comparisons(cluster: Cluster, directory: Path) -> list:
    """Megatron-LM's MoE layer benchmark (tests/functional_tests/test_cases/common/moe_perf): forward and
    backward GPU time of one MoE layer on 8 H100s, expert parallel 8, each rank with its own micro-batch, routing
    forced balanced, predicted with ``cluster`` (dgx-h100 as shipped) and the row's dispatcher and precision."""
    from comet_dse.cost.layer_work import moe_block_phase_times

    path = packaged_or(directory, MOE_LAYER)
    out = []
    for row in _read(path.parent, path.name):
        gpus, ep, tp = int(row["gpus"]), int(row["ep"]), int(row["tp"])
        strategy = Strategy(tp=tp, pp=1, dp=gpus // tp, ep=ep, global_batch=gpus // tp * int(row["micro_batch"]),
                            micro_batch=int(row["micro_batch"]), dtype=row["dtype"], sequence_parallel=tp > 1,
                            moe_dispatcher=MOE_PERF_DISPATCHER[row["dispatcher"]])
        times = moe_block_phase_times(moe_layer_model(row), cluster, gpus, StrategyArrays.of([strategy]))
        where = {"hardware": cluster.accelerator.name, "framework": MOE_PERF, "dtype": row["dtype"], "kind": "MoE"}
        for phase in ("forward", "backward"):
            measured = measured_value(row, f"{phase}_ms", MOE_LAYER, scale=1e-3) / 1e3
            out.append(Comparison(MOE_LAYER, f"{row['id']} {phase}", float(times[phase][0]), measured, **where))
    return out


def packaged_or(directory: Path, name: str) -> Path:
    """``name`` in ``directory``, or the packaged copy when that folder has none."""
    path = directory / name
    if path.is_file():
        return path
    return Path(str(resources.files("comet_dse").joinpath("data", "validation", name)))


def h100_strategy(row: dict) -> Strategy:
    """The settings a row of h100_public.csv states, as a Strategy.

    MLPerf GPT-3 (NeMo/Megatron-Core): distributed optimizer (ZeRO 1), TP
    communication overlap, fused attention (Transformer Engine: cuDNN's
    kernel), gradient reduction overlapped, and
    pipeline send/recv overlapped (overlap_p2p_comm: True in the submission's
    conf/custom.yaml, mlcommons/training_results_v3.1), and fp8 amaxes
    all-reduced per model chunk (config_fp8.sh: FP8_REDUCE_AMAX=True; Transformer
    Engine 1.x reduces them blocking unless NVTE_ASYNC_AMAX_REDUCTION=1, which the
    v3.1 configs do not set).
    Llama 3 (Dubey et al. 2024, Sec. 3.3.2): ZeRO 2 over DP, parameters not
    resharded, K/V all-gathered for CP, flash attention (FlashAttention-2: the
    paper names no kernel; FA3 postdates the run), and the embedding and
    the output/loss each alone in a pipeline chunk (126 + 2 = 16 x 8).
    """
    extra = row["extra_settings"].lower()
    mlperf = row["id"].startswith("mlperf")
    return _strategy(
        row, tp_overlap="tp-comm-overlap" in extra, cp_algorithm="all-gather" if "all-gather" in extra else "ring",
        pp_overlap=mlperf, pipeline_split="balanced" if mlperf else "embedding-loss",
        attention_kernel="cudnn" if mlperf else "fa2", fp8_amax_reduction=mlperf and row["dtype"] == "fp8",
        placement=RANK_ORDER[NEMO_MLPERF if mlperf else LLAMA3],
    )


@dataclass(frozen=True)
class PublishedRun:
    """A whole run of today's GPUs as its source states it (h100_public.csv, gpu_public.csv or fsdp_public.csv):
    what ran, on which preset, and its measured step time [s]. ``validate`` compares these, the training
    efficiency is fitted on the first two (answers/efficiency_fit.py), benchmarks/validation_ladder.py
    re-predicts them and benchmarks/fsdp_ladder.py the third."""

    dataset: str
    label: str
    cluster: str          # the preset it ran on
    model: Transformer
    devices: int
    strategy: Strategy
    measured: float
    framework: str


def h100_runs(directory: Path, cluster: Cluster) -> list:
    """h100_public.csv's runs: MLPerf GPT-3 175B step times and Llama 3 405B MFU on DGX H100. An MFU row
    stands for the step time its MFU gives at ``cluster``'s peak (``h100_measured``)."""
    out = []
    for row in _read(directory, H100):
        model = (_gpt if row["model_style"] == "gpt" else _llama)(row, row["id"])
        strategy = h100_strategy(row)
        out.append(PublishedRun(H100, row["id"], "dgx-h100", model, int(row["gpus"]), strategy,
                                h100_measured(row, model, strategy, cluster),
                                NEMO_MLPERF if row["id"].startswith("mlperf") else LLAMA3))
    return out


def gpu_runs(directory: Path | None = None, name: str = GPU) -> list:
    """gpu_public.csv's runs (or those of ``name``, a file of the same columns: fsdp_public.csv): published step
    times of NVIDIA's and others' runs on H100, H200, B200 and GB200 (dense and MoE, bf16 and fp8), each with its
    cluster preset, its model (a preset, or a model YAML in ``models/`` beside the file) at the run's sequence
    length and the knob columns its source and its framework's recipe state (the ``assumed`` column names what
    came from a recipe default); ``step_s`` is the measured step time (docs/validation.md)."""
    path = packaged_or(directory or validation_dir(), name)
    out = []
    for row in _read(path.parent, path.name):
        measured = float(row["step_s"])
        if not measured > 0:
            raise InputError(f"{name} step_s", f"must be a positive number of seconds, got {row['step_s']!r}")
        model = _model_named(row["model"], path.parent, f"{name} model").with_seq_len(int(row["seq_len"]))
        out.append(PublishedRun(name, row["id"], row["cluster"], model, int(row["gpus"]), _strategy(row), measured,
                                row["family_framework"]))
    return out


def _model_named(name: str, folder: Path, what: str, changes: str = "") -> Transformer:
    """A model preset, or (a name ending in .yaml) the model YAML of that name in ``models/`` beside a data file,
    or in the packaged copy's ``models/`` when that folder has none, with ``changes`` ("key=value; ...": what a
    run changes of the file, e.g. "position=rope; dropout=false") applied."""
    from comet_dse.base.loading import read_yaml
    from comet_dse.presets.catalog import load_model, model_from

    if not name.endswith(".yaml"):
        return load_model(name)
    path = folder / "models" / name
    if not path.is_file() and "/" not in name and "\\" not in name:
        path = Path(str(resources.files("comet_dse").joinpath("data", "validation", "models", name)))
    data = dict(read_yaml(path, what))
    for item in filter(None, (part.strip() for part in changes.split(";"))):
        key, _, value = item.partition("=")
        if key.strip() not in data:
            raise InputError(f"{what}_set", f"{key.strip()!r} is not a field of {name}")
        data[key.strip()] = yaml.safe_load(value.strip())
    return model_from(data, what)


def h100_comparisons(cluster: Cluster, directory: Path, skipped: list | None = None) -> list:
    """h100_public.csv predicted with ``cluster`` (an MFU row compared as a step time: the measured MFU
    converted with the FLOP count of the convention such reports use, cost.step.model_flops with causal=False,
    every score counted as Megatron-LM and PaLM count them, / (GPUs x bf16 peak x MFU); docs/validation.md).
    Rows the model cannot run as written are appended to ``skipped`` (``comparisons_of``)."""
    return comparisons_of(h100_runs(directory, cluster), lambda name: cluster, skipped)


def gpu_comparisons(directory: Path | None = None, skipped: list | None = None, name: str = GPU) -> list:
    """gpu_public.csv (or ``name``: fsdp_public.csv), each run predicted with its cluster preset as shipped
    (``comparisons_of``)."""
    from comet_dse.presets.catalog import load_cluster

    clusters = {}

    def cluster_of(preset: str) -> Cluster:
        if preset not in clusters:
            clusters[preset] = load_cluster(preset)
        return clusters[preset]

    return comparisons_of(gpu_runs(directory, name), cluster_of, skipped)


def comparisons_of(runs: list, cluster_of, skipped: list | None = None) -> list:
    """The Comparison of each PublishedRun predicted on ``cluster_of(its preset)``; a run the model cannot run
    as written (``not_expressible``) is left out and appended to ``skipped`` as (dataset, id, why)."""
    out = []
    for run in runs:
        cluster = cluster_of(run.cluster)
        result = estimate(run.model, cluster, run.devices, run.strategy)
        why = not_expressible(result)
        if why:
            if skipped is not None:
                skipped.append((run.dataset, run.label, why))
            continue
        out.append(_compared(run.dataset, run.label, result, run.measured, cluster, run.framework,
                             run.strategy.dtype.value, run.model.kind))
    return out


def h100_measured(row: dict, model: Transformer, strategy: Strategy, cluster: Cluster) -> float:
    """The measured step time of an h100_public.csv row [s]: its iter_s, or the step time its MFU stands for
    (cost/flops.py: step_time_of_mfu, at ``cluster``'s peak for the row's dtype)."""
    if row["metric"] == "iter_s":
        return measured_value(row, "measured", H100)
    return step_time_of_mfu(model, strategy.global_batch, int(row["gpus"]),
                            cluster.accelerator.flops(strategy.dtype.value),
                            measured_value(row, "measured", H100, "mfu"))


def _compared(dataset: str, label: str, result, measured: float, cluster: Cluster, framework: str = "",
              dtype: str = "", kind: str = "dense") -> Comparison:
    """A whole run's Comparison: its step time, whether it fits and its memory per device (reserve included),
    the accelerator, the software stack, the precision it ran with and its model family (dense or MoE)."""
    return Comparison(dataset, label, result.step_time_s, measured, fits="memory" not in result.broken_rules,
                      memory_bytes=float(result.memory_per_device_bytes),
                      capacity_bytes=float(cluster.accelerator.state_capacity),
                      hardware=cluster.accelerator.name, framework=framework, dtype=dtype, kind=kind)


def not_expressible(result) -> str | None:
    """Why the model cannot run a published run as written (a validity rule other than memory it breaks, e.g.
    Megatron-Core's expert groups drawn across tensor and data parallel ranks, which the model's "EP divides
    DP" rule does not express), or None. Such a row is not compared: a step time for a strategy the model
    calls invalid measures nothing (``comet-dse validate`` lists it)."""
    broken = [why for code, why in zip(result.broken_rules, result.reasons) if code != "memory"]
    return broken[0] if broken else None


def recall(comparisons: list) -> dict:
    """Feasibility recall over the whole runs (Table 4's per-layer times are not runs): {runs, judged_to_fit,
    missed: [labels of runs the model says do not fit]}. Every run here ran, so every one should fit."""
    runs = [c for c in comparisons if c.fits is not None]
    return {"runs": len(runs), "judged_to_fit": sum(c.fits for c in runs),
            "missed": [c.label for c in runs if not c.fits]}


def all_comparisons(cluster: Cluster, directory: Path | None = None, h100: Cluster | None = None,
                    skipped: list | None = None) -> list:
    """Every comparison, in dataset order; ``h100``: the cluster for h100_public.csv (default dgx-h100);
    ``skipped`` collects (dataset, id, why) of the runs the model cannot run as written (``not_expressible``)."""
    from comet_dse.presets.catalog import load_cluster

    directory = directory or validation_dir()
    h100 = h100 or load_cluster("dgx-h100")
    return (table5_comparisons(cluster, directory) + table1_comparisons(cluster, directory)
            + table4_comparisons(cluster, directory) + moe_layer_comparisons(h100, directory)
            + h100_comparisons(h100, directory, skipped)
            + [c for name in PRESET_RUN_FILES for c in gpu_comparisons(directory, skipped, name)])


@dataclass(frozen=True)
class MemoryComparison:
    """One predicted-vs-measured peak memory per device [bytes] (memory.csv).

    measures: what the source measured. ``max_reserved``: the peak of what PyTorch's caching allocator held
    (torch.cuda.max_memory_reserved, what torchtitan logs as "memory"): the footprint and its fragmentation,
    without the driver's share, the CUDA context or NCCL's buffers, so the prediction leaves out the
    cluster's fixed reserved_memory. ``max_allocated``: the peak of what the run's tensors held
    (torch.cuda.max_memory_allocated; Megatron-LM's mem-max-allocated-bytes, logged by the last rank), the
    last pipeline rank's footprint and the GEMM workspaces (Cluster.workspace_memory), which the allocator
    holds among the tensors. ``device``: everything the device had in use
    (nvidia-smi), the prediction with the whole reserve.
    """

    label: str
    predicted: float
    measured: float
    measures: str
    source: str

    @property
    def error(self) -> float:
        """Relative error (predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured


MEASURES = ("max_reserved", "max_allocated", "device")


def memory_file(directory: Path) -> Path:
    """memory.csv in ``directory``, or the packaged copy when that folder has none (../shared/validation holds
    the step-time tables only)."""
    path = directory / MEMORY
    if path.is_file():
        return path
    return Path(str(resources.files("comet_dse").joinpath("data", "validation", MEMORY)))


def memory_comparisons(directory: Path | None = None) -> list:
    """memory.csv: the peak memory per device of published runs against the model's, each row predicted with
    its cluster preset as shipped (capacity only decides the fit, not the prediction) and the settings its
    source states."""
    from comet_dse.presets.catalog import load_cluster

    path = memory_file(directory or validation_dir())
    out = []
    for row in _read(path.parent, path.name):
        if row["measures"] not in MEASURES:
            raise InputError("memory.csv", f"measures must be one of {', '.join(MEASURES)}, got {row['measures']!r}")
        cluster = load_cluster(row["cluster"])
        result = estimate(_memory_model(row, path.parent), cluster, int(row["gpus"]), _strategy(row))
        predicted = float(result.memory_per_device_bytes)
        if row["measures"] == "max_reserved":
            predicted -= cluster.reserved_memory
        elif row["measures"] == "max_allocated":     # the last rank's footprint and the workspaces among it
            predicted = footprint_bytes(result.memory_last_stage_bytes, cluster.reserved_memory,
                                        cluster.fragmentation, cluster.workspace_memory) + cluster.workspace_memory
        measured = measured_value(row, "measured_gib", MEMORY, "hbm_capacity", 2.0**30) * 2.0**30
        out.append(MemoryComparison(row["id"], predicted, measured, row["measures"], row["source"]))
    return out


def _memory_model(row: dict, folder: Path) -> Transformer:
    """A memory.csv row's model (``_model_named``, with the row's ``model_set``), its ``vocab`` (the padded size
    the framework used: Megatron-LM pads to a multiple of 128 x TP) and its sequence length."""
    model = _model_named(row["model"], folder, "memory.csv model", row.get("model_set", ""))
    if row.get("vocab"):
        model = dc.replace(model, vocab=int(row["vocab"]))
    return model.with_seq_len(int(row["seq_len"]))


def memory_summary(comparisons: list) -> dict:
    """{rows, mean_abs_error, max_abs_error, mean_error} of memory comparisons (fractions; mean_error signed)."""
    return _rows([c.error for c in comparisons], ("mean_abs_error", "max_abs_error", "mean_error"))


def summary(comparisons: list) -> dict:
    """dataset -> {rows, mean_abs_error, max_abs_error} (fractions)."""
    out = {}
    for comp in comparisons:
        out.setdefault(comp.dataset, []).append(comp.error)
    return {k: _rows(v, ("mean_abs_error", "max_abs_error")) for k, v in out.items()}


def _rows(errors: list, keys: tuple) -> dict:
    """{rows, then ``keys`` of stats.error_stats} of a list of errors."""
    s = error_stats(errors)
    return {"rows": len(errors), **{k: s[k] for k in keys}}


# ---- whole training runs: published device-hours (whole_runs.csv) ------------------------------------------------

WHOLE_RUNS = "whole_runs.csv"
STRATEGY_SOURCES = ("stated", "searched")


@dataclass(frozen=True)
class Phase:
    """One phase of a whole run as predicted: its strategy (compact text), where it came from, the device time
    of its tokens with and without goodput [s], its time to train [s] and energy [J]."""

    name: str
    strategy_text: str
    strategy_source: str
    device_time_s: float
    steps_device_time_s: float
    time_to_train_s: float
    energy_j: float


@dataclass(frozen=True)
class WholeRun:
    """A published training run against the model: the published device-hours and the predicted ones (every
    phase's tokens at its predicted throughput, over the goodput of whole_run/goodput.py with its sourced defaults)."""

    run: str
    hardware: str             # the accelerator's name (for the error band)
    dtype: str
    published_device_hours: float
    published: str            # what the published figure counts
    phases: tuple
    source: str
    comparable: str = "unknown"   # "yes: ...", "no: ..." or "unknown: ...": whether the figure counts what is costed

    @property
    def is_comparable(self) -> bool:
        """The published figure counts the steps of the phases costed, and nothing else the source says."""
        return self.comparable.startswith("yes")

    @property
    def predicted_device_hours(self) -> float:
        return sum(p.device_time_s for p in self.phases) / 3600.0

    @property
    def steps_device_hours(self) -> float:
        """Device-hours of the steps alone (goodput 1)."""
        return sum(p.steps_device_time_s for p in self.phases) / 3600.0

    @property
    def goodput(self) -> float:
        return self.steps_device_hours / self.predicted_device_hours

    @property
    def error(self) -> float:
        """(predicted - published) / published device-hours."""
        return (self.predicted_device_hours - self.published_device_hours) / self.published_device_hours

    @property
    def steps_error(self) -> float:
        """The same without goodput (every step trains)."""
        return (self.steps_device_hours - self.published_device_hours) / self.published_device_hours


def whole_runs_file(directory: Path | None = None) -> Path:
    """whole_runs.csv in ``directory``, or the packaged copy when that folder has none."""
    path = (directory or validation_dir()) / WHOLE_RUNS
    if path.is_file():
        return path
    return Path(str(resources.files("comet_dse").joinpath("data", "validation", WHOLE_RUNS)))


def whole_run_comparisons(directory: Path | None = None) -> list:
    """whole_runs.csv: every run's phases predicted with its cluster preset as shipped and goodput's defaults,
    on the strategy its source states, or where it states none (``strategy`` = searched) the fastest strategy
    that fits with the knobs it does state held fixed; rows of one ``run`` are summed."""
    path = whole_runs_file(directory)
    runs = {}
    for row in _read(path.parent, path.name):
        runs.setdefault(row["run"], []).append(row)
    return [_whole_run(rows, path.parent) for rows in runs.values()]


def _whole_run(rows: list, folder: Path) -> WholeRun:
    from comet_dse.presets.catalog import load_cluster

    phases, first = [], rows[0]
    for row in rows:
        if row["strategy"] not in STRATEGY_SOURCES:
            raise InputError("whole_runs.csv strategy", f"must be one of {', '.join(STRATEGY_SOURCES)}, "
                             f"got {row['strategy']!r}")
        cluster = load_cluster(row["cluster"])
        model = _memory_model(row, folder)
        gpus, tokens = int(row["gpus"]), float(row["tokens"])
        strategy = _strategy(row) if row["strategy"] == "stated" else _searched(model, cluster, gpus, row)
        result = estimate(model, cluster, gpus, strategy, tokens=tokens)
        if not result.runnable:
            raise InputError("whole_runs.csv", f"{row['run']} {row['phase']}: the strategy cannot run: "
                             f"{'; '.join(result.reasons)}")
        t = result.training
        phases.append(Phase(row["phase"], _compact(strategy), row["strategy"], t["device_time_s"],
                            gpus * t["productive_time_s"], t["time_to_train_s"], t["energy_j"]))
    cluster = load_cluster(first["cluster"])
    return WholeRun(first["run"], cluster.accelerator.name, first["dtype"] or "bf16",
                    float(first["published_device_hours"]), first["published"], tuple(phases), first["source"],
                    _comparable(first))


def _comparable(row: dict) -> str:
    """The row's ``comparable`` cell: yes, no or unknown, then ': ' and why (whole_runs.csv's README)."""
    text = (row.get("comparable") or "").strip()
    if text.split(":", 1)[0] not in ("yes", "no", "unknown"):
        raise InputError("whole_runs.csv comparable", f"must start with yes, no or unknown, got {text!r}")
    return text


def _searched(model: Transformer, cluster: Cluster, gpus: int, row: dict) -> Strategy:
    """The fastest strategy that fits (design_space.search with the command line's defaults) with every knob the
    row states held at its value, or among its values where a cell lists several (``none|full``)."""
    from comet_dse.design_space.search import search, strategy_at
    from comet_dse.design_space.space import SearchSpace, with_cluster_defaults

    given = {k: (v,) for k, v in knob_values({c: t for c, t in row.items() if "|" not in (t or "")}).items()
             if k != "global_batch"}
    for column, text in row.items():           # a cell 'none|full': the values the run could have used
        if "|" in (text or ""):
            given.update({k: tuple(knob_values({column: part})[k] for part in text.split("|"))
                          for k in knob_values({column: text.split("|")[0]})})
    space = with_cluster_defaults(SearchSpace(given), cluster, gpus, False)
    found = search(model, cluster, gpus, int(row["global_batch"]), space)
    if not found.feasible:
        raise InputError("whole_runs.csv", f"{row['run']} {row['phase']}: no strategy fits")
    return strategy_at(found.columns, int(found.ranked[0]))


def _compact(strategy: Strategy) -> str:
    from comet_dse.strategy.text import compact_text

    return compact_text(strategy.to_dict())


def whole_run_summary(runs: list) -> dict:
    """{runs, mean_abs_error, max_abs_error, mean_error} of the device-hours, with goodput (``with_goodput``) and
    without (``steps_only``)."""
    keys = ("mean_abs_error", "max_abs_error", "mean_error")
    return {"with_goodput": _rows([r.error for r in runs], keys),
            "steps_only": _rows([r.steps_error for r in runs], keys),
            "comparable": _rows([r.error for r in runs if r.is_comparable], keys)}
