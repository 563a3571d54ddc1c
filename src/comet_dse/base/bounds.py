"""Every bound on a numeric input, in one table (``BOUNDS``).

The command line's options, the Python API, the file readers (study, model YAML, Hugging Face
config.json, cluster YAML, calibration runs), ``--set`` and study axes, and the explorer's controls all
check a value against the same row here, so that no way in accepts what another refuses.
docs/reliability.md ("Bounds") lists the rows with the reason for each; a test holds that table to this
one. Values are in SI units (bytes, FLOP/s, bytes/s, seconds); a range is closed, [low, high].
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from comet_dse.base.errors import InputError

GiB, TiB = 2.0**30, 2.0**40


@dataclass(frozen=True)
class Bound:
    """The closed range [low, high] of one kind of input, and why it ends there."""

    low: float
    high: float
    why: str

    def check_integer(self, field: str, value) -> int:
        """``value`` as an int if it is a whole number (an int, a numpy integer, or a float such as 64.0; not a
        bool or text) in [low, high]; else an InputError naming ``field``."""
        whole = _whole(value)
        if whole is None or not self.low <= whole <= self.high:
            raise InputError(field, f"must be {self.integer_text()}, got {shown(value)}")
        return whole

    def integer_text(self) -> str:
        """How an error states the valid integers: 'a positive integer up to 1,000,000,000'."""
        if self.low == 1:
            return f"a positive integer up to {self.high:,.0f}"
        return f"an integer in [{self.low:,.0f}, {self.high:,.0f}]"

    def check(self, field: str, number: float, given: str | None = None) -> float:
        """``number`` (a finite float) if it lies in [low, high]; else an InputError naming ``field`` that
        writes the value as ``given`` (default: the number)."""
        if math.isfinite(number) and self.low <= number <= self.high:
            return number
        raise InputError(field, f"{given or f'{number:g}'} is outside the plausible range "
                                f"[{self.low:g}, {self.high:g}] in SI units")


def _whole(value) -> int | None:
    """``value`` as a Python int when it holds a whole number; None for a bool, text or a fraction."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    return int(value) if math.isfinite(value) and value == int(value) else None


def shown(value) -> str:
    """``value`` for an error line: a huge integer by its number of digits (Python refuses to print one of
    more than 4,300 digits), anything else by repr, cut at 60 characters."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        if abs(value) >= 10**4000:
            return "a number of more than 4,000 digits"
        return f"a {len(str(abs(value)))}-digit number"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


BOUNDS = {
    # counts: model and study files, config.json, the command line, the API, the explorer
    "integer": Bound(1, 10**9, "any count in a model or study file (layers, hidden, heads, ffn, vocab, experts, "
                               "micro-batch, interleave, ...): 1e9 is far past any real model, and products of "
                               "counts stay exact in float64"),
    "table_rows": Bound(1, 10**12, "rows of one embedding table of a recommendation model: production tables "
                        "reach billions of rows (Mudigere et al. 2022, arXiv:2104.05158); 1e12 rows of a few hundred "
                        "bytes keep byte counts exact in float64"),
    "seq_len": Bound(1, 10**9, "tokens per sequence: a count like any other; a long sequence is a result "
                               "(memory does not fit), not an error"),
    "global_batch": Bound(1, 10**9, "sequences per step: a search enumerates the divisors of the batch per "
                                    "replica (sqrt(n) steps each), a fraction of a second up to 1e9"),
    "devices": Bound(1, 10**7, "devices in one job: about 10x beyond the largest cluster built by 2026"),
    "strategies": Bound(1, 5_000_000, "strategies one search, what-if or explorer request evaluates at once, "
                                      "counted before they are built (about 1 KB each in memory); a sweep "
                                      "cuts its space into chunks and has --max-points instead"),
    # the accelerator (cluster files, study axes, --set, the explorer's controls); the top of each is
    # about 10x the fastest or largest real part, so that what-if studies stay possible
    "peak_flops": Bound(1e9, 1.25e18, "per device: 10x Cerebras WSE-3 (125 PFLOP/s); below 1 GFLOP/s is a "
                                      "missing unit, and step times would overflow"),
    "vector_flops": Bound(1e9, 1.25e18, "as peak_flops"),
    "hbm_capacity": Bound(1.0, 4 * TiB, "per device: over 10x the largest HBM stack set (288 GB) or a Dojo "
                                        "tile (160 GB)"),
    "sram_capacity": Bound(1.0, 512 * GiB, "on chip: about 10x WSE-3's 44 GB"),
    "expansion_capacity": Bound(0.0, 256 * TiB, "an expansion (CXL) tier; 0 leaves it unused"),
    "host_memory_capacity": Bound(0.0, 64 * TiB, "host memory per device: 0 leaves it unused; 64 TiB is over 10x the "
                           "largest host DRAM of a node (32 TiB) given to one device"),
    "memory_bandwidth": Bound(1e6, 2.1e17, "HBM, SRAM or expansion: 10x WSE-3's 21 PB/s on-chip bandwidth; "
                                           "below 1 MB/s is a missing unit"),
    "link_bandwidth": Bound(1e6, 9e13, "per link: 10x a Dojo training tile's 9 TB/s edge; below 1 MB/s is a "
                                       "missing unit"),
    "latency": Bound(0.0, 1.0, "a memory or network latency, or a kernel launch"),
    "overhead": Bound(0.0, 600.0, "a fixed cost per step or per micro-batch: beyond ten minutes is a typo"),
    "efficiency": Bound(1e-3, 1.0, "a fraction of a peak (GEMM, memory, attention, a link): below 0.1 % is "
                                   "a typo, and step times would overflow"),
    "matmul_tile": Bound(1, 65536, "a GEMM tile side (real ones are 64 to 256)"),
    "matmul_pipeline_overhead": Bound(0, 64, "iterations a GEMM's main loop spends filling its pipeline"),
    "reserved_memory": Bound(0.0, 4 * TiB, "device memory a job cannot use for its tensors (driver, runtime context, "
                                           "communication buffers), per device: 0 to the largest HBM bound; more "
                                           "than the device has leaves nothing, a result (no strategy fits)"),
    "fragmentation": Bound(0.0, 1.0, "allocator fragmentation, a fraction of the footprint: 0 (a static plan) up "
                                     "to doubling it"),
    "device_price_usd": Bound(1e-3, 1e8, "per device"),
    "device_power_w": Bound(1e-3, 2.3e5, "per device: 10x a Cerebras CS-3 (23 kW)"),
    # power, prices and the token budget (docs/economics.md): time to train, energy and cost
    "state_power_w": Bound(0.0, 2.3e5, "a device's draw while idle, memory-bound or communicating, or a "
                                       "per-device share of the switches: 0 to 10x a Cerebras CS-3"),
    "node_power_w": Bound(0.0, 2.3e6, "per node besides its devices (CPUs, NICs, fans): 0 to 100x a DGX "
                                      "H100's 4.6 kW"),
    "pue": Bound(1.0, 3.0, "power usage effectiveness: 1 is a data centre that spends nothing beyond its IT "
                           "load; above 3 is a typo (surveys average 1.5-1.6)"),
    "rent": Bound(1e-9, 10.0, "USD per device-second ($0.0000036 to $36,000 per device-hour): a positive price"),
    "energy_price": Bound(0.0, 1e-5, "USD per joule (0 to $36 per kWh); 0: free energy"),
    "lifetime": Bound(86400.0, 50 * 365.25 * 86400.0, "the years a device's purchase price is spread over: "
                                                       "one day to 50 years"),
    "unit_price": Bound(0.0, 1e6, "USD per SI unit of a resource (per byte, byte/s or FLOP/s): not negative"),
    "unit_power": Bound(0.0, 1e6, "W per SI unit of a resource: not negative"),
    # goodput (whole_run/goodput.py, docs/economics.md "Goodput"): failures, restarts and checkpoints
    "mtbf": Bound(60.0, 1e12, "mean time between failures per device: a minute to 31,700 years (Llama 3's "
                              "H100s: 5.8 years)"),
    "restart_time": Bound(0.0, 30 * 86400.0, "from a failure to training again: 0 (instant) to 30 days"),
    "checkpoint_interval": Bound(1.0, 365.25 * 86400.0, "between checkpoints: a second to a year"),
    "storage_bandwidth": Bound(1e3, 1e13, "per device, checkpoint storage or host copy: 1 kB/s to 10 TB/s "
                                          "(over 100x a PCIe 5.0 x16 link)"),
    "checkpoint_bytes": Bound(0.0, 64.0, "bytes a checkpoint holds per parameter: 0 (none written) to 64 "
                                         "(4x fp32 weights with two fp32 moments and more)"),
    # comet-dse plan: a deadline or a budget
    "deadline_days": Bound(0.001, 36525.0, "days a training may take: about a minute and a half to 100 years"),
    "budget_usd": Bound(1.0, 1e13, "USD a training may cost: $1 to $10 trillion"),
    "tokens": Bound(1.0, 1e18, "tokens to train: up to 1e18, over 10,000x the largest published runs (15T)"),
    # measurements (comet-dse calibrate)
    "measured_time": Bound(1e-6, 1e6, "a measured step time (iter_s, or tokens/s and MFU turned into one): "
                                      "1 us to 11.6 days"),
    "mfu": Bound(1e-6, 1.0, "a measured model FLOPs utilisation (calibrate): a fraction of the peak"),
    "relative_error": Bound(0.0, 1000.0, "an |error| a calibrated cluster file's `calibration:` block records (a "
                                         "fraction): a prediction 1,000x off is no fit to record"),
}
