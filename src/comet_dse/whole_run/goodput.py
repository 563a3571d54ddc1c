"""Goodput: the share of a training run's wall-clock time that trains, and what the rest is lost to.

A step-time model says how long the steps take when nothing goes wrong (the productive time ``T0``). A
whole run also stops for failures, restarts, checkpoints (docs/economics.md, "Goodput", has every formula
and the source of every default). Over arrays (``devices``, ``T0``) like whole_run/economics.py:

    cluster MTBF [s]           M = MTBF per device / devices        (failures scale linearly with devices)
    checkpoint bytes [B]       S = parameters x checkpoint bytes per parameter
    checkpoint write [s]       C_w = S / (devices x storage bandwidth per device)
    checkpoint stall [s]       C = C_w (sync) or S / devices / host bandwidth (async: only the copy to host
                                   memory stops training; the write goes on behind it)
    interval [s]               tau = the one given, else the best of this model, sqrt(C^2 + 2 C (M - R)) - C
                               (Young's sqrt(2 x C x M) to first order, printed beside it); async: at least C_w,
                               as one write must end before the next begins
    restart [s]                R = restart time (detect, reschedule, re-initialise) + C_w (re-load)
    goodput                    g = (1 - (R + tau / 2) / M) / (1 + C / tau)     (0 where failures outpace work)
    wall-clock time [s]        T = T0 / g
    of which                   checkpoints T0 x C / tau; failures T / M, each costing R and the lost work tau / 2

Derivation: T = T0 (1 + C / tau) + (T / M) (R + tau / 2): the productive time, one stall per interval of
productive time, and per failure (T / M of them) a restart and on average half an interval of work redone.

Floor 2 (docs/architecture.md): plain numbers and arrays; the cluster file's reader (hardware/economics_block.py,
floor 3) takes its settings and names, whole_run/economics.py (floor 4) computes with it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from comet_dse.base.units import DAY

# Defaults (docs/economics.md, "Goodput": the sources), each overridable with --set <name>=... .
LLAMA3_GPUS = 16_384                  # Dubey et al. 2024 (arXiv:2407.21783), Sec. 3.3.4: during a 54-day snapshot
LLAMA3_DAYS = 54                      # of Llama 3 405B pre-training on 16,384 H100s, 466 job interruptions,
LLAMA3_UNEXPECTED = 419               # 419 of them unexpected (78 % hardware)
DEFAULT_MTBF = LLAMA3_GPUS * LLAMA3_DAYS * DAY / LLAMA3_UNEXPECTED   # per device: 1.82e8 s = 50,677 h = 5.8 years
OPT_GPUS = 1_024                      # Meta's OPT-175B on 1,024 A100 80GB: "~90 restarts over the course of
OPT_DAYS = 56                         # training the lineage of this current model" (facebookresearch/metaseq
OPT_RESTARTS = 90                     # projects/OPT/chronicles/final_update.md:24, :6), Nov 11 2021 (10_percent_
                                      # update.md:57) to Jan 6 2022: every cause, as Llama 3's count
A100_MTBF = OPT_GPUS * OPT_DAYS * DAY / OPT_RESTARTS    # per device: 5.5e7 s = 15,292 h
# The failure rate per device an accelerator's runs were measured with, by the era of its published failure
# counts (docs/economics.md, "Goodput"): (name prefix, MTBF per device [s], what it rests on). Accelerators of
# no such count take Llama 3's H100 figure, said so.
MTBF_BY_FAMILY = (
    ("NVIDIA A100", A100_MTBF, "OPT-175B's 90 restarts in 56 days on 1,024 A100s"),
    ("NVIDIA H100", DEFAULT_MTBF, "Llama 3's 419 interruptions in 54 days on 16,384 H100s"),
    ("NVIDIA H800", DEFAULT_MTBF, "Llama 3's 419 interruptions in 54 days on 16,384 H100s (the same GH100 die)"),
    ("NVIDIA H200", DEFAULT_MTBF, "Llama 3's 419 interruptions in 54 days on 16,384 H100s (the same GH100 die)"),
)
ASSUMED_MTBF = "assumed: Llama 3's H100 figure (no published failure count of this accelerator's runs)"


def mtbf_of(accelerator: str) -> tuple:
    """(MTBF per device [s], its source) for an accelerator's name: its family's published failure count
    (MTBF_BY_FAMILY), else Llama 3's H100 figure, marked assumed."""
    for prefix, mtbf, source in MTBF_BY_FAMILY:
        if accelerator.startswith(prefix):
            return mtbf, source
    return DEFAULT_MTBF, ASSUMED_MTBF


# What a run also spends that the goodput does not count (docs/economics.md, "Goodput"): printed beside it.
NOT_COUNTED = ("evaluations", "the batch-size and learning-rate ramp-up", "stragglers and slow nodes",
               "data-pipeline stalls")

DEFAULT_RESTART = 10 * 60.0           # s from a failure to training again, re-load aside: editable assumption,
                                      # under the 16.7 min per interruption Llama 3's >90 % effective training
                                      # time allows (10 % of 54 days / 466 interruptions)
DEFAULT_STORAGE_BANDWIDTH = 2e12 / LLAMA3_GPUS   # B/s per device: Tectonic's 2 TB/s sustained throughput for
                                                 # the 16K-GPU Llama 3 jobs (Sec. 3.3.1), 122 MB/s per GPU
DEFAULT_CHECKPOINT_BYTES = 14.0       # per parameter: bf16 weights (2) + fp32 master weights (4) + Adam's two
                                      # fp32 moments (4 + 4), what Megatron-LM's and DeepSpeed's checkpoints hold
DEFAULT_HOST_BANDWIDTH = 16e9 * 16 * 128 / 130 / 8   # B/s per device: PCIe 4.0 x16, 31.5 GB/s per direction
DEFAULT_CHECKPOINT = "sync"


@dataclass(frozen=True)
class Reliability:
    """The goodput settings of a run, SI units: MTBF per device [s], restart time [s], checkpoint interval [s]
    (None: Young's optimum), storage write and read bandwidth per device [B/s], checkpoint bytes per
    parameter, host copy bandwidth per device [B/s] (async), checkpoint mode, and whether goodput is counted at
    all (``enabled`` False: every step trains, the figures of a perfect run)."""

    mtbf_s: float = DEFAULT_MTBF
    restart_s: float = DEFAULT_RESTART
    interval_s: float | None = None
    storage_bandwidth: float = DEFAULT_STORAGE_BANDWIDTH
    checkpoint_bytes_per_parameter: float = DEFAULT_CHECKPOINT_BYTES
    host_bandwidth: float = DEFAULT_HOST_BANDWIDTH
    checkpoint: str = DEFAULT_CHECKPOINT
    enabled: bool = True


def cluster_mtbf(mtbf_device_s: float, devices) -> np.ndarray:
    """Mean time between failures of a job on ``devices`` devices [s]: MTBF per device / devices (every device
    and its share of node, network and software failures fails the whole synchronous job)."""
    return mtbf_device_s / np.asarray(devices, dtype=float)


def checkpoint_write_s(state_bytes, devices, storage_bandwidth: float) -> np.ndarray:
    """Seconds to write (or read back) a checkpoint of ``state_bytes`` with every device writing its share at
    ``storage_bandwidth`` [B/s per device]: S / (devices x bandwidth)."""
    return np.asarray(state_bytes, dtype=float) / (np.asarray(devices, dtype=float) * storage_bandwidth)


def checkpoint_stall_s(rel: Reliability, state_bytes, devices) -> np.ndarray:
    """Seconds a checkpoint stops training: the whole write (sync), or the copy of each device's share to host
    memory (async: S / devices / host bandwidth)."""
    if rel.checkpoint == "async":
        return np.asarray(state_bytes, dtype=float) / np.asarray(devices, dtype=float) / rel.host_bandwidth
    return checkpoint_write_s(state_bytes, devices, rel.storage_bandwidth)


def young_interval_s(stall_s, mtbf_s) -> np.ndarray:
    """Young's optimal checkpoint interval sqrt(2 x C x M) [s] (Young 1974, CACM 17(9); Daly 2006 refines it
    with higher-order terms that matter only when C nears M)."""
    return np.sqrt(2.0 * np.asarray(stall_s, dtype=float) * np.asarray(mtbf_s, dtype=float))


def best_interval_s(stall_s, mtbf_s, restart_s) -> np.ndarray:
    """The interval that maximises ``goodput_fraction`` [s]: setting its derivative to 0 gives
    tau^2 + 2 C tau - 2 C (M - R) = 0, tau = sqrt(C^2 + 2 C (M - R)) - C; Young's sqrt(2 C M) when C and R are
    small against M (Daly 2006, FGCS 22(3), has the same -C correction). 0 where M <= R (nothing helps)."""
    stall = np.asarray(stall_s, dtype=float)
    spare = np.maximum(np.asarray(mtbf_s, dtype=float) - np.asarray(restart_s, dtype=float), 0.0)
    return np.sqrt(stall * stall + 2.0 * stall * spare) - stall


def goodput_fraction(interval_s, stall_s, restart_s, mtbf_s) -> np.ndarray:
    """Useful / total time: (1 - (R + tau / 2) / M) / (1 + C / tau), 0 where a failure comes before the work
    it redoes and the restart are done (R + tau / 2 >= M). A zero interval with a zero stall (nothing to
    write) counts no checkpoint time and no lost work."""
    tau, stall = np.asarray(interval_s, dtype=float), np.asarray(stall_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(tau > 0, stall / np.where(tau > 0, tau, 1.0), 0.0)
    useful = 1.0 - (np.asarray(restart_s, dtype=float) + tau / 2.0) / np.asarray(mtbf_s, dtype=float)
    return np.maximum(useful, 0.0) / (1.0 + ratio)


def run(rel: Reliability, devices, parameters, productive_s) -> dict:
    """The wall-clock time of a run whose steps take ``productive_s`` in all, and where it goes (arrays as the
    inputs; seconds): goodput, wall_s, checkpoint_time_s, restart_time_s, lost_work_s, failures (expected),
    and the terms: mtbf_s (the job's), checkpoint_bytes, checkpoint_write_s, checkpoint_stall_s,
    interval_s (used: the one given, else best_interval_s), young_interval_s, restart_s (per failure, re-load included). Without ``enabled``:
    goodput 1, no time lost."""
    productive = np.asarray(productive_s, dtype=float)
    state = np.asarray(parameters, dtype=float) * rel.checkpoint_bytes_per_parameter
    mtbf = cluster_mtbf(rel.mtbf_s, devices)
    write = checkpoint_write_s(state, devices, rel.storage_bandwidth)
    stall = checkpoint_stall_s(rel, state, devices)
    young = young_interval_s(stall, mtbf)
    restart = rel.restart_s + write
    tau = best_interval_s(stall, mtbf, restart) if rel.interval_s is None else np.full_like(young, rel.interval_s)
    if rel.interval_s is None and rel.checkpoint == "async":
        tau = np.maximum(tau, write)       # an async write must end before the next checkpoint starts
    if not rel.enabled:
        zero = np.zeros_like(productive)
        return {"goodput": np.ones_like(productive), "wall_s": productive, "checkpoint_time_s": zero,
                "restart_time_s": zero, "lost_work_s": zero, "failures": zero, "mtbf_s": mtbf,
                "checkpoint_bytes": state, "checkpoint_write_s": write, "checkpoint_stall_s": stall,
                "interval_s": tau, "young_interval_s": young, "restart_s": restart}
    g = goodput_fraction(tau, stall, restart, mtbf)
    with np.errstate(divide="ignore", invalid="ignore"):
        wall = np.where(g > 0, productive / np.where(g > 0, g, 1.0), math.inf)
        failures = wall / mtbf
        checkpoints = np.where(tau > 0, productive * stall / np.where(tau > 0, tau, 1.0), 0.0)
        redone = failures * tau / 2.0
    return {"goodput": g, "wall_s": wall, "checkpoint_time_s": checkpoints, "restart_time_s": failures * restart,
            "lost_work_s": redone, "failures": failures, "mtbf_s": mtbf, "checkpoint_bytes": state,
            "checkpoint_write_s": write, "checkpoint_stall_s": stall, "interval_s": tau, "young_interval_s": young,
            "restart_s": restart}
