"""The Python API: ``from comet_dse import estimate, search, whatif, sweep, load_model, load_cluster``.

Each function takes what the command of the same name takes, as Python values: a model or cluster
as a preset name, a file path or an object already loaded; strategy knobs as keywords named as on
``Strategy`` (docs/knobs.md); cluster resources to change as ``overrides={"hbm_capacity": "51.2 GiB"}``
and an expansion tier as ``expansion="512 GiB@64 GB/s"``. Results are typed (``Estimate``,
``SearchResults``, ``WhatIf``, ``SweepResults``) and convert to tables with ``to_arrow()`` (pyarrow)
and ``to_pandas()`` (pandas, an optional install). Bad input raises ``comet_dse.InputError`` naming the
field, with the message the command line prints. docs/api.md has runnable examples.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from comet_dse.answers.estimate import Estimate, estimate as _estimate
from comet_dse.answers.overrides import apply_overrides
from comet_dse.answers.whatif import DEFAULT_FACTORS, WhatIf, whatif as _whatif
from comet_dse.base.bounds import BOUNDS, shown
from comet_dse.base.errors import InputError
from comet_dse.base.tables import Tabular, arrow_to_pandas
from comet_dse.base.units import KIND_COUNT, parse_quantity
from comet_dse.design_space.search import SearchResult, search as _search, strategy_at
from comet_dse.design_space.space import SearchSpace, with_cluster_defaults
from comet_dse.hardware.efficiency import PHYSICAL
from comet_dse.hardware.load import physical_reading
from comet_dse.hardware.spec import Cluster
from comet_dse.model.spec import Transformer
from comet_dse.presets import catalog as presets
from comet_dse.strategy.declared import KNOB, Strategy, coerced
from comet_dse.strategy.knob import GIVEN
from comet_dse.whole_run.economics import token_budget, usd_amount
from comet_dse.workload.families import FAMILIES, family_of

__all__ = ["estimate", "search", "whatif", "plan", "sweep", "load_model", "load_cluster", "Estimate", "SearchResults",
           "SweepResults", "WhatIf", "Strategy", "SearchSpace", "InputError"]


def load_model(ref, seq_len: int | None = None) -> Transformer:
    """A model: a preset name (``"megatron-1t"``, ``"dlrm-dcnv2"``), a model YAML file, a Hugging Face
    ``config.json``, or a model spec of a workload family (``Transformer``, ``Recommendation``: returned as is);
    ``seq_len`` overrides a transformer's sequence length."""
    model = ref if isinstance(ref, tuple(f.model_type for f in FAMILIES)) else presets.load_model(str(ref))
    if seq_len is None:
        return model
    return model.with_seq_len(BOUNDS["seq_len"].check_integer("seq_len", seq_len))


def load_cluster(ref, overrides=None, expansion=None, physical: bool = False) -> Cluster:
    """A cluster: a preset name (``"tpu-v4"``), a cluster YAML file or a ``Cluster``, with an expansion
    tier added and resources changed as ``comet-dse --expansion`` and ``--set`` do.

    overrides: ``{"hbm_capacity": "51.2 GiB", "network.x.topology": "ring", "peak_flops": "x2"}``
      (names: ``comet_dse.answers.overrides.resource_names``); expansion: ``"512 GiB@64 GB/s"`` or a mapping
      ``{"capacity": ..., "bandwidth": ..., "latency": ...}``; physical: the burn-test tensor rate instead of
      the training efficiency measured on public runs (``--physical``; hardware/efficiency.py).
    """
    if not isinstance(physical, bool):
        raise InputError("physical", f"must be True or False, got {shown(physical)}")
    if physical:
        cluster = physical_reading(ref) if isinstance(ref, Cluster) else presets.load_cluster(str(ref), PHYSICAL)
    else:
        cluster = ref if isinstance(ref, Cluster) else presets.load_cluster(str(ref))
    if overrides or expansion is not None:
        cluster = apply_overrides(cluster, overrides or {}, expansion, where="overrides")
    return cluster


def estimate(model, cluster, devices: int, strategy: Strategy | dict | None = None, *, overrides=None,
             expansion=None, seq_len: int | None = None, tokens=None, physical: bool = False, **knobs) -> Estimate:
    """One training step of ``model`` on ``devices`` devices of ``cluster`` under one strategy.

    The strategy is a ``Strategy``, a dict of knobs, or keywords (``tp=8, pp=64, global_batch=512,
    recompute="selective"``); dp defaults to devices / (tp cp pp) as on the command line. An infeasible
    strategy is a result (``feasible`` False, ``reasons``), not an exception. ``physical``: as load_cluster.
    """
    model, cluster = load_model(model, seq_len), load_cluster(cluster, overrides, expansion, physical)
    if strategy is not None and not isinstance(strategy, (Strategy, dict)):
        raise InputError("strategy", f"must be a Strategy or a dict of knobs such as {{'tp': 8, 'pp': 2}} (or give "
                         f"the knobs as keywords: tp=8), got {shown(strategy)}")
    given = dict(strategy.to_dict() if isinstance(strategy, Strategy) else strategy or {})
    given.update(knobs)
    _check_knobs(given, "estimate")
    given = coerced(given)                     # tp=0 is one InputError, before dp is derived from it
    devices = BOUNDS["devices"].check_integer("devices", devices)
    tp, cp, pp = (given.get(n, 1) for n in ("tp", "cp", "pp"))
    if "dp" not in given:
        if devices % (tp * cp * pp):
            raise InputError("devices", f"{devices} is not a multiple of tp*cp*pp = {tp * cp * pp}; give dp")
        given["dp"] = devices // (tp * cp * pp)
    return with_band(_estimate(model, cluster, devices, Strategy(**given), tokens=token_budget(tokens)), cluster,
                     model)


def with_band(result: Estimate, cluster: Cluster, model: Transformer) -> Estimate:
    """``result`` with its error band (errorband.band_for: the validation residuals of this accelerator,
    precision and kind of model, or "not validated" with the nearest validated family as an assumption) and
    the training efficiency it ran at (hardware/efficiency.py: efficiency_summary)."""
    from dataclasses import replace

    from comet_dse.answers.errorband import band_of_cluster
    from comet_dse.hardware.efficiency import efficiency_summary
    from comet_dse.whole_run.economics import with_ranges

    dtype = result.inputs.get("strategy", {}).get("dtype", "bf16")
    band = band_of_cluster(cluster, dtype, bool(model.moe), kind=model.kind)
    efficiency = efficiency_summary(cluster.accelerator, cluster.efficiency_setting, dtype, model.moe, model.kind)
    return replace(result, error_band=band, training=with_ranges(result.training, band), efficiency=efficiency)


def _check_knobs(given: dict, what: str) -> None:
    unknown = sorted(set(given) - set(KNOB))
    if unknown:
        raise InputError(unknown[0], f"is not a strategy knob {what} takes; knobs: {', '.join(KNOB)}")


def _several(value, field: str, kinds: tuple) -> list:
    """One value of ``kinds`` or a list of them, as a list (``clusters='dgx-h100'`` was read letter by letter,
    ``devices=8`` was a raw TypeError)."""
    if isinstance(value, kinds) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, kinds) and not isinstance(v, bool)
                                                          for v in value):
        return list(value)
    words = {"str": "a name", "int": "an integer", "Path": "a path", "Cluster": "a Cluster"}
    names = " or ".join(words[k.__name__] for k in kinds)
    raise InputError(field, f"must be {names} or a non-empty list of them, got {shown(value)}")


@dataclass(frozen=True)
class SearchResults(Tabular):
    """Every evaluated strategy of a search, the feasible ones ranked fastest first.

    ``best`` (an Estimate with the full breakdown), ``strategy(rank)``, ``top(k)`` (rows as dicts),
    ``to_arrow()`` / ``to_pandas()`` (every point, one row each, columns as ``comet-dse search --output``);
    with a token budget (``tokens``) the columns and ``best`` hold time to train, energy and cost too.
    """

    model: Transformer
    cluster: Cluster
    devices: int
    global_batch: int
    result: SearchResult
    seconds: float
    tokens: float | None = None

    @property
    def evaluated(self) -> int:
        return self.result.evaluated

    @property
    def feasible(self) -> int:
        return self.result.feasible

    @property
    def infeasible_by_rule(self) -> dict:
        """Rule code -> strategies that break it (docs: studies/README.md, infeasible_mask)."""
        return dict(self.result.infeasible_by_rule)

    def strategy(self, rank: int = 1) -> Strategy:
        """The strategy ranked ``rank`` (1 = fastest that fits)."""
        if not 1 <= rank <= self.feasible:
            raise IndexError(f"rank {rank} is not in 1..{self.feasible} (the strategies that fit)")
        return strategy_at(self.result.columns, int(self.result.ranked[rank - 1]))

    def estimate(self, rank: int = 1) -> Estimate:
        """The full estimate (breakdown, memory by part) of the strategy ranked ``rank``."""
        return with_band(_estimate(self.model, self.cluster, self.devices, self.strategy(rank), tokens=self.tokens),
                         self.cluster, self.model)

    @property
    def best(self) -> Estimate | None:
        """The fastest strategy that fits, estimated in full; None when nothing fits."""
        return self.estimate(1) if self.feasible else None

    def top(self, k: int = 10) -> list:
        """The ``k`` fastest strategies that fit, as dicts (``rank`` plus every column)."""
        rows = self.to_arrow().take(self.result.ranked[:k]).to_pylist()
        return [{"rank": i + 1, **row} for i, row in enumerate(rows)]

    def rows(self) -> list:
        return self.to_arrow().to_pylist()

    def to_arrow(self, feasible_only: bool = False):
        """Every evaluated point (or only those that fit) as a ``pyarrow.Table``."""
        from comet_dse.design_space.output import to_arrow

        table = to_arrow(self.result.columns)
        return table.filter(self.result.columns["feasible"]) if feasible_only else table

    def to_pandas(self, feasible_only: bool = False):
        """Every evaluated point (or only those that fit) as a ``pandas.DataFrame``."""
        return arrow_to_pandas(self.to_arrow(feasible_only))


def _space(knobs: dict, mp, max_micro_batch: int, max_interleave: int, cluster=None, devices: int = 1,
           tp_across_nodes: bool = False) -> SearchSpace:
    """The knobs as a SearchSpace; with ``cluster``, the defaults that depend on it, as the command line's
    (design_space.space.with_cluster_defaults: flash attention where the accelerator has a fused-attention
    rate, TP inside the scale-up domain unless ``tp_across_nodes``)."""
    _check_knobs(knobs, "search")
    values = {k: v for k, v in knobs.items() if KNOB[k].search != GIVEN}
    space = SearchSpace(values, max_micro_batch, max_interleave, mp)
    if cluster is None:
        return space
    BOUNDS["devices"].check_integer("devices", devices)
    return with_cluster_defaults(space, cluster, devices, bool(tp_across_nodes))


def search(model, cluster, devices: int, global_batch: int, *, mp=None, overrides=None, expansion=None, tokens=None,
           seq_len: int | None = None, max_micro_batch: int = 16, max_interleave: int = 8,
           tp_across_nodes: bool = False, physical: bool = False, **knobs) -> SearchResults:
    """Evaluate every strategy (each knob a value or a list of values to try; ``mp``: model-parallel
    degrees MP = TP x PP to try) and rank those that fit, as ``comet-dse search`` does (its defaults too:
    flash attention where the cluster has a fused-attention rate, TP inside the scale-up domain unless
    ``tp_across_nodes`` or ``tp``/``mp`` say otherwise; ``physical``: as load_cluster)."""
    model, cluster = load_model(model, seq_len), load_cluster(cluster, overrides, expansion, physical)
    space = _space(knobs, mp, max_micro_batch, max_interleave, cluster, devices, tp_across_nodes)
    started = time.perf_counter()
    tokens = token_budget(tokens)
    result = _search(model, cluster, devices, global_batch, space, tokens=tokens)
    return SearchResults(model, cluster, devices, global_batch, result, time.perf_counter() - started, tokens)


def whatif(model, cluster, devices: int, global_batch: int, *, resources=None, factors=DEFAULT_FACTORS, tokens=None,
           capacity: str | None = "hbm_capacity", mp=None, overrides=None, expansion=None,
           seq_len: int | None = None, max_micro_batch: int = 16, max_interleave: int = 8,
           tp_across_nodes: bool = False, physical: bool = False, **knobs) -> WhatIf:
    """The best strategy's speedup with each resource scaled by each factor, and the smallest
    ``capacity`` at which the searched split fits (``comet-dse whatif``; answers/whatif.py), with search's defaults.
    Every scaled resource keeps the training efficiency of the measured family (``physical``: as load_cluster)."""
    model, cluster = load_model(model, seq_len), load_cluster(cluster, overrides, expansion, physical)
    space = _space(knobs, mp, max_micro_batch, max_interleave, cluster, devices, tp_across_nodes)
    return whatif_with_band(_whatif(model, cluster, devices, global_batch, space, resources, factors, capacity,
                                    token_budget(tokens)), cluster, model)


# A what-if cell's training figures: as the baseline's, the band's expected values (each cell's cluster is the
# baseline's with one resource scaled: the same family's band, extrapolated)
CELL_FIGURES = ("time_to_train_s", "energy_j", "training_cost_usd")


def whatif_with_band(result: WhatIf, cluster: Cluster, model: Transformer) -> WhatIf:
    """``result`` with its baseline's training figures given their ranges under the error band of the
    baseline's strategy (economics.with_ranges), as ``with_band`` gives an estimate's, and every cell's
    (CELL_FIGURES) the same band's expected values (economics.expected)."""
    from dataclasses import replace

    from comet_dse.answers.errorband import band_of_cluster
    from comet_dse.whole_run.economics import band_mean, expected, with_ranges

    base = result.baseline
    if not base.training or not base.strategy:
        return result
    band = band_of_cluster(cluster, base.strategy.get("dtype", "bf16"), bool(model.moe), kind=model.kind)
    mean = band_mean(band)
    cells = [replace(c, **{k: expected(getattr(c, k), mean) for k in CELL_FIGURES if getattr(c, k) is not None})
             for c in result.cells] if mean is not None else result.cells
    return replace(result, baseline=replace(base, training=with_ranges(base.training, band)), cells=cells)


def plan(model, tokens, global_batch: int, *, days: float | None = None, budget: float | None = None,
         clusters=None, devices=None, basis: str = "rent", seq_len: int | None = None, overrides=None,
         slow_end: bool = False, physical: bool = False, progress: bool = False):
    """The cheapest design (cluster preset, size, strategy) that trains ``tokens`` within ``days``, and the fastest
    within ``budget`` USD, across ``clusters`` (default every cluster preset) at ``devices`` (default
    plan.DEFAULT_DEVICES), as ``comet-dse plan`` does: a ``plan.Plan``. ``overrides`` apply to every cluster
    (goodput settings such as ``{"mtbf": "20000 h"}``); costs are all on ``basis`` (rent or own); ``slow_end``
    judges the deadline and the budget at the slow end of each design's error band; ``physical``: as load_cluster;
    ``progress``: a bar on stderr once the search of the designs has run for a second."""
    from comet_dse.answers import planner as planning
    from comet_dse.answers.errorband import band_of_cluster

    if basis not in ("rent", "own"):
        raise InputError("basis", f"must be rent or own, got {basis!r}")
    if days is None and budget is None:
        raise InputError("days", "give a deadline (days) or a budget, or both")
    deadline = (BOUNDS["deadline_days"].check("days", parse_quantity(days, KIND_COUNT, "days")) * 86400.0
                if days is not None else None)
    budget = BOUNDS["budget_usd"].check("budget", usd_amount(budget)) if budget is not None else None
    model = load_model(model, seq_len)
    tokens = token_budget(tokens)
    global_batch = BOUNDS["global_batch"].check_integer("global_batch", global_batch)
    names = _several(clusters, "clusters", (str, Path, Cluster)) if clusters else presets.preset_names("clusters")
    loaded = [load_cluster(c, overrides, physical=physical) for c in names]
    counts = tuple(BOUNDS["devices"].check_integer("devices", n)
                   for n in (_several(devices, "devices", (int,)) if devices else planning.DEFAULT_DEVICES))
    found = planning.candidates(model, loaded, counts, global_batch, tokens, band_of_cluster, progress=progress)
    return planning.Plan(model.name, tokens, global_batch, tuple(c.name for c in loaded), basis, deadline, budget,
                         found, bool(slow_end), unit=family_of(model).unit)


@dataclass(frozen=True)
class SweepResults(Tabular):
    """A study's results: the ranking ``comet-dse sweep`` prints (per variant: best strategy, speedup;
    the Pareto fronts) and every design point as a table."""

    study: str
    ranking: dict
    table: object               # pyarrow.Table: one row per design point (studies/README.md, result columns)
    path: Path | None           # the result file, when one was asked for

    def to_arrow(self):
        return self.table

    def rows(self) -> list:
        return self.table.to_pylist()

    @property
    def variants(self) -> list:
        """Per cluster variant: its label, best strategy, step time and speedup over the baseline."""
        return list(self.ranking.get("variants", []))


def sweep(study, output=None, *, workers: int = 1, top: int = 5, progress: bool = False) -> SweepResults:
    """Run a study (a study YAML path or a loaded ``Study``), as ``comet-dse sweep`` does.

    output: a ``.parquet`` or ``.csv`` file to write as well; without one the points are only kept in
    memory (``to_arrow()``), written to a temporary folder that is removed.
    """
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from comet_dse.design_space.engine import run_study
    from comet_dse.design_space.study import Study, load_study

    if not isinstance(study, (Study, str, Path)):
        raise InputError("study", f"must be a Study or the path of a study YAML, got {shown(study)}")
    loaded = study if isinstance(study, Study) else load_study(Path(study))
    if output is not None:
        path = Path(output)
        ranking = run_study(loaded, path, workers=workers, progress=progress, top_k=top)
        table = pq.read_table(path) if path.suffix.lower() != ".csv" else pacsv.read_csv(path)
        return SweepResults(loaded.name, ranking, table, path)
    with tempfile.TemporaryDirectory(prefix="comet-dse-sweep-") as folder:
        path = Path(folder) / "points.parquet"
        ranking = run_study(loaded, path, workers=workers, progress=progress, top_k=top)
        table = pq.read_table(path)
        table = table.combine_chunks() if table.num_rows else table
        ranking["output"] = None
    return SweepResults(loaded.name, ranking, table, None)
