"""Every figure README.md and docs/ quote from the tool is the figure the tool prints today.

Each check names a file, the command the text quotes (as the text gives it) and how the text writes the
figure. The command runs in-process (``comet_dse.cli.main``, or the API), the figure is read from what it
prints (a regular expression on its text, or a field of its ``--json``) and formatted as the text writes it,
and the text must contain it (line breaks and runs of spaces read as one space). So a change of the model
that moves a quoted figure fails here until the text says what the tool says. Wall-clock times are not
checked (they depend on the machine and the day); every other printed figure the docs quote is.

The calibrated files' figures are read from their ``calibration:`` blocks (the fit that wrote them), which
are checked to be fits of the runs files as shipped, to the preset's value as shipped.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from comet_dse.cli import main

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT / "examples" / "calibration"

H100_SEARCH = ("search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", "1024",
               "--global-batch", "1024", "--top", "3")
H100_SEARCH_FLASH_OFF = ("search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", "1024",
                         "--global-batch", "1024", "--top", "1", "--flash-attention", "off")
TPU_WHATIF = ("whatif", "--model", "megatron-1t", "--cluster", "tpu-v4", "--devices", "4096",
              "--global-batch", "2048", "--mp", "64", "--dp", "64")
H100_WHATIF = ("whatif", "--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", "1024",
               "--global-batch", "1024")
TPU_SEARCH = ("search", "--model", "megatron-1t", "--cluster", "tpu-v4", "--devices", "4096",
              "--global-batch", "2048", "--top", "1")
NARAYANAN = ("calibrate", str(CALIBRATION / "narayanan2021_runs.csv"), "--cluster", "dgx-a100-80gb")
NARAYANAN_HOLDOUT = ("--holdout", "3.6B,18.4B,76.1B,310.1B,1008.0B")


def decisions_search(cluster: str, devices: int) -> tuple:
    """docs/decisions.md's command for one cluster."""
    return ("search", "--model", "llama3-70b", "--cluster", cluster, "--devices", str(devices),
            "--global-batch", "2048", "--tokens", "15T", "--top", "1")


@functools.lru_cache(maxsize=None)
def printed(argv: tuple) -> str:
    """What ``comet-dse *argv`` prints on stdout (run once per command for the whole module)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    assert code == 0, (argv, err.getvalue())
    return out.getvalue()


def printed_json(argv: tuple) -> dict:
    return json.loads(printed(argv + ("--json",)))


@functools.lru_cache(maxsize=None)
def text_of(doc: str) -> str:
    """The file's text with every run of whitespace as one space (the docs wrap lines anywhere)."""
    return " ".join((ROOT / doc).read_text(encoding="utf-8").split())


def one_space(text: str) -> str:
    return " ".join(text.split())


def pct(fraction: float) -> str:
    """A fraction as the docs write a percentage: one decimal, a space before the sign."""
    return f"{100 * fraction:.1f} %"


def matched(pattern: str, output: str) -> dict:
    found = re.search(pattern, output, re.MULTILINE | re.DOTALL)
    assert found, f"the tool's output no longer has {pattern!r}:\n{output}"
    return found.groupdict()


def regex(argv: tuple, pattern: str, *templates: str) -> Callable[[], list]:
    """Figures: ``pattern``'s named groups in the output of ``comet-dse *argv``, each template filled in."""
    def figures() -> list:
        groups = matched(pattern, printed(argv))
        return [template.format(**groups) for template in templates]
    return figures


@dataclass(frozen=True)
class Check:
    doc: str                                   # the file, relative to the repository root
    what: str                                  # which figure (the test's id)
    figures: Callable[[], list]                # the figures as the doc writes them, from the tool


# --- README.md ---------------------------------------------------------------------------------

STEP = r"^Step time\s+(?P<step>\S+ s)$.*?^Throughput\s+(?P<tps>[\d,]+) tokens/s$.*?^MFU / HFU\s+(?P<mfu>[\d.]+)%"
RANK_1 = r"^ +1 [^\n]*? (?P<step>[\d.]+ s)\s+(?P<tps>[\d,]+)\s+(?P<mfu>[\d.]+)%"
SMALLEST = r"^Smallest hbm_capacity at which (?P<split>[^\n]*?) has a strategy that fits: (?P<cap>\S+ GiB) \([^\n]*?; " \
           r"(?P<cluster>the cluster has [^\n]*?)\), with (?P<with>[^:\n]*): (?P<code>[^\n]*)$"


def validation_table() -> list:
    """docs/accuracy.md's table: each dataset's rows, mean and max |error| (`comet-dse validate --json`)."""
    labels = {"korthikanti2022_table5.csv": "Korthikanti et al. 2022, Table 5",
              "korthikanti2022_table4.csv": "Korthikanti et al. 2022, Table 4",
              "narayanan2021_table1.csv": "Narayanan et al. 2021, Table 1",
              "moe_layer_perf.csv": "Megatron-LM's MoE layer benchmark",
              "h100_public.csv": "MLPerf v3.x GPT-3 175B and Llama 3 405B on H100",
              "gpu_public.csv": "gpu_public: ",
              "accelerators_public.csv": "accelerators_public: ",
              "fsdp_public.csv": "fsdp_public: ",
              "recsys_public.csv": "recsys_public: "}
    summary = printed_json(("validate",))["summary"]
    assert set(summary) == set(labels), "a dataset was added or removed: add it to docs/accuracy.md's table"
    lines = (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8").splitlines()
    figures = []
    for csv, label in labels.items():
        row = next(line for line in lines if line.startswith(f"| {label}"))
        s = summary[csv]
        figures.append(f"| {row.split('|')[1].strip()} | {s['rows']} | {pct(s['mean_abs_error'])} | "
                       f"{pct(s['max_abs_error'])} |")
    return figures + [f"| gpu_public: {summary['gpu_public.csv']['rows']} runs on",
                      f"| accelerators_public: {summary['accelerators_public.csv']['rows']} runs on",
                      f"| fsdp_public: {summary['fsdp_public.csv']['rows']} PyTorch FSDP runs"]


def validation_memory_and_fit() -> list:
    data = printed_json(("validate",))
    memory = data["memory"]["summary"]
    gpu = [r for r in data["rows"] if r["dataset"] == "gpu_public.csv"]
    fsdp = [r for r in data["rows"] if r["dataset"] == "fsdp_public.csv"]
    recsys = [r for r in data["rows"] if r["dataset"] == "recsys_public.csv"]
    accelerators = [r for r in data["rows"] if r["dataset"] == "accelerators_public.csv"]
    apart = gpu + fsdp + recsys + accelerators
    others = data["feasibility_recall"]["runs"] - len(apart)
    others_fit = data["feasibility_recall"]["judged_to_fit"] - sum(r["fits"] for r in apart)
    assert others_fit == others, "docs/accuracy.md says every paper and MLPerf v3 run is judged to fit"
    by_measure = {}
    for row in data["memory"]["rows"]:
        by_measure.setdefault(row["measures"], []).append(abs(row["error"]))
    allocated, reserved = by_measure["max_allocated"], by_measure["max_reserved"]
    return [f"Megatron-LM's functional tests ({len(allocated)} runs on A100",
            f"the framework whose memory the model follows): mean {pct(sum(allocated) / len(allocated))}, "
            f"max {pct(max(allocated))}",
            f"torchtitan's Llama 3.1 benchmarks ({len(reserved)} runs,",
            f"cached blocks): mean {pct(sum(reserved) / len(reserved))}, max {pct(max(reserved))}",
            f"The {others} runs of the papers and MLPerf v3 are all judged to fit",
            f"of gpu_public's {len(gpu)}, {sum(r['fits'] for r in gpu)} (most of the others",
            f"of accelerators_public's {len(accelerators)}, {sum(r['fits'] for r in accelerators)} (MaxText",
            f"of fsdp_public's {len(fsdp)}, {sum(r['fits'] for r in fsdp)}; of recsys_public's {len(recsys)}, "
            f"{sum(r['fits'] for r in recsys)}.",
            f"Peak memory per device against {memory['rows']} measured runs (`memory.csv`): "
            f"mean error {pct(memory['mean_abs_error'])}, max {pct(memory['max_abs_error'])}."]


def validation_families() -> list:
    """docs/accuracy.md's summary of Round 3: each GPU's dense runs' mean |error| (all precisions), the range of the MoE
    families' (each accelerator and precision), and an estimate's band as it prints it."""
    data = printed_json(("validate",))

    def dense(hardware: str) -> str:
        errors = [abs(r["error"]) for r in data["rows"] if r.get("hardware") == hardware and r.get("kind") == "dense"]
        return f"{100 * sum(errors) / len(errors):.0f} %"

    moe = [100 * b["mean_abs_error"] for b in data["error_bands"]
           if b["kind"] == "MoE" and b["hardware"] not in MACHINES_2026]
    b200, gb200 = dense("NVIDIA B200 180GB"), dense("NVIDIA GB200 Blackwell GPU 186GB")
    assert b200 == gb200, "docs/accuracy.md gives B200 and GB200 dense one figure"
    band = matched(r"^Error band\s+(?P<band>validated \S+ % \.\. \S+ %) \(predicted vs measured step time\) "
                   r"(?P<runs>on \d+ NVIDIA H100 SXM5 80GB 16-bit dense runs)", printed(H100_SEARCH))
    return [f"H100 dense by {dense('NVIDIA H100 SXM5 80GB')} on average, H200 by {dense('NVIDIA H200 SXM 141GB')}, "
            f"B200 and GB200 dense by {b200}, MoE by {min(moe):.0f}-{max(moe):.0f} %",
            f'e.g. "{band["band"]} {band["runs"]}"']


def cluster_list() -> list:
    """docs/usage.md names every cluster preset in its list of presets."""
    names = sorted(p.stem for p in (ROOT / "src" / "comet_dse" / "presets" / "clusters").glob("*.yaml"))
    return [f"`{name}`" for name in names]


def parquet_size() -> list:
    """docs/speed.md's table: how much smaller the chunk's Parquet is with parquet_options than with pyarrow's
    dictionary encoding of every column (benchmarks/bench_parquet.py's chunk and settings; the sizes do not
    depend on the machine, the times do and are not checked)."""
    import importlib.util
    import io as bytes_io

    import pyarrow.parquet as pq

    from comet_dse.design_space.storage import parquet_options

    spec = importlib.util.spec_from_file_location("bench_parquet", ROOT / "benchmarks" / "bench_parquet.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    table = bench.first_chunk(bench.HERE / "sweep-10m.yaml")
    sizes = []
    for options in ({"compression": "zstd"}, parquet_options(table.schema)):
        buffer = bytes_io.BytesIO()
        pq.write_table(table, buffer, **options)
        sizes.append(buffer.tell())
    return [f"| Parquet encoding of one {table.num_rows:,}-row chunk |",
            f"and {1 - sizes[1] / sizes[0]:.0%} smaller than pyarrow's default dictionary encoding".replace("%", " %")]


README = [
    Check("README.md", "search: strategies and feasible", regex(
        H100_SEARCH, r"(?P<n>[\d,]+) strategies evaluated in \S+ s, (?P<f>[\d,]+) feasible",
        "prints the 3 fastest of {n} strategies ({f} fit)")),
    Check("README.md", "search: step time, tokens/s, MFU", regex(
        H100_SEARCH, STEP, "{step} per step, {tps} tokens/s, {mfu} % MFU")),
    Check("README.md", "search: the strategy", regex(
        H100_SEARCH, r"^  tp=(?P<tp>\d+) cp=(?P<cp>\d+) pp=(?P<pp>\d+) dp=(?P<dp>\d+)$.*?interleave (?P<v>\d+),"
        r".*?ZeRO (?P<z>\d)", "with tp{tp} cp{cp} pp{pp} dp{dp}, {v} virtual stages, ZeRO {z}")),
    Check("README.md", "search: error band", regex(
        H100_SEARCH, r"^Error band\s+validated (?P<lo>\S+ %) \.\. (?P<hi>\S+ %) \(predicted vs measured step time\) "
        r"on (?P<runs>\d+) NVIDIA H100 SXM5 80GB 16-bit dense runs", '"validated {lo} .. {hi} on {runs} H100 16-bit '
        'dense runs"')),
    Check("README.md", "search: memory", regex(
        H100_SEARCH, r"^  reserved \(runtime and allocator\)\s+(?P<res>\S+ \S+)$.*?^  in HBM (?P<mem>\S+ GiB) of "
        r"(?P<cap>\S+ GiB)$", "using {mem} of the {cap} per GPU, of which {res} is the part")),
    Check("README.md", "search: flash attention off", regex(
        H100_SEARCH_FLASH_OFF, RANK_1, "(`--flash-attention off`: {step}, {mfu} % MFU)")),
    Check("README.md", "whatif: TPU v4 capacity", regex(
        TPU_WHATIF, SMALLEST, 'ends with "Smallest hbm_capacity at which {split} has a strategy that fits: {cap} '
        '(...; {cluster}), with {with}: {code}"')),
    Check("README.md", "whatif: H100 capacity", regex(
        H100_WHATIF, SMALLEST, "it is {cap}, with {with} inside the NVLink domain")),
    Check("docs/speed.md", "Speed: strategies of the TPU v4 search", regex(
        TPU_SEARCH, r"(?P<n>[\d,]+) strategies evaluated in",
        "| exhaustive strategy search, megatron-1t on 4096 TPU v4 chips | {n} strategies")),
    Check("docs/accuracy.md", "Accuracy: the validation table", validation_table),
    Check("docs/accuracy.md", "Accuracy: memory and what fits", validation_memory_and_fit),
    Check("docs/accuracy.md", "Accuracy: the families", validation_families),
    Check("docs/usage.md", "the cluster presets", cluster_list),
    Check("docs/speed.md", "Speed: Parquet size", parquet_size),
]


# --- docs/decisions.md -------------------------------------------------------------------------

TRAINING_LINES = ("time to train", "device-hours", "energy", "cost", "renting", "owning")


def decision(cluster: str, devices: int) -> Callable[[], list]:
    """The search line, the fastest strategy's row and the training block's figures."""
    def figures() -> list:
        out = printed(decisions_search(cluster, devices))
        head = matched(r"^(?P<head>[^\n]*?): (?P<n>[\d,]+) strategies evaluated in \S+ s, (?P<f>[\d,]+) feasible$", out)
        row = matched(r"^(?P<row> +1 [^\n]*)$", out)["row"]
        lines = [f"{head['head']}: {head['n']} strategies evaluated in", f"s, {head['f']} feasible", row]
        for label in TRAINING_LINES:
            lines.append(f"{label} " + matched(rf"^  +{label}  +(?P<v>[^\n]*)$", out)["v"])
        return lines
    return figures


DECISIONS = [Check("docs/decisions.md", f"{cluster} x {devices}", decision(cluster, devices))
             for cluster, devices in (("dgx-h100", 1024), ("dgx-b200", 512), ("tpu-v5p", 1024))]


# --- docs/calibration.md -------------------------------------------------------------------------

def calibration_block(name: str) -> dict:
    """A shipped calibrated file's ``calibration:`` block, checked to be a fit of its runs file as shipped
    from the preset's value as shipped."""
    block = yaml.safe_load((CALIBRATION / f"{name}.yaml").read_text(encoding="utf-8"))["calibration"]
    runs = (CALIBRATION / block["runs_file"]).read_bytes()
    assert hashlib.sha256(runs).hexdigest() == block["runs_sha256"], f"{name}.yaml: its runs file changed; refit"
    preset = yaml.safe_load((ROOT / "src" / "comet_dse" / "presets" / "clusters" / f"{block['base']}.yaml")
                            .read_text(encoding="utf-8"))
    for parameter, fit in block["fitted"].items():
        if parameter == "sustained":
            assert fit["preset"] == preset["accelerator"]["tensor_sustained"], f"{name}.yaml: the preset changed"
    return block


def fitted(block: dict, parameter: str) -> str:
    fit = block["fitted"][parameter]
    return f"{fit['value']:.3f} +/- {fit['sigma']:.3f}"


def errors(summary: dict, sep: str = " | ") -> str:
    return f"{pct(summary['mean_abs_error'])}{sep}{pct(summary['max_abs_error'])}"


def mlperf_file() -> list:
    block = calibration_block("dgx-h100-mlperf")
    return [f"| sustained (`tensor_sustained`) | {block['fitted']['sustained']['preset']} | "
            f"{fitted(block, 'sustained')} |",
            f"| dgx-h100 as shipped | {errors(block['error_before'])} |",
            f"| in sample | {errors(block['error_in_sample'])} |",
            f"| leave-one-out | {errors(block['error_cross_validated'])} |"]


def public_files() -> list:
    rows = []
    for name in ("dgx-h100-public", "gb200-nvl72-public", "dgx-b200-public"):
        block = calibration_block(name)
        method = {"10-fold cross-validation": "10-fold"}.get(block["cross_validation"], block["cross_validation"])
        rows.append(f"| {name}.yaml | {block['runs']} | {block['fitted']['sustained']['preset']} | "
                    f"{fitted(block, 'sustained')} | {errors(block['error_before'], ' / ')} | "
                    f"{errors(block['error_cross_validated'], ' / ')} ({method}) |")
    return rows


def two_decimals(fit: dict) -> str:
    return f"{fit['fitted']:.2f} +/- {fit['sigma']:.2f}"


def narayanan_half() -> list:
    """Fit `memory` on five rows, judge on the other five; and `gemm`, `microbatch_overhead` alone."""
    pytest.importorskip("scipy")
    data = printed_json(NARAYANAN + ("--fit", "memory") + NARAYANAN_HOLDOUT)
    held = [abs(r["error_preset"]) for r in data["held_out"]]
    figures = [f"| preset, the five held-out rows | {pct(sum(held) / len(held))} | {pct(max(held))} |",
               f"| fitted on the other five, the held-out rows | {errors(data['summary']['held_out'])} |",
               f"| leave-one-out on the five fitted rows | {errors(data['summary']['cross_validated'])} |",
               f"`memory` = {two_decimals(data['parameters'][0])} (preset {data['parameters'][0]['preset']:.2f})"]
    alone = []
    for parameter in ("gemm", "microbatch_overhead"):
        held_out = printed_json(NARAYANAN + ("--fit", parameter) + NARAYANAN_HOLDOUT)["summary"]["held_out"]
        alone.append(errors(held_out, " / "))
    figures.append(f"Fitting `gemm` alone instead gives {alone[0]} on the held-out rows, "
                   f"`microbatch_overhead` alone {alone[1]}.")
    return figures


def narayanan_all() -> list:
    pytest.importorskip("scipy")
    data = printed_json(NARAYANAN + ("--fit", "gemm,memory,network.infiniband.efficiency"))
    figures = [f"| {p['name']} | {p['preset']:.3g} | {two_decimals(p)} |" for p in data["parameters"]]
    summary = data["summary"]
    figures.append(f"Errors: preset {errors(summary['preset'], ' mean / ')} max; in sample "
                   f"{errors(summary['fitted'], ' / ')}; leave-one-out {errors(summary['cross_validated'], ' / ')}.")
    return figures


CALIBRATION_DOC = [
    Check("docs/calibration.md", "dgx-h100-mlperf.yaml", mlperf_file),
    Check("docs/calibration.md", "the gpu_public files", public_files),
    Check("docs/calibration.md", "Narayanan: fit on half", narayanan_half),
    Check("docs/calibration.md", "Narayanan: all ten", narayanan_all),
]


# --- docs/deepseek-v3.md ------------------------------------------------------------------------

DEEPSEEK = ("estimate", "--model", "deepseek-v3", "--cluster", "dgx-h800", "--devices", "2048", "--pp", "16",
            "--ep", "64", "--zero", "1", "--global-batch", "15360", "--seq-len", "4096", "--flash-attention",
            "--dtype", "fp8", "--recompute", "full", "--ep-overlap", "--ep-fp8-dispatch", "--placement", "dp-tp-pp")


def without(argv: tuple, *options: str) -> tuple:
    """``argv`` without each option (and its value, for an option that takes one)."""
    out = list(argv)
    for option in options:
        i = out.index(option)
        del out[i:i + (1 if option in ("--ep-overlap", "--ep-fp8-dispatch") else 2)]
    return tuple(out)


@functools.lru_cache(maxsize=None)
def flat_routing_model() -> str:
    """The deepseek-v3 preset without group-limited routing (no expert groups): a model file for the table."""
    import tempfile

    model = yaml.safe_load((ROOT / "src" / "comet_dse" / "presets" / "models" / "deepseek-v3.yaml").read_text())
    del model["moe"]["expert_groups"], model["moe"]["groups_per_token"]
    path = Path(tempfile.mkdtemp(prefix="comet-dse-doc-")) / "deepseek-v3-flat.yaml"
    path.write_text(yaml.safe_dump(model), encoding="utf-8")
    return str(path)


def deepseek_rows() -> list:
    """The table of configurations: step time, GPU-hours per 10^12 tokens (--tokens 1T --goodput off), whether
    it fits, the exposed all-to-all and the compute-bound kernels, from each command's --json."""
    rows = [("fp8, fp8 dispatch, full recompute, all-to-all overlapped, EP in 8 nodes", DEEPSEEK),
            ("same, 16-bit dispatch", without(DEEPSEEK, "--ep-fp8-dispatch")),
            ("same as the first, EP across 64 nodes (default placement)", without(DEEPSEEK, "--placement")),
            ("same as the first, no group-limited routing (flat all-to-all)",
             tuple(flat_routing_model() if a == "deepseek-v3" else a for a in DEEPSEEK)),
            ("fp8, fp8 dispatch, no recompute, overlapped, EP in 8 nodes",
             without(DEEPSEEK, "--recompute") + ("--recompute", "none")),
            ("fp8, fp8 dispatch, full recompute, all-to-all exposed, EP in 8 nodes", without(DEEPSEEK, "--ep-overlap")),
            ("bf16, full recompute, all-to-all exposed, EP in 8 nodes",
             without(DEEPSEEK, "--ep-overlap", "--ep-fp8-dispatch", "--dtype"))]
    figures = []
    for label, argv in rows:
        d = printed_json(argv + ("--tokens", "1T", "--goodput", "off"))
        fits = f"{'yes' if d['feasible'] else 'no'} ({d['memory_per_device_bytes'] / 2**30:.0f} GiB)"
        figures.append(f"| {label} | {d['step_time_s']:.1f} s | {d['training']['device_time_s'] / 3600e3:.0f}K | "
                       f"{fits} | {d['breakdown_s']['ep_communication']:.1f} s | {d['breakdown_s']['compute']:.1f} s |")
    return figures


def deepseek_training() -> list:
    """The training block of --tokens 14.8T, the steps alone (--goodput off), how far both are from the
    reported 2,664K GPU-hours and 180K per trillion tokens, and the footprint with selective recomputation."""
    out = printed(DEEPSEEK + ("--tokens", "14.8T"))
    figures = [f"{label} " + matched(rf"^  +{label}  +(?P<v>[^\n]*)$", out)["v"]
               for label in ("time to train", "of which steps", "goodput", "device-hours", "cost")]

    def gpu_hours(*options: str) -> float:
        return printed_json(DEEPSEEK + options)["training"]["device_time_s"] / 3600

    def over(value: float, reported: float) -> str:
        return f"{100 * (value / reported - 1):.0f} % over"

    steps, whole = gpu_hours("--tokens", "14.8T", "--goodput", "off"), gpu_hours("--tokens", "14.8T")
    per_trillion = gpu_hours("--tokens", "1T", "--goodput", "off") / 1e3
    selective = printed_json(without(DEEPSEEK, "--recompute") + ("--recompute", "selective"))
    physical = gpu_hours("--tokens", "1T", "--goodput", "off", "--physical") / 1e3
    return figures + [
        f"With `--physical` (the burn-test rate) the same command gives {physical:.0f}K, "
        f"{over(physical, 180)} the reported 180K",
        f"The steps alone take {steps:,.0f} GPU-hours (`--goodput off`; about {per_trillion:.0f}K per trillion "
        f"tokens x 14.8), {over(steps, 2664e3)} the reported 2,664K GPU-hours",
        f'reports, docs/economics.md "Goodput") {whole:,.0f}, {over(whole, 2664e3)}.',
        f"comet-dse predicts {per_trillion:.0f}K GPU-hours per trillion tokens, {over(per_trillion, 180)} the "
        f"reported 180K",
        f"does not fit ({selective['memory_per_device_bytes'] / 2**30:.0f} GiB per GPU)"]


DEEPSEEK_DOC = [Check("docs/deepseek-v3.md", "the configurations", deepseek_rows),
                Check("docs/deepseek-v3.md", "time to train and GPU-hours", deepseek_training)]


# --- docs/validation.md ------------------------------------------------------------------------

SHORT = {"NVIDIA A100 SXM4 80GB": "A100", "NVIDIA H100 SXM5 80GB": "H100", "NVIDIA H200 SXM 141GB": "H200",
         "NVIDIA B200 180GB": "B200", "NVIDIA GB200 Blackwell GPU 186GB": "GB200"}
# the accelerators whose public runs came with issue 42 (docs/validation.md, "The machines of 2026")
MACHINES_2026 = {"NVIDIA B300 270GB": "B300", "NVIDIA GB300 Blackwell Ultra GPU 279GB": "GB300",
                 "AMD Instinct MI325X": "MI325X", "AMD Instinct MI355X": "MI355X", "Google TPU v5e": "TPU v5e", "Google TPU v5p": "TPU v5p", "Google TPU v6e": "TPU v6e",
                 "Google TPU7x": "TPU7x", "Intel Gaudi 2 HL-225": "Gaudi 2"}


def validation_results() -> list:
    """The Results table's rows, mean and max |error| per dataset, and the per-row table of the papers' runs
    (Korthikanti Table 5, then Narayanan Table 1, in validate's order)."""
    data = printed_json(("validate",))
    lines = (ROOT / "docs" / "validation.md").read_text(encoding="utf-8").splitlines()
    starts = {"korthikanti2022_table5.csv": "| Korthikanti 2022 Table 5", "korthikanti2022_table4.csv":
              "| Korthikanti 2022 Table 4", "narayanan2021_table1.csv": "| Narayanan 2021 Table 1",
              "h100_public.csv": "| h100_public:", "gpu_public.csv": "| gpu_public:",
              "accelerators_public.csv": "| accelerators_public:",
              "moe_layer_perf.csv": "| Megatron-LM MoE layer benchmark"}
    figures = []
    for csv, start in starts.items():
        row = next(line for line in lines if line.startswith(start))
        s = data["summary"][csv]
        figures.append(f"| {row.split('|')[1].strip()} | {s['rows']} | {pct(s['mean_abs_error'])} | "
                       f"{pct(s['max_abs_error'])} |")
    figures.append(f"| gpu_public: {data['summary']['gpu_public.csv']['rows']} runs on")
    first = lines.index("| run | predicted | measured | error |") + 2
    table = lines[first:lines.index("", first)]
    runs = [r for r in data["rows"] if r["dataset"] in ("korthikanti2022_table5.csv", "narayanan2021_table1.csv")]
    assert len(table) == len(runs), "docs/validation.md's per-row table has a row per paper run"
    for line, run in zip(table, runs):
        figures.append(f"| {line.split('|')[1].strip()} | {run['predicted_s']:.2f} s | {run['measured_s']:.2f} s | "
                       f"{100 * run['error']:+.1f} % |")
    return figures


def validation_families_shipped() -> list:
    """Round 3's "As shipped" table: each family's runs, mean |error| and range (validate --json's error bands)."""
    figures = []
    for band in printed_json(("validate",))["error_bands"]:
        if band["hardware"].startswith("NVIDIA A100") or band["kind"] == "recommendation":
            continue
        if band["hardware"] in MACHINES_2026:
            continue
        spread = f"{100 * band['low']:.1f} .. {100 * band['high']:+.1f} %" if band["runs"] > 1 else ""
        figures.append(f"| {SHORT[band['hardware']]}, {band['precision']}, {band['kind']} | {band['runs']} | "
                       f"{pct(band['mean_abs_error'])} | {spread} |")
    return figures


def validation_machines_2026() -> list:
    """"The machines of 2026": each family's runs, mean |error|, range and mean error as shipped (validate --json's
    error bands), for the accelerators whose runs came with issue 42."""
    figures = []
    for band in printed_json(("validate",))["error_bands"]:
        if band["hardware"] not in MACHINES_2026:
            continue
        spread = f"{100 * band['low']:+.1f} .. {100 * band['high']:+.1f} %"
        figures.append(f"| {MACHINES_2026[band['hardware']]} | {band['precision']} | {band['kind']} | {band['runs']} | "
                       f"{pct(band['mean_abs_error'])} | {spread} | {100 * band['mean_error']:+.1f} % |")
    return figures


def validation_whole_runs() -> list:
    """The whole runs' table (published, steps alone, goodput, predicted device-hours, error, the band's range)
    and its summary line."""
    whole = printed_json(("validate",))["whole_runs"]
    figures = []
    for r in whole["rows"]:
        low, high = r["predicted_device_hours_range"] or (None, None)
        spread = f"{low / 1e6:.2f}M .. {high / 1e6:.2f}M" if low is not None else "not validated"
        figures.append(f"| {r['published_device_hours'] / 1e6:.3f}M | {r['steps_device_hours'] / 1e6:.3f}M | "
                       f"{pct(r['goodput'])} | {r['predicted_device_hours'] / 1e6:.3f}M | "
                       f"{100 * r['error']:+.1f} % | {spread} |")
    both, steps = whole["summary"]["with_goodput"], whole["summary"]["steps_only"]
    figures.append(f"Mean |error| {pct(both['mean_abs_error'])} ({pct(steps['mean_abs_error'])} for the steps alone), "
                   f"max {pct(both['max_abs_error'])}:")
    return figures


def validation_moe_layers() -> list:
    """Round 4's table of Megatron-LM's MoE layer benchmark: predicted / measured forward and backward per case."""
    rows = {r["label"]: r for r in printed_json(("validate",))["rows"] if r["dataset"] == "moe_layer_perf.csv"}
    cases = list(dict.fromkeys(label.rsplit(" ", 1)[0] for label in rows))

    def cell(r: dict) -> str:
        return f"{r['predicted_s'] * 1e3:.2f} / {r['measured_s'] * 1e3:.2f} ms ({100 * r['error']:+.1f} %)"

    return [f"| {case} | {cell(rows[case + ' forward'])} | {cell(rows[case + ' backward'])} |" for case in cases]


def validation_fixed_cost() -> list:
    """Round 4's line through the MLPerf v3.1 GPT-3 rows: step time against micro-batches per pipeline,
    measured and predicted as shipped (least squares over the six rows)."""
    import csv

    import numpy as np

    table = {r["id"]: r for r in csv.DictReader((ROOT / "src/comet_dse/data/validation/h100_public.csv").open())}
    rows = [r for r in printed_json(("validate",))["rows"]
            if r["label"].startswith("mlperf31") and r["dataset"] == "h100_public.csv"]
    m = np.array([int(table[r["label"]]["global_batch"]) * int(table[r["label"]]["tp"]) * int(table[r["label"]]["pp"])
                  / int(table[r["label"]]["gpus"]) for r in rows])
    design = np.vstack([np.ones_like(m), m]).T

    def line(key: str) -> str:
        a, b = np.linalg.lstsq(design, np.array([r[key] for r in rows]), rcond=None)[0]
        return f"t = {a:.3f} s + {b * 1e3:.1f} ms x m"

    return [f"measured {line('measured_s')}", f"predicted {line('predicted_s')}"]


def hardware_efficiency_table() -> list:
    """docs/hardware.md's table of the shipped training efficiency, row by row from the shipped file."""
    from comet_dse.hardware.efficiency import shipped_table

    def cell(s: dict) -> str:
        return f"{pct(s['mean_abs_error'])} ({100 * s['mean_error']:+.1f})"

    figures = []
    for f in shipped_table():
        name = f["accelerator"].removeprefix("NVIDIA ").replace(" Blackwell GPU", "")
        how = f["cross_validation"].removesuffix(" cross-validation")
        sigma = f"+/- {f['sigma']:.3f}" if f["sigma"] is not None else "(at the bound)"
        applies = "yes" if f["applies"] else "no: at the physical reading" if f.get("at_physical") else "no"
        figures.append(f"| {name} | {f['precision']} | {f['kind']} | {f['runs']} | {f['physical']:.3f} | "
                       f"{f['efficiency']:.3f} {sigma} | {cell(f['error_physical'])} | "
                       f"{cell(f['error_cross_validated'])}, {how} | {applies}")
    return figures


def validation_short_steps() -> list:
    """Round 4's short steps: MLPerf v5.1 Llama 3.1 8B on 72 and 512 GB200 (fp8 tensorwise; settings from
    data/validation/mlperf_llama31_configs.csv, step times from mlperf_step_timing.csv), predicted as shipped."""
    import comet_dse

    figures = []
    for gpus, tp, cp, batch, measured in ((72, 1, 2, 36, 0.1708), (512, 2, 4, 64, 0.0889)):
        est = comet_dse.estimate("llama3-8b", "gb200-nvl72", gpus, tp=tp, cp=cp, pp=1, global_batch=batch,
                                 micro_batch=1, dtype="fp8", sequence_parallel=tp > 1, zero=1, flash_attention=True,
                                 attention_kernel="fa4", tp_overlap=tp > 1, placement="tp-dp-pp", seq_len=8192)
        figures.append(f"| {gpus} | {tp} | {cp} | {batch} | {measured * 1e3:.1f} ms | {est.step_time_s * 1e3:.1f} ms | "
                       f"{100 * (est.step_time_s / measured - 1):+.1f} % |")
    return figures


def _fsdp_ladder_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fsdp_ladder", ROOT / "benchmarks" / "fsdp_ladder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def printed_by(function, *args) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        function(*args)
    return out.getvalue()


def validation_fsdp_ladder() -> list:
    """Round 5's tables: benchmarks/fsdp_ladder.py --markdown and --by-sequence, line by line."""
    from comet_dse.answers.validation import validation_dir
    from comet_dse.base.stats import error_cell

    script = _fsdp_ladder_script()
    directory = validation_dir()
    ladder = script.ladder(directory)
    lines = []
    columns = [(reading, rung) for reading in script.READINGS for rung in script.RUNGS]
    for family in sorted(ladder[columns[0]]):
        cells = [error_cell(ladder[column][family]) for column in columns]
        lines.append(f"| {family} | {len(ladder[columns[0]][family])} | " + " | ".join(cells) + " |")
    by_sequence = printed_by(script.print_by_sequence, script.by_sequence(directory)).splitlines()[2:]
    return lines + by_sequence


def validation_recsys() -> list:
    """The recommendation models' table: each MLPerf DLRM-DCNv2 run, measured and predicted, and the mean."""
    rows = [r for r in printed_json(("validate",))["rows"] if r["dataset"] == "recsys_public.csv"]
    figures = [f"| {r['label']} | {r['hardware'].removeprefix('NVIDIA ')} | {r['measured_s'] * 1e3:.3f} ms | "
               f"{r['predicted_s'] * 1e3:.3f} ms | {100 * r['error']:+.1f} % |" for r in rows]
    return figures + [f"Mean |error| {pct(sum(abs(r['error']) for r in rows) / len(rows))}."]


VALIDATION_DOC = [Check("docs/hardware.md", "the training efficiency shipped", hardware_efficiency_table),
                  Check("docs/validation.md", "Recommendation models", validation_recsys),
                  Check("docs/validation.md", "Round 5 FSDP runs", validation_fsdp_ladder),
                  Check("docs/validation.md", "Round 4 short steps", validation_short_steps),
                  Check("docs/validation.md", "Results and the papers' runs", validation_results),
                  Check("docs/validation.md", "Round 4 MoE layers", validation_moe_layers),
                  Check("docs/validation.md", "Round 4 fixed cost", validation_fixed_cost),
                  Check("docs/validation.md", "Whole runs", validation_whole_runs),
                  Check("docs/validation.md", "Round 3 as shipped", validation_families_shipped),
                  Check("docs/validation.md", "The machines of 2026", validation_machines_2026)]


# --- docs/economics.md --------------------------------------------------------------------------

LLAMA3_405B = ("estimate", "--model", "llama3-405b", "--cluster", "dgx-h100", "--devices", "16384", "--tp", "8",
               "--pp", "16", "--interleave", "8", "--sequence-parallel", "--zero", "2", "--flash-attention",
               "--pipeline-split", "embedding-loss", "--global-batch", "2048", "--tokens", "15.6T")

ECONOMICS_DOC = [Check("docs/economics.md", "Llama 3 405B's goodput", regex(
    LLAMA3_405B, r"^    goodput +(?P<goodput>\S+ %)(;[^\n]*)?$.*?job MTBF (?P<mtbf>\S+ h):.*?^    checkpoints +sync, (?P<size>\S+ TiB) "
    r"each, training stops (?P<stop>\S+ s), every (?P<every>\S+ min) of steps .*?= (?P<young>\S+ min)\)",
    "has a job MTBF of {mtbf}, a {size} checkpoint written in {stop} every {every} of steps (Young's optimum: "
    "{young}), and a goodput of {goodput}:"))]


# --- docs/explore-ui.md -------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def explorer_pages() -> tuple:
    """How many strategies the explorer's default page and bench_web.py's page search (web/view.py; the times
    are not checked)."""
    import importlib.util

    from comet_dse.web.view import Controls, compute

    spec = importlib.util.spec_from_file_location("bench_web", ROOT / "benchmarks" / "bench_web.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    benched = Controls(model=bench.MODEL, cluster=bench.CLUSTER, devices=bench.DEVICES, global_batch=bench.BATCH,
                       tp_across_nodes=True)
    return compute(Controls()).evaluated, compute(benched).evaluated


def explorer_counts() -> list:
    page, benched = explorer_pages()
    return [f"(the default page, TP inside one ICI axis) | {page:,} |", f"as `bench_web.py` runs it) | {benched:,} |"]


def readme_explorer() -> list:
    return [f"a {explorer_pages()[1] / 1e3:.0f}K-strategy search answers"]


EXPLORE_DOC = [Check("docs/explore-ui.md", "strategies per page", explorer_counts),
               Check("docs/usage.md", "explore: strategies of bench_web's page", readme_explorer)]


# --- docs/api.md -------------------------------------------------------------------------------

def api_error_line() -> list:
    """docs/api.md's example of InputError's text: what the API raises for 80 TB of HBM."""
    from comet_dse import InputError, estimate

    with pytest.raises(InputError) as raised:
        estimate(model="llama3-8b", cluster="dgx-h100", devices=8, global_batch=8, overrides={"hbm_capacity": "80TB"})
    return [f"`{raised.value}`"]


API = [Check("docs/api.md", "InputError's text", api_error_line)]


CHECKS = README + DECISIONS + CALIBRATION_DOC + DEEPSEEK_DOC + VALIDATION_DOC + ECONOMICS_DOC + EXPLORE_DOC + API


@pytest.mark.parametrize("check", CHECKS, ids=[f"{c.doc}: {c.what}" for c in CHECKS])
def test_the_doc_quotes_what_the_tool_prints(check):
    text = text_of(check.doc)
    missing = [one_space(figure) for figure in check.figures() if one_space(figure) not in text]
    assert not missing, f"{check.doc} should say, as the tool prints it now:\n" + "\n".join(missing)
