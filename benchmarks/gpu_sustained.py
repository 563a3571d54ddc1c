"""Measure on a GPU what no public source gives the cost model (docs/validation.md, "What a lent GPU would settle").

Run on one GPU (PyTorch with CUDA; nothing of comet_dse is imported, and tests never import this file):

    python benchmarks/gpu_sustained.py --out results.json [--seconds 60] [--quick]
    python benchmarks/gpu_sustained.py --nccl --out nccl.json     # under torchrun with 2+ GPUs, see below

It writes one JSON file (and prints a summary) with:

1. ``gemm``: the sustained rate of training-shaped GEMMs, bf16 and fp8, for ``--seconds`` of back-to-back
   launches each, on torch.randn data (realistic bit activity: Horace He, "Strangely, matrix multiplications
   on GPUs run faster when given predictable data", thonking.ai 2024), against the same shape's best 1-second
   burst at the start. Per shape: burst and sustained TFLOP/s, their ratio, and the SM clock, power and
   temperature sampled through NVML (pip install nvidia-ml-py) at the start and the end. The ratio is what
   the cluster preset's ``tensor_sustained`` stands for (docs/hardware.md, "Sustained tensor rate"); the
   burst rate at the benchmark's own best shape is what ``matmul_efficiency`` takes (MAMF).
   Shapes: MLPerf GPT-3 175B at TP 4 (h 12288, 2048 tokens per micro-batch) and Llama 3 405B at TP 8
   (h 16384, 8192 tokens): forward, input-gradient and weight-gradient GEMMs of QKV, output, MLP up and down.
   fp8 uses torch._scaled_mm with per-tensor scales and a bf16 output, as Transformer Engine's GEMMs.
2. ``attention``: fused attention (torch's scaled_dot_product_attention with the flash or cuDNN backend,
   causal, head dim 128) forward and backward TFLOP/s at 2k, 8k and 16k tokens, FLOPs counted as the
   kernels count them (4 b a s^2 d / 2 forward, 2.5x that backward), the figures attention_efficiency holds.
3. ``hbm``: the streaming bandwidth of a large device-to-device copy and of a triad (a = b + s c), the
   figure ``memory.hbm.efficiency`` stands for.
4. with ``--nccl`` (torchrun --nproc-per-node N benchmarks/gpu_sustained.py --nccl --out nccl.json):
   NCCL all-reduce bus bandwidth for 16 MiB .. 1 GiB, alone and while every rank runs a bf16 GEMM stream on
   another CUDA stream, and the GEMM's rate with and without the all-reduce beside it: the SM share
   communication kernels take (``comm_units`` / compute_units, docs/hardware.md, "Communication kernels").

Nothing here is fitted into a preset automatically: a measured figure goes into a preset with its source
(the JSON file, the GPU, driver, CUDA and torch versions it records), or into a calibrated preset file.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time


def _torch():
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU")
    return torch


class Telemetry:
    """SM clock (MHz), power (W) and temperature (C) of the current GPU through NVML, or nothing without it."""

    def __init__(self, index: int):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:          # no NVML: the rates are still measured
            self.nvml = None

    def sample(self) -> dict:
        if self.nvml is None:
            return {}
        m, h = self.nvml, self.handle
        return {"sm_clock_mhz": m.nvmlDeviceGetClockInfo(h, m.NVML_CLOCK_SM),
                "power_w": m.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "temperature_c": m.nvmlDeviceGetTemperature(h, m.NVML_TEMPERATURE_GPU),
                "power_limit_w": m.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0}


def gemm_shapes() -> list:
    """(name, m, n, k) of the training GEMMs: C[m, n] = A[m, k] B[k, n]."""
    out = []
    for model, h, f, t, tokens in (("gpt3-175b-tp4", 12288, 49152, 4, 2048), ("llama3-405b-tp8", 16384, 53248, 8, 8192)):
        qkv = 3 * h // t if model.startswith("gpt3") else (128 + 2 * 8) * 128 // t
        up = f // t if model.startswith("gpt3") else 2 * f // t
        for proj, n_in, n_out in (("qkv", h, qkv), ("out", h // t, h), ("up", h, up), ("down", f // t, h)):
            out += [(f"{model}.{proj}.fwd", tokens, n_out, n_in), (f"{model}.{proj}.dgrad", tokens, n_in, n_out),
                    (f"{model}.{proj}.wgrad", n_in, n_out, tokens)]
    return out


def _operands(torch, m, n, k, dtype):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    if dtype == "bf16":
        return lambda: torch.mm(a, b.t())
    fp8 = torch.float8_e4m3fn
    scale = torch.ones((), device="cuda")
    a8, b8 = a.to(fp8), b.to(fp8)
    return lambda: torch._scaled_mm(a8, b8.t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)


def _rate_for(torch, run, flops: float, seconds: float) -> float:
    """FLOP/s of back-to-back launches of ``run`` for about ``seconds`` (timed with CUDA events)."""
    run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    count, began = 0, time.perf_counter()
    start.record()
    while time.perf_counter() - began < seconds:
        for _ in range(20):
            run()
        count += 20
        torch.cuda.synchronize() if count % 200 == 0 else None
    end.record()
    torch.cuda.synchronize()
    return flops * count / (start.elapsed_time(end) / 1e3)


def gemm(torch, telemetry: Telemetry, seconds: float, quick: bool) -> list:
    results = []
    shapes = gemm_shapes()[:3] if quick else gemm_shapes()
    for dtype in ("bf16", "fp8"):
        if dtype == "fp8" and torch.cuda.get_device_capability() < (8, 9):
            continue
        for name, m, n, k in shapes:
            run = _operands(torch, m, n, k, dtype)
            flops = 2.0 * m * n * k
            time.sleep(2.0)                                     # start cool: the burst the benchmarks measure
            burst = max(_rate_for(torch, run, flops, 0.2) for _ in range(5))
            before = telemetry.sample()
            sustained = _rate_for(torch, run, flops, seconds)
            after = telemetry.sample()
            results.append({"shape": name, "dtype": dtype, "m": m, "n": n, "k": k, "burst_tflops": burst / 1e12,
                            "sustained_tflops": sustained / 1e12, "sustained_over_burst": sustained / burst,
                            "telemetry_start": before, "telemetry_end": after, "seconds": seconds})
            print(f"{dtype:4s} {name:28s} burst {burst / 1e12:7.1f}  sustained {sustained / 1e12:7.1f} TFLOP/s "
                  f"({sustained / burst:.3f})  {after}")
    return results


def attention(torch, seconds: float) -> list:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    out = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        for seq in (2048, 8192, 16384):
            batch, heads, d = max(1, 16384 // seq), 16, 128
            q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            flops = 4.0 * batch * heads * seq * seq * d / 2
            try:
                with sdpa_kernel(backend):
                    fwd = _rate_for(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                    flops, seconds / 6)
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    grad = torch.randn_like(o)
                    both = _rate_for(torch, lambda: torch.autograd.grad(
                        F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), grad), 3.5 * flops,
                        seconds / 6)
            except RuntimeError as exc:          # backend not available on this GPU or torch build
                out.append({"backend": backend.name, "seq": seq, "error": str(exc)[:200]})
                continue
            bwd = 2.5 * flops / (3.5 * flops / both - flops / fwd)
            out.append({"backend": backend.name, "seq": seq, "head_dim": d, "heads": heads, "batch": batch,
                        "forward_tflops": fwd / 1e12, "backward_tflops": bwd / 1e12})
            print(f"attention {backend.name:16s} {seq:6d}: forward {fwd / 1e12:6.1f}, backward {bwd / 1e12:6.1f} TFLOP/s")
    return out


def hbm(torch, seconds: float) -> dict:
    n = 1 << 30                                                         # 2 GiB of bf16 per tensor
    a, b, c = (torch.empty(n, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(3))
    copy = _rate_for(torch, lambda: a.copy_(b), 2.0 * 2 * n, seconds / 2)           # bytes, not FLOPs
    triad = _rate_for(torch, lambda: torch.add(b, c, alpha=0.5, out=a), 3.0 * 2 * n, seconds / 2)
    print(f"HBM: copy {copy / 1e12:.2f} TB/s, triad {triad / 1e12:.2f} TB/s")
    return {"copy_tbps": copy / 1e12, "triad_tbps": triad / 1e12}


def nccl(torch, seconds: float) -> dict:
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    m = n = k = 8192
    a, b = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    compute, comm = torch.cuda.Stream(), torch.cuda.Stream()
    out = {"world": world, "sizes": []}

    def busbw(size: int, with_gemm: bool) -> tuple:
        x = torch.empty(size // 2, device="cuda", dtype=torch.bfloat16)
        dist.barrier()
        torch.cuda.synchronize()
        gemms, reduces, began = 0, 0, time.perf_counter()
        while time.perf_counter() - began < seconds / 8:
            if with_gemm:
                with torch.cuda.stream(compute):
                    for _ in range(4):
                        torch.mm(a, b)
                    gemms += 4
            with torch.cuda.stream(comm):
                dist.all_reduce(x)
                reduces += 1
            torch.cuda.synchronize()
        took = time.perf_counter() - began
        return 2.0 * (world - 1) / world * size * reduces / took, 2.0 * m * n * k * gemms / took

    alone_gemm = _rate_for(torch, lambda: torch.mm(a, b), 2.0 * m * n * k, seconds / 8)
    for size in (16 << 20, 64 << 20, 256 << 20, 1 << 30):
        alone, _ = busbw(size, False)
        beside, gemm_rate = busbw(size, True)
        out["sizes"].append({"bytes": size, "busbw_alone_gbps": alone / 1e9, "busbw_beside_gemm_gbps": beside / 1e9,
                             "gemm_tflops_alone": alone_gemm / 1e12, "gemm_tflops_beside_allreduce": gemm_rate / 1e12})
        if rank == 0:
            print(f"all-reduce {size >> 20:5d} MiB: busbw {alone / 1e9:6.1f} GB/s alone, {beside / 1e9:6.1f} beside "
                  f"GEMMs; GEMM {alone_gemm / 1e12:6.1f} alone, {gemm_rate / 1e12:6.1f} TFLOP/s beside all-reduces")
    dist.destroy_process_group()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--seconds", type=float, default=60.0, help="sustained run per GEMM shape (default 60)")
    parser.add_argument("--quick", action="store_true", help="three shapes per dtype (a smoke run)")
    parser.add_argument("--nccl", action="store_true", help="all-reduce with and without GEMMs beside it (torchrun)")
    args = parser.parse_args()
    torch = _torch()
    info = {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__, "cuda": torch.version.cuda, "host": platform.node(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if args.nccl:
        result = {"info": info, "nccl": nccl(torch, args.seconds)}
    else:
        telemetry = Telemetry(torch.cuda.current_device())
        result = {"info": info, "telemetry_idle": telemetry.sample(), "hbm": hbm(torch, min(args.seconds, 10.0)),
                  "attention": attention(torch, min(args.seconds, 30.0)),
                  "gemm": gemm(torch, telemetry, args.seconds, args.quick)}
        ratios = [g["sustained_over_burst"] for g in result["gemm"]]
        result["summary"] = {"sustained_over_burst_median": statistics.median(ratios) if ratios else None}
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
