"""Kernel time: a roofline over the memory hierarchy.

Every function works element-wise on numpy arrays (a scalar is an array of
one), so the same code serves one estimate and a sweep of millions.

A kernel takes max(FLOPs / achievable FLOP/s, bytes / bandwidth of the tier
the bytes stream from) + a fixed launch overhead (docs/model.md, "Compute").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Device:
    """The numbers of an accelerator that kernel times need (SI units; arrays allowed).

    peak: dense matrix FLOP/s for the step's dtype; matmul_eff: best-shape
    fraction of it (benchmark); units, tile_m, tile_n, tile_k: compute units and
    the largest matmul tile (for wave/tile quantisation); pipeline_overhead:
    non-overlapped main-loop iterations per tile; sram_cap, sram_bw:
    on-chip memory; hbm_bw: achievable off-chip bandwidth; vector: FLOP/s of
    the vector units; overhead: seconds per kernel; peak16, matmul_eff16:
    16-bit matrix FLOP/s and its GEMM efficiency (what kernels outside fp8 run
    at in fp8 training: attention, LM head); attn_fwd, attn_bwd: long-sequence fraction of peak16 the fused
    attention kernel sustains in forward and backward; sustained, sustained16: the fraction of those
    benchmark rates the tensor units hold for minutes at the power limit (the step's dtype, 16-bit);
    comm_share: the share of the compute units a communication kernel holds while it runs;
    head_dim_kernels: fused attention runs kernels built per head dim (an accelerator with published fused
    kernel rates: FlashAttention, cuDNN), so its tiles span the head dim (``attention_tile_efficiency``).
    """

    peak: object
    matmul_eff: object
    units: object
    tile_m: object
    tile_n: object
    tile_k: object
    pipeline_overhead: object
    sram_cap: object
    sram_bw: object
    hbm_bw: object
    vector: object
    overhead: object
    peak16: object = None
    matmul_eff16: object = None
    attn_fwd: object = None
    attn_bwd: object = None
    sustained: object = 1.0
    sustained16: object = 1.0
    comm_share: object = 0.0
    head_dim_kernels: bool = False

    def sixteen_bit(self) -> "Device":
        """The same device with the 16-bit peak as its matrix rate (GEMMs that fp8 training leaves in bf16)."""
        from dataclasses import replace

        return replace(self, peak=self.peak16, matmul_eff=self.matmul_eff16, sustained=self.sustained16)


@dataclass(frozen=True)
class KernelTime:
    """Time of a kernel split by what bounds it: ``math`` if FLOP-bound, else ``memory``.

    math + memory = total; one of the two is zero for each element.
    """

    math: np.ndarray
    memory: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.math + self.memory

    def __add__(self, other: "KernelTime") -> "KernelTime":
        return KernelTime(self.math + other.math, self.memory + other.memory)

    def scale(self, factor) -> "KernelTime":
        return KernelTime(self.math * factor, self.memory * factor)


def zero_time(shape=()) -> KernelTime:
    return KernelTime(np.zeros(shape), np.zeros(shape))


def roofline(flops, flop_rate, bytes_moved, bandwidth, overhead) -> KernelTime:
    """t = max(flops / flop_rate, bytes / bandwidth) + overhead  [s].

    The overhead is booked with whichever bound wins.
    """
    t_math = flops / flop_rate
    t_mem = bytes_moved / bandwidth
    math_bound = t_math >= t_mem
    t = np.maximum(t_math, t_mem) + overhead
    return KernelTime(np.where(math_bound, t, 0.0), np.where(math_bound, 0.0, t))


def quantisation_efficiency(batch, m, n, dev: Device):
    """Fraction of the compute units doing useful work for a batch x (m x n) output.

    The output is cut into tiles of tile_m x tile_n; tiles run in waves of
    ``units`` (one tile per unit at a time):
        tile_eff = m*n / (ceil(m/tm)*tm * ceil(n/tn)*tn)       (padding)
        wave_eff = tiles / (ceil(tiles/units) * units)          (last wave idle)
    Like cuBLAS heuristics, the largest tile is used when it yields at least one
    full wave; smaller problems use quarter tiles (tm/2 x tn/2).
    Source: NVIDIA Deep Learning Performance Guide, "Matrix Multiplication
    Background" (tile and wave quantisation).
    """
    def efficiency(tm, tn):
        tiles_m, tiles_n = np.ceil(m / tm), np.ceil(n / tn)
        tiles = batch * tiles_m * tiles_n
        tile_eff = (m * n) / (tiles_m * tm * tiles_n * tn)
        wave_eff = tiles / (np.ceil(tiles / dev.units) * dev.units)
        return tile_eff * wave_eff, tiles

    big, big_tiles = efficiency(dev.tile_m, dev.tile_n)
    small, _ = efficiency(np.maximum(dev.tile_m // 2, 1), np.maximum(dev.tile_n // 2, 1))
    return np.where(big_tiles >= dev.units, big, small)


TILE_K_BYTES_OF = 2.0   # the preset's matmul_tile k counts 16-bit elements (docs/hardware.md)


def pipeline_efficiency(k, dev: Device, bytes_per_el=TILE_K_BYTES_OF):
    """Main-loop share of a tile's time: kt / (kt + c) with kt = ceil(k e / (2 tile_k)).

    Each output tile runs kt main-loop iterations plus about c iterations'
    worth of work that does not overlap them: filling the multi-stage copy
    pipeline (prologue) and converting and storing the accumulators
    (epilogue). Short reductions (attention scores, k = head dim) pay most.
    A main-loop iteration stages the same bytes of A and B whatever the
    element width (128 B of k on Hopper's TMA tiles), so 1-byte (fp8) inputs
    take 2 tile_k elements of k per iteration and have half the iterations of
    a 16-bit GEMM of the same k, at the same time each (twice the FLOPs at
    twice the rate): CUTLASS's SM90 fp8 GEMM uses a k tile of 128
    (examples/54_hopper_fp8_warp_specialized_gemm, TileShape 64x128x128)
    where its 16-bit GEMMs use 64.
    """
    kt = np.ceil(k * bytes_per_el / (TILE_K_BYTES_OF * dev.tile_k))
    return kt / (kt + dev.pipeline_overhead)


def gemm_hbm_bytes(batch, m, n, k, bytes_in, bytes_out, sram_cap):
    """Off-chip bytes of C[m,n] = A[m,k] @ B[k,n], blocked for on-chip SRAM [bytes].

    An output block T x T is kept on chip (T^2 fp32 accumulators plus the A
    and B panels streaming through, ~ 3 T^2 * 4 bytes <= SRAM), so A is read
    ceil(n/T) times and B ceil(m/T) times:
        bytes = batch * (bytes_in * (m*k*ceil(n/T) + k*n*ceil(m/T)) + bytes_out * m*n)
    More SRAM, larger T, fewer re-reads (Hong & Kung 1981 I/O lower bound
    ~ 2mnk/sqrt(S)). Source for the blocking argument: docs/model.md.
    """
    t = np.maximum(np.floor(np.sqrt(sram_cap / 12.0)), 16.0)
    a_reads = m * k * np.ceil(n / t)
    b_reads = k * n * np.ceil(m / t)
    return batch * (bytes_in * (a_reads + b_reads) + bytes_out * m * n)


def matmul_rate(batch, m, n, k, dev: Device, bytes_per_el=TILE_K_BYTES_OF):
    """Achievable FLOP/s of a batch x (m x n) output reduced over k with inputs of ``bytes_per_el``:
    peak * matmul_eff * sustained * quantisation_efficiency * pipeline_efficiency."""
    return (dev.peak * dev.matmul_eff * dev.sustained * quantisation_efficiency(batch, m, n, dev)
            * pipeline_efficiency(k, dev, bytes_per_el))


ATTENTION_BLOCK = 128   # query and key block of FlashAttention-2/3 and cuDNN for head dim <= 128 (Dao 2023; Shah et al. 2024)
HEAD_DIM_STEP = 32      # fused attention kernels are built per head dim in steps of 32 (FlashAttention-2's hdim32 .. hdim256)


def attention_tile_efficiency(batch, s_q, d, dev: Device):
    """Useful share of a fused attention kernel's output tiles: ``quantisation_efficiency`` over the query rows,
    with the tile's other side the head dim itself rounded up to the kernel's step of 32 (a kernel is compiled
    for each head dim, so a 64-wide head fills a 64-wide tile, not half of the device's 128-wide GEMM tile):
        padding = d / (ceil(d / 32) * 32)
    Head dims that are multiples of the GEMM tile (128: every kernel benchmark the presets' rates come from)
    get the GEMM tile's terms unchanged, and so does every head on a device without such kernels
    (``Device.head_dim_kernels`` False: fused attention there is costed as GEMMs, whose tiles a narrow head pads,
    as a TPU's 128 x 128 matrix unit does). A dimensionless fraction in (0, 1]. Source: the flash-attention
    repository builds FlashAttention-2's kernels per head dim, 32 to 256 in steps of 32 (csrc/flash_attn/src,
    flash_fwd_hdim32 .. flash_fwd_hdim256); docs/model.md, "Flash attention"."""
    whole_tiles = np.mod(d, dev.tile_n) == 0
    if not dev.head_dim_kernels or np.all(whole_tiles):
        return quantisation_efficiency(batch, s_q, d, dev)
    padding = d / (np.ceil(d / HEAD_DIM_STEP) * HEAD_DIM_STEP)
    one_tile_per_block = quantisation_efficiency(batch, s_q, dev.tile_n, dev) * padding
    return np.where(whole_tiles, quantisation_efficiency(batch, s_q, d, dev), one_tile_per_block)


def attention_rate(batch, s_q, s_k, d, efficiency, dev: Device, causal: bool = True):
    """FLOP/s of a fused (flash) attention kernel over batch x (s_q queries, s_k keys) at head dim d.

        rate = peak16 * efficiency * sustained16 * attention_tile_efficiency(batch, s_q, d) * loop * mask
        loop = k / (k + c)      k = key blocks a query block visits (n, or (n + 1)/2 when causal),
                                n = ceil(s_k / 128), c = the device's non-overlapped iterations per tile
        mask = n / (n + 1)      causal only: the diagonal blocks are computed whole and half used
    ``efficiency`` is the main-loop fraction of peak a long sequence sustains
    (the accelerator's attention_efficiency, read off published kernel
    benchmarks at 16k tokens and divided by loop * mask there). With these
    two terms, FlashAttention-3's causal forward at 512 tokens comes out at
    0.46 of its 16k rate; the paper measures 0.47 (Shah et al. 2024, Fig. 5).
    Counted FLOPs: 4 b a s_q s_k d, halved when causal (the kernels' own convention).
    """
    n = np.maximum(np.ceil(s_k / ATTENTION_BLOCK), 1.0)
    visits = (n + 1.0) / 2.0 if causal else n
    loop = visits / (visits + dev.pipeline_overhead)
    mask = n / (n + 1.0) if causal else 1.0
    return dev.peak16 * efficiency * dev.sustained16 * attention_tile_efficiency(batch, s_q, d, dev) * loop * mask


def gemm_time(batch, m, n, k, bytes_per_el, dev: Device) -> KernelTime:
    """Time of a (batched) GEMM: batch x [m,k] @ [k,n], in seconds.

    FLOPs = 2*batch*m*n*k at ``matmul_rate``; bytes per gemm_hbm_bytes at the
    achievable HBM bandwidth.
    """
    flops = 2.0 * batch * m * n * k
    rate = matmul_rate(batch, m, n, k, dev, bytes_per_el)
    moved = gemm_hbm_bytes(batch, m, n, k, bytes_per_el, bytes_per_el, dev.sram_cap)
    return roofline(flops, rate, moved, dev.hbm_bw, dev.overhead)


def stream_bandwidth(working_set, dev: Device):
    """Bandwidth of the tier an element-wise kernel streams from [bytes/s].

    A working set that fits in half the on-chip SRAM (the rest holds other
    live data) streams at SRAM bandwidth, otherwise at achievable HBM bandwidth.
    """
    return np.where(working_set <= 0.5 * dev.sram_cap, dev.sram_bw, dev.hbm_bw)


def elementwise_time(elements, bytes_per_element, flops_per_element, dev: Device) -> KernelTime:
    """Time of an element-wise kernel (norm, softmax, dropout, activation) [s].

    bytes = elements * bytes_per_element (all reads and writes),
    flops = elements * flops_per_element at the vector-unit rate.
    """
    moved = elements * bytes_per_element
    return roofline(elements * flops_per_element, dev.vector, moved, stream_bandwidth(moved, dev), dev.overhead)


def memory_pass_time(bytes_moved, dev: Device) -> KernelTime:
    """Time to stream ``bytes_moved`` through the memory system once (optimizer step, copies)."""
    return roofline(0.0, 1.0, bytes_moved, stream_bandwidth(bytes_moved, dev), dev.overhead)
