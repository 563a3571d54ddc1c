"""Reading a study's result file into the numbers the COMET figures and tables need."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from comet_dse.base.vocabulary import BREAKDOWN_LABELS, WITH_TIED, time_label
from comet_dse.design_space.table import RULES

# The time parts the report draws: the vocabulary's, but the framework overhead (0 unless calibrated).
PARTS = tuple(k for k in BREAKDOWN_LABELS if k != "overhead")
PART_LABELS = {p: time_label(p) for p in PARTS}
MEMORY_BIT = 1 << RULES.index("memory")
COLUMNS = ("model", "variant", "devices", "feasible", "infeasible_mask", "step_time_s", "tokens_per_second", "mfu", "tp", "pp",
           "dp", "micro_batch", "interleave", "recompute", "sequence_parallel", "zero", "memory_per_device_bytes",
           "global_batch", "expansion_overlap", "expansion_roofline", *(f"time_{p}_s" for p in PARTS))


def load(path: Path, extra: tuple = ()) -> dict:
    """The columns the report uses, as numpy arrays (coded columns as strings); ``extra``: more strategy
    columns (a report's readings select rows by them), a choice by its names."""
    names = list(dict.fromkeys((*COLUMNS, *extra)))
    table = pq.read_table(path, columns=names)
    out = {}
    for name in names:
        col = table.column(name)
        if name == "recompute":
            out[name] = np.asarray(col.to_pylist(), dtype=object)
        elif pa.types.is_dictionary(col.type):
            whole = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            words = np.asarray(whole.dictionary.to_pylist(), dtype=object)
            out[name] = words[whole.indices.to_numpy(zero_copy_only=False)] if len(words) else np.asarray(
                [], dtype=object)
        else:
            out[name] = col.to_numpy()
    return out


@dataclass(frozen=True)
class Split:
    """The best strategy for one model-parallel degree MP = tp * pp of one cluster variant."""

    mp: int
    dp: int
    feasible: bool
    row: int | None          # index of the fastest feasible row, if any
    reason: str              # 'fits', 'memory' (every valid strategy is too big) or 'invalid'
    any_memory_row: int | None = None   # the fastest row that breaks no rule but perhaps memory
    least_memory: float = float("nan")  # bytes per device of the leanest such row

    @property
    def name(self) -> str:
        """The split as the COMET paper writes it, e.g. MP256_DP16."""
        return f"MP{self.mp}_DP{self.dp}"


def best_rows(data: dict) -> dict:
    """variant -> index of its fastest feasible row (variants with none are absent)."""
    out = {}
    for variant in np.unique(data["variant"]):
        rows = np.flatnonzero((data["variant"] == variant) & data["feasible"])
        if len(rows):
            out[int(variant)] = int(rows[np.argmin(data["step_time_s"][rows])])
    return out


def splits(data: dict, variant: int, where=None) -> list:
    """Per MP value of ``variant``: its fastest feasible strategy, or why none is feasible.

    Each split also names its fastest strategy with memory ignored (valid
    otherwise: the runtime the COMET paper plots for splits that do not fit)
    and the least memory such a strategy needs. ``where``: an optional
    boolean mask over the rows (e.g. some ZeRO stages only).
    """
    sel = data["variant"] == variant
    if where is not None:
        sel = sel & where
    mp_all = (data["tp"] * data["pp"])[sel]
    rows = np.flatnonzero(sel)
    out = []
    for mp in np.unique(mp_all):
        here = rows[mp_all == mp]
        ok = here[data["feasible"][here]]
        dp = int(data["dp"][here[0]])
        runnable = here[(data["infeasible_mask"][here] & ~MEMORY_BIT) == 0]
        fastest = int(runnable[np.argmin(data["step_time_s"][runnable])]) if len(runnable) else None
        least = float(data["memory_per_device_bytes"][runnable].min()) if len(runnable) else float("nan")
        if len(ok):
            best = int(ok[np.argmin(data["step_time_s"][ok])])
            out.append(Split(int(mp), dp, True, best, "fits", fastest, least))
        else:
            reason = "memory" if len(runnable) else "invalid"
            out.append(Split(int(mp), dp, False, None, reason, fastest, least))
    return out


def part_labels(models) -> dict:
    """Part -> label in a study's figures (the vocabulary's); where a model ties its embeddings the
    data-parallel part also holds their all-reduce between the first and last stage, and says so
    (vocabulary.dp_communication_label: on a DP1 split it is only that)."""
    tied = any(m.tied_embeddings for m in models)
    return {**PART_LABELS, "dp_communication": WITH_TIED} if tied else dict(PART_LABELS)


def breakdown(data: dict, row: int) -> dict:
    """Seconds per part of the step of one row."""
    return {p: float(data[f"time_{p}_s"][row]) for p in PARTS}
