"""Study files: models x cluster variants x device counts x strategies, as one design space.

A study (studies/*.yaml, documented in studies/README.md) names models, a
base cluster, the device counts, axes that vary the cluster, which strategy
knobs to search, and which figures `comet-dse report` draws (FIGURE_KINDS).
Cluster variants are the Cartesian product of the axes; each axis value is
absolute (``values``, with units) or relative to the base (``scale``).
"""
from __future__ import annotations

import dataclasses as dc
import functools
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from comet_dse.base.bounds import BOUNDS, shown
from comet_dse.base.errors import InputError
from comet_dse.base.loading import Fields, parse_yaml, read_text_file
from comet_dse.base.text import printable
from comet_dse.base.units import (
    KIND_BANDWIDTH, KIND_BYTES, KIND_COUNT, KIND_FLOPS, KIND_TIME, KIND_TOKENS, parse_quantity,
)
from comet_dse.design_space.space import SearchSpace, count_strategies, with_study_defaults
from comet_dse.hardware import economics_block as econ
from comet_dse.hardware.load import network_dim_from, refuse_repeated_names, tier_from
from comet_dse.hardware.spec import Cluster, Topology
from comet_dse.presets.catalog import load_cluster, load_model, preset_names
from comet_dse.strategy.declared import KNOBS
from comet_dse.strategy.knob import GIVEN
from comet_dse.whole_run.economics import check_design

# Axis name -> unit kind of its absolute values (KIND_COUNT = plain number, "text" = a name).
CLUSTER_AXES = {
    "peak_flops": KIND_FLOPS,
    "hbm_capacity": KIND_BYTES,
    "hbm_bandwidth": KIND_BANDWIDTH,
    "sram_capacity": KIND_BYTES,
    "sram_bandwidth": KIND_BANDWIDTH,
    "expansion_capacity": KIND_BYTES,
    "expansion_bandwidth": KIND_BANDWIDTH,
    "expansion_latency": KIND_TIME,
    "expansion_compute": KIND_FLOPS,
    "host_memory_capacity": KIND_BYTES,
    "host_memory_bandwidth": KIND_BANDWIDTH,
    "reserved_memory": KIND_BYTES,
    "workspace_memory": KIND_BYTES,
    "fragmentation": KIND_COUNT,
    "device_price_usd": KIND_COUNT,
    "device_power_w": KIND_COUNT,
    "network": "text",
    "network_bandwidth": KIND_BANDWIDTH,
    "network_latency": KIND_TIME,
}
# bandwidth: per device per direction (it sets link_bandwidth = value / links_per_device); link_bandwidth: per link.
DIM_AXES = {"bandwidth": KIND_BANDWIDTH, "link_bandwidth": KIND_BANDWIDTH, "latency": KIND_TIME,
            "efficiency": KIND_COUNT, "topology": "text", "size": KIND_COUNT}

# The value an axis sets -> its row of bounds.BOUNDS: the bounds a cluster file's field is checked against
# (hardware.load), so that no variant holds a value a cluster file could not. Every value is checked as
# it is applied, absolute or scaled. An expansion capacity of 0 is allowed: the tier is then unused (the
# baseline of an expansion study).
AXIS_BOUNDS = {
    "peak_flops": BOUNDS["peak_flops"],
    "hbm_capacity": BOUNDS["hbm_capacity"],
    "hbm_bandwidth": BOUNDS["memory_bandwidth"],
    "sram_capacity": BOUNDS["sram_capacity"],
    "sram_bandwidth": BOUNDS["memory_bandwidth"],
    "expansion_capacity": BOUNDS["expansion_capacity"],
    "expansion_bandwidth": BOUNDS["memory_bandwidth"],
    "expansion_latency": BOUNDS["latency"],
    "expansion_compute": BOUNDS["peak_flops"],
    "host_memory_capacity": BOUNDS["host_memory_capacity"],
    "host_memory_bandwidth": BOUNDS["memory_bandwidth"],
    "reserved_memory": BOUNDS["reserved_memory"],
    "workspace_memory": BOUNDS["reserved_memory"],
    "fragmentation": BOUNDS["fragmentation"],
    "device_price_usd": BOUNDS["device_price_usd"],
    "device_power_w": BOUNDS["device_power_w"],
    "link_bandwidth": BOUNDS["link_bandwidth"],
    "latency": BOUNDS["latency"],
    "efficiency": BOUNDS["efficiency"],
}
# (highest plausible value, whether 0 is allowed) of each axis, as whatif's bisection reads them.
AXIS_LIMITS = {name: (bound.high, bound.low == 0.0) for name, bound in AXIS_BOUNDS.items()}

MAX_VARIANTS = 100_000        # cluster variants of one study (each is built and held in memory)

# The scale axes the resource-doubling figure doubles, each from x1 to x2.
DOUBLED_RESOURCES = ("peak_flops", "hbm_capacity", "hbm_bandwidth", "network_bandwidth")


@dataclass(frozen=True)
class AxisNeed:
    """An axis a figure kind reads: its name, how it is given, and multipliers it must list."""

    axis: str
    mode: str                  # "scale" (multipliers) or "value" (absolute values or names)
    includes: tuple = ()       # multipliers the axis must list (scale axes only)


# Figure kind (the study's `figures:` list, drawn by `comet-dse report`) -> the axes it needs.
FIGURE_KINDS = {
    "pareto": (),
    "speedup": (),
    "parallelism-splits": (),
    "resource-doubling": tuple(AxisNeed(a, "scale", (1.0, 2.0)) for a in DOUBLED_RESOURCES),
    "capacity": (AxisNeed("hbm_capacity", "scale"),),
    "network": (AxisNeed("network", "value"), AxisNeed("network_bandwidth", "scale")),
    "expansion": (AxisNeed("expansion_capacity", "value"), AxisNeed("expansion_bandwidth", "value")),
    "recommendation-tiers": (AxisNeed("expansion_capacity", "value"), AxisNeed("expansion_bandwidth", "value")),
    "first-fit": (AxisNeed("hbm_capacity", "scale"),),
}


@dataclass(frozen=True)
class Variant:
    """One cluster variant: index, per-axis labels and values, the cluster, its device counts and batch."""

    index: int
    labels: dict          # axis -> the value as written in the study ("x1.6", "25 GB/s", a cluster name)
    values: dict          # axis -> numeric SI value or name ("cluster" -> preset name with several clusters)
    cluster: Cluster
    devices: tuple
    global_batch: int

    @property
    def label(self) -> str:
        """Readable name, e.g. 'cluster=tpu-v4, hbm_capacity=x1.6' ('base' with no axes)."""
        return ", ".join(f"{k}={v}" for k, v in self.labels.items()) or "base"


@dataclass
class Study:
    name: str
    description: str
    models: list
    variants: list
    baseline: int
    space: SearchSpace
    token_budget: float | None = None
    output: str | None = None
    source_text: str = field(default="", repr=False)
    figures: tuple = ("speedup",)      # figure kinds the report draws (FIGURE_KINDS), in order
    points: int = 0                    # design points: models x variants x devices x strategies
    inputs: dict = field(default_factory=dict, repr=False)   # what the results depend on -> its digest
    files: tuple = ()                  # the study file and every model or cluster file it names
    mp: dict = field(default_factory=dict)   # base cluster name -> the MP = tp x pp degrees searched there (`mp:`)

    def space_for(self, variant: "Variant") -> SearchSpace:
        """The strategy space of one variant: the study's, with its cluster's MP grid (``mp``) where it has one."""
        grid = self.mp.get(variant.cluster.name)
        return self.space if grid is None else dc.replace(self.space, mp=grid)

    def strategy_key(self, variant: "Variant") -> tuple:
        """What, besides the model, device count and batch, decides a variant's strategies: its MP grid."""
        return self.mp.get(variant.cluster.name, ())

    def fingerprint(self) -> str:
        """Identifies the results: the same digest means the same study text, models, clusters and code."""
        return _digest(json.dumps(self.inputs, sort_keys=True))

    @property
    def file_stem(self) -> str:
        """The name made safe as a file name (no folders, no leading dot): what the report's files are named."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name).strip(".-")[:100] or "study"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """Digest of the package version and of every module of comet_dse (its code decides every result)."""
    from comet_dse.version import __version__

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(__version__.encode())
    for module in sorted(root.rglob("*.py")):
        h.update(str(module.relative_to(root)).encode() + b"\0" + module.read_bytes())
    return h.hexdigest()[:16]


def load_study(path: Path, max_points: int | None = None, overrides: dict | None = None) -> Study:
    """Read and validate a study file; every error names the field.

    The design points are counted before any cluster variant is built: a study
    of more than ``max_points`` (None: no limit) is refused with its count.
    ``overrides``: top-level fields that replace the file's (a report's readings,
    report/readings.py), e.g. {"seq_len": 1024, "global_batch": 4096, "name": ...}; a mapping merges into
    the file's mapping of that name (e.g. {"expansion": {"compute": "10 TFLOP/s"}}).
    """
    path = Path(path)
    text = read_text_file(path, "study")
    if overrides:
        import yaml

        data = parse_yaml(text, path, "study")
        if not isinstance(data, dict):
            raise InputError("study", f"{path} must hold a mapping of fields")
        merged = {k: {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
                  for k, v in overrides.items()}
        text = yaml.safe_dump({**data, **merged}, sort_keys=False)
    f = Fields(parse_yaml(text, path, "study"), "")
    if not f.has("models") or f.raw("models") in ([], ""):
        raise InputError("models", "give at least one: a model YAML, a config.json or a preset "
                         f"({', '.join(preset_names('models'))})")
    models = [str(m) for m in _as_list(f.raw("models"), "models")]
    seq_len = f.integer("seq_len", None, bound="seq_len")
    loaded = [load_model(m) for m in models]
    if seq_len:
        loaded = [m.with_seq_len(seq_len) for m in loaded]
    bases = _clusters(f)
    refs = [str(c) for c in _as_list(f.raw("cluster" if f.has("cluster") else "clusters"), "clusters")]
    inputs = {"study": _digest(text), "code": code_digest(),
              **{f"model {m}": _digest(repr(t)) for m, t in zip(models, loaded)},
              **{f"cluster {c}": _digest(repr(b)) for c, b in zip(refs, bases)}}
    devices = _per_cluster(f, "devices", bases, many=True)
    batches = _per_cluster(f, "global_batch", bases, many=False)
    if f.has("expansion"):
        tier = tier_from(f.sub("expansion"), "expansion", True)
        bases = [dc.replace(b, accelerator=dc.replace(b.accelerator, expansion=tier)) for b in bases]
    networks = _networks(f, bases[0])
    axes = _axes(f, bases, networks)
    space = with_study_defaults(_space(f), bases)
    grids = _mp_grids(f, bases)
    per_base = math.prod(len(values) for values in axes.values())
    points, exact = _count_points(loaded, bases, devices, batches, per_base, space, max_points, grids)
    if max_points is not None and points > max_points:
        raise InputError("max-points", f"the study has {'' if exact else 'more than '}{points:,} design points, "
                         f"above the limit of {max_points:,}; narrow its axes or strategy lists, or raise "
                         "--max-points")
    if len(bases) * per_base > MAX_VARIANTS:
        raise InputError("axes", f"the clusters and axes make {len(bases) * per_base:,} cluster variants; "
                         f"at most {MAX_VARIANTS:,}")
    variants = _variants(bases, devices, batches, axes, networks)
    baseline = _baseline(f, axes, variants, len(bases) > 1)
    kinds = _figures(f, axes)
    budget = f.quantity("token_budget", KIND_TOKENS, None, bound="tokens")
    files = tuple(Path(r) for r in [str(path)] + models + refs if r.endswith((".yaml", ".yml", ".json")))
    study = Study(name=printable(f.text("name", path.stem)), description=printable(f.text("description", "")),
                  models=loaded,
                  variants=variants, baseline=baseline,
                  space=space, token_budget=budget, output=_output(f),
                  source_text=text, figures=kinds, points=points, inputs=inputs, files=files, mp=grids)
    f.reject_unknown()
    return study


def _count_points(models: list, bases: list, devices: dict, batches: dict, per_base: int, space: SearchSpace,
                  limit: int | None, grids: dict | None = None) -> tuple:
    """(design points, exact): for each base cluster, its variants x models x device counts x strategies.
    Not exact (a lower bound above ``limit``) when one model and device count alone exceeds ``limit``.
    ``grids``: base cluster name -> its MP grid (``mp:``)."""
    total, exact, counts = 0, True, {}
    grids = grids or {}
    for base in bases:
        grid = grids.get(base.name)
        here = space if grid is None else dc.replace(space, mp=grid)
        for model in models:
            for n in devices[base.name]:
                key = (id(model), n, batches[base.name], grid)
                if key not in counts:
                    counts[key] = count_strategies(model, n, batches[base.name], here, limit)
                    exact = exact and (limit is None or counts[key] <= limit)
                total += per_base * counts[key]
    return total, exact


def _mp_grids(f: Fields, bases: list) -> dict:
    """`mp:` the model-parallel degrees MP = tp x pp searched: one list for every cluster, or per cluster
    (`{tpu-v4: [1, 4, 16, 64, 256, 1024, 4096]}`; a cluster not named keeps every MP). Base cluster name ->
    tuple; empty when the study has no `mp:`."""
    if not f.has("mp"):
        return {}
    raw = f.raw("mp")

    def grid(value, where: str) -> tuple:
        items = value if isinstance(value, list) else [value]
        if not items or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in items):
            raise InputError(where, f"must be a positive integer or a list of them, got {shown(value)}")
        return tuple(dict.fromkeys(items))

    if isinstance(raw, dict):
        names = {c.name for c in bases}
        extra = sorted(set(map(str, raw)) - names)
        if extra:
            raise InputError(f"mp.{extra[0]}", f"is not one of the study's clusters ({', '.join(sorted(names))})")
        return {str(name): grid(value, f"mp.{name}") for name, value in raw.items()}
    return {c.name: grid(raw, "mp") for c in bases}


def _output(f: Fields) -> str | None:
    """The study's default result file: a relative path that stays inside the current folder."""
    text = f.text("output", "")
    if not text:
        return None
    path = Path(text)
    if path.is_absolute() or ".." in path.parts or path.name.startswith("."):
        raise InputError("output", f"{text!r} must be a relative path inside the current folder (no '..'); "
                         "pass --output to write elsewhere")
    return text


def _as_list(value, field_name: str) -> list:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise InputError(field_name, "is an empty list; give at least one value")
    return items


def _positive_int(value, field_name: str, bound: str) -> int:
    """``value`` if it is an integer in the row ``bound`` of bounds.BOUNDS (devices, global_batch)."""
    row = BOUNDS[bound]
    if isinstance(value, bool) or not isinstance(value, int) or not row.low <= value <= row.high:
        raise InputError(field_name, f"must hold positive integers up to {row.high:,}, got {shown(value)}")
    return value


def _clusters(f: Fields) -> list:
    """The base clusters: `cluster: NAME` or `clusters: [NAME, ...]` (presets or YAML files)."""
    if f.has("cluster") == f.has("clusters") or f.raw("cluster", None) == "" or f.raw("clusters", None) == []:
        raise InputError("cluster", "give exactly one of `cluster: NAME` or `clusters: [NAME, ...]`, each a cluster "
                         f"YAML or a preset ({', '.join(preset_names('clusters'))})")
    if f.has("cluster"):
        return [load_cluster(str(f.raw("cluster")))]
    refs = _as_list(f.raw("clusters"), "clusters")
    clusters = [load_cluster(str(r)) for r in refs]
    if len({c.name for c in clusters}) != len(clusters):
        raise InputError("clusters", "lists a cluster twice")
    return clusters


def _per_cluster(f: Fields, key: str, bases: list, many: bool) -> dict:
    """Cluster name -> value(s) of ``key``: one value (or list) for all, or `{cluster: value}`.

    many: device counts (a list per cluster, each checked against the network);
    otherwise one positive integer per cluster (the global batch).
    """
    raw = f.raw(key)

    def read(value, where):
        if many:
            return [_positive_int(x, where, key) for x in _as_list(value, where)]
        return _positive_int(value, where, key)

    if isinstance(raw, dict):
        out = {}
        for c in bases:
            if c.name not in raw:
                raise InputError(f"{key}.{c.name}", f"is missing: give the {key} of every cluster")
            out[c.name] = read(raw[c.name], f"{key}.{c.name}")
        extra = set(raw) - {c.name for c in bases}
        if extra:
            raise InputError(f"{key}.{sorted(extra)[0]}", "is not one of the study's clusters")
    else:
        value = read(raw, key)
        out = {c.name: value for c in bases}
    if many:
        for c in bases:
            for n in out[c.name]:
                try:
                    c.dim_sizes(n)
                except InputError as exc:
                    raise InputError(f"{key}.{c.name}" if isinstance(raw, dict) else key, exc.message) from None
    return out


def _networks(f: Fields, base: Cluster) -> dict:
    """Named alternative networks (for the ``network`` axis); 'base' is the cluster's own."""
    out = {"base": base.network}
    if not f.has("networks"):
        return out
    raw = f.raw("networks")
    if not isinstance(raw, dict) or not raw:
        raise InputError("networks", "must map names to lists of network dimensions")
    for name, dims in raw.items():
        if not isinstance(dims, list) or not dims:
            raise InputError(f"networks.{name}", "must be a non-empty list of dimensions, innermost first")
        out[str(name)] = tuple(network_dim_from(Fields(d, f"networks.{name}[{i}]"), i == len(dims) - 1)
                               for i, d in enumerate(dims))
        refuse_repeated_names(out[str(name)], f"networks.{name}")
    return out


def _axis_values(name: str, spec, kind: str, networks: dict) -> list:
    """[(label, ('scale' | 'value', number or name))] for one axis specification."""
    if isinstance(spec, list):
        spec = {"values": spec}
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in ("values", "scale"):
        raise InputError(f"axes.{name}", "must be {values: [...]} (absolute, with units) or {scale: [...]} (multipliers)")
    mode, items = next(iter(spec.items()))
    if not isinstance(items, list) or not items:
        raise InputError(f"axes.{name}.{mode}", "is empty; give at least one value")
    out = []
    for item in items:
        where = f"axes.{name}.{mode}"
        if mode == "scale":
            if kind == "text" or name in econ.CHOICES:
                raise InputError(where, f"{name} takes named values, not multipliers")
            number = parse_quantity(item, KIND_COUNT, where)          # finite
            if number <= 0:
                raise InputError(where, f"multipliers must be positive finite numbers, got {item!r}")
            out.append((_scale_label(number), ("scale", number)))
        elif kind == "economics":         # power and price (hardware/economics_block.py): parsed and checked here
            out.append((str(item), ("value", econ.parse_setting(name, item, where))))
        elif kind == "text":
            valid = networks if name == "network" else [t.value for t in Topology]
            if str(item) not in valid:
                raise InputError(where, f"unknown {name} {item!r}; valid: {', '.join(valid)}")
            out.append((str(item), ("value", str(item))))
        else:
            number = parse_quantity(item, kind, where)      # finite; the range is checked as it is applied
            out.append((str(item), ("value", number)))
    return out


def _axes(f: Fields, bases: list, networks: dict) -> dict:
    """Axis name -> list of (label, setting)."""
    if not f.has("axes"):
        return {}
    raw = f.raw("axes")
    if not isinstance(raw, dict):
        raise InputError("axes", "must map axis names to {values: [...]} or {scale: [...]}")
    dim_names = {d.name for net in networks.values() for d in net}
    axes = {}
    for name, spec in raw.items():
        if name in CLUSTER_AXES:
            kind = CLUSTER_AXES[name]
        elif name.startswith("network.") and name.count(".") == 2:
            _, dim, attr = name.split(".")
            if dim not in dim_names or attr not in DIM_AXES:
                raise InputError(f"axes.{name}", f"unknown network axis; dimensions are {', '.join(sorted(dim_names))}, "
                                 f"fields {', '.join(DIM_AXES)}")
            kind = DIM_AXES[attr]
        elif econ.is_setting(name):
            kind = "economics"
            _check_priced(name, bases)
        else:
            known = ", ".join(list(CLUSTER_AXES) + ["network.<dimension>.<" + "|".join(DIM_AXES) + ">"])
            raise InputError(f"axes.{name}", f"unknown axis; known axes: {known}")
        if name.startswith("expansion_") and any(b.accelerator.expansion is None for b in bases):
            raise InputError(f"axes.{name}", "the cluster has no expansion tier; add one with a top-level `expansion:`")
        if name.startswith("host_memory_") and any(b.accelerator.host is None for b in bases):
            raise InputError(f"axes.{name}", "the cluster has no host memory tier; give one in its cluster file "
                             "(accelerator.memory.host: capacity and bandwidth)")
        axes[name] = _axis_values(name, spec, kind, networks)
    return axes


def _check_priced(name: str, bases: list) -> None:
    """Refuse a per-unit price or power axis for a resource the base clusters do not have."""
    if name.startswith(("unit_price.", "unit_power.")):
        known = econ.resource_names(bases[0])
        if name.split(".", 1)[1] not in known:
            raise InputError(f"axes.{name}", f"not a resource with a per-unit figure; known: {', '.join(known)}")


def _apply_economics(cluster: Cluster, name: str, label: str, mode: str, x) -> Cluster:
    """``cluster`` with an economics setting (hardware/economics_block.py) set: a value (already parsed and
    checked) or a multiplier of the cluster's own value, checked against the same row of bounds."""
    where = f"axes.{name}.{'scale' if mode == 'scale' else 'values'}"
    if mode == "scale":
        base_value = econ.current(cluster, name)
        if base_value is None:
            raise InputError(where, f"{cluster.name} has no {name} to scale; give a value")
        row = name.split(".", 1)[0] if name.startswith(("unit_price.", "unit_power.")) else econ.FIELDS[name][1]
        x = BOUNDS[row].check(where, base_value * x, f"{label} of {cluster.name}'s {base_value:g} = {base_value * x:g}")
    return econ.with_setting(cluster, name, x)


def _apply(cluster: Cluster, name: str, label: str, setting: tuple, networks: dict) -> Cluster:
    """``cluster`` with axis ``name`` set to ``setting``; every value it sets is checked against AXIS_BOUNDS."""
    mode, x = setting
    acc = cluster.accelerator
    if econ.is_setting(name):
        return _apply_economics(cluster, name, label, mode, x)

    def scaled(base_value, limit: str = name, links: int = 1):
        """The new value (``links`` > 1: a per-device bandwidth, returned per link), checked against the limit."""
        value = base_value * x if mode == "scale" else x
        shown = f"{label} of {cluster.name}'s {base_value:g} = {value:g}" if mode == "scale" else label
        if links != 1:
            shown += f" per device = {value / links:g} per link ({links} links)"
        where = f"axes.{name}.{'scale' if mode == 'scale' else 'values'}"
        return AXIS_BOUNDS[limit].check(where, value / links, shown)

    if name == "peak_flops":
        peaks = {k: scaled(v) for k, v in acc.peak_flops.items()}
        return dc.replace(cluster, accelerator=dc.replace(acc, peak_flops=peaks))
    if name in ("hbm_capacity", "hbm_bandwidth", "sram_capacity", "sram_bandwidth",
                "expansion_capacity", "expansion_bandwidth", "expansion_latency", "expansion_compute",
                "host_memory_capacity", "host_memory_bandwidth"):
        tier_name, attr = name.replace("host_memory_", "host_").split("_", 1)
        tier = getattr(acc, tier_name)
        if mode == "scale" and getattr(tier, attr) is None:      # the tier's compute roof: none unless given
            raise InputError(f"axes.{name}", f"{cluster.name}'s expansion tier has no compute roof to scale; "
                             "give values in FLOP/s")
        tier = dc.replace(tier, **{attr: scaled(getattr(tier, attr))})
        return dc.replace(cluster, accelerator=dc.replace(acc, **{tier_name: tier}))
    if name in ("reserved_memory", "workspace_memory", "fragmentation"):   # memory a job cannot use (docs/hardware.md)
        return dc.replace(cluster, **{name: scaled(getattr(cluster, name))})
    if name in ("device_price_usd", "device_power_w"):
        base_value = getattr(cluster, name)
        if mode == "scale" and base_value is None:
            raise InputError(f"axes.{name}", f"{cluster.name} has no {name} to scale; give values")
        return dc.replace(cluster, **{name: scaled(base_value)})
    if name == "network":
        return dc.replace(cluster, network=networks[x])
    if name in ("network_bandwidth", "network_latency"):
        attr = "link_bandwidth" if name == "network_bandwidth" else "latency"
        dims = tuple(dc.replace(d, **{attr: scaled(getattr(d, attr), attr)}) for d in cluster.network)
        return dc.replace(cluster, network=dims)
    _, dim_name, attr = name.split(".")
    dims = []
    for dim in cluster.network:
        if dim.name == dim_name and attr == "size":
            dim = dc.replace(dim, size=_domain_size(cluster, dim, name, label, mode, x))
        elif dim.name == dim_name and attr == "bandwidth":     # per device per direction
            dim = dc.replace(dim, link_bandwidth=scaled(dim.bandwidth, "link_bandwidth", dim.links_per_device))
        elif dim.name == dim_name:
            value = Topology(x) if attr == "topology" else scaled(getattr(dim, attr), attr)
            dim = dc.replace(dim, **{attr: value})
        dims.append(dim)
    return dc.replace(cluster, network=tuple(dims))


def _domain_size(cluster: Cluster, dim, name: str, label: str, mode: str, x) -> int:
    """A scale-up domain resized to ``x`` devices (``x`` times its own size where ``mode`` is 'scale'): a whole
    number from 1 to the dimension's own size. A cluster's dimension size is the most devices its hardware joins
    there (GB200 NVL72: 72 over NVLink), so a smaller domain is a choice (NVL36 racks, partitions) and a larger
    one another machine, refused: write that machine's cluster file instead. Only switched and fully connected
    dimensions below the outermost: the outermost spans as many nodes as the job needs, and a torus dimension's
    size is its slice shape, which the device count chooses (hardware/slices.py)."""
    where = f"axes.{name}"
    if dim.size is None:
        raise InputError(where, f"{dim.name} is {cluster.name}'s outermost dimension: it spans as many nodes as "
                         "the job needs and has no size to set")
    if dim.topology in (Topology.TORUS, Topology.RING, Topology.MESH):
        raise InputError(where, f"{dim.name} is a {dim.topology.value} dimension: its size is the slice shape the "
                         "device count chooses; set only the size of a switched or fully connected domain")
    value = dim.size * x if mode == "scale" else x
    shown = f"{label} ({value:g} devices)" if mode == "scale" else label
    if value > dim.size:
        raise InputError(where, f"{shown} is beyond {cluster.name}'s {dim.name} domain of {dim.size} devices; valid: "
                         f"1 to {dim.size} (a larger domain is another machine: write its cluster file)")
    if value != int(value) or value < 1:
        raise InputError(where, f"{shown} is not a whole number of devices from 1 to {dim.size}")
    return int(value)


def _variants(bases: list, devices: dict, batches: dict, axes: dict, networks: dict) -> list:
    """Every cluster x every combination of axis values (the network axis is applied first)."""
    names = sorted(axes, key=lambda n: (n != "network", list(axes).index(n)))
    variants = []
    for base in bases:
        for combo in itertools.product(*(axes[n] for n in names)):
            cluster = base
            values = {"cluster": base.name} if len(bases) > 1 else {}
            labels = dict(values)
            for name, (label, setting) in zip(names, combo):
                cluster = _apply(cluster, name, label, setting, networks)
                values[name] = setting[1]
                labels[name] = label
            check_design(cluster, f"axes ({', '.join(f'{k}={v}' for k, v in labels.items())})")
            variants.append(Variant(index=len(variants), labels=labels, values=values,
                                    cluster=cluster, devices=tuple(devices[base.name]),
                                    global_batch=batches[base.name]))
    return variants


def _scale_label(value):
    """A scale axis's label for ``value`` ("x1.5"): how axes name multipliers and how a baseline given as a
    number finds one; None when ``value`` is not a number a float can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return f"x{float(value):g}"
    except OverflowError:          # an integer beyond float range
        return None


def _baseline(f: Fields, axes: dict, variants: list, several_clusters: bool) -> int:
    """Index of the baseline variant: `baseline: {axis: label}`; default every axis at its first value."""
    if not f.has("baseline"):
        return 0
    raw = f.raw("baseline")
    if not isinstance(raw, dict):
        raise InputError("baseline", "must map axis names to one of their values, e.g. {hbm_capacity: 1.0}")
    choices = {name: [label for label, _ in values] for name, values in axes.items()}
    if several_clusters:
        choices = {"cluster": list(dict.fromkeys(v.values["cluster"] for v in variants)), **choices}
    wanted = {}
    for name, value in raw.items():
        if name not in choices:
            raise InputError(f"baseline.{name}", f"is not an axis of this study ({', '.join(choices) or 'none'})")
        scaled = _scale_label(value)
        text = scaled if scaled in choices[name] else str(value)
        if text not in choices[name]:
            raise InputError(f"baseline.{name}", f"{value!r} is not one of {', '.join(choices[name])}")
        wanted[name] = text
    for variant in variants:
        if all(variant.labels[k] == wanted.get(k, choices[k][0]) for k in choices):
            return variant.index
    return 0


def _figures(f: Fields, axes: dict) -> tuple:
    """The figure kinds of `figures:` (default: speedup), each checked against the axes it reads."""
    kinds = tuple(str(k) for k in _as_list(f.raw("figures", ["speedup"]), "figures"))
    for kind in kinds:
        if kind not in FIGURE_KINDS:
            raise InputError("figures", f"unknown figure kind {kind!r}; valid: {', '.join(FIGURE_KINDS)}")
        for need in FIGURE_KINDS[kind]:
            _check_need(kind, need, axes)
    if len(set(kinds)) != len(kinds):
        raise InputError("figures", "lists a figure kind twice")
    return kinds


def _check_need(kind: str, need: AxisNeed, axes: dict) -> None:
    """Raise InputError('figures', ...) unless ``axes`` gives ``need.axis`` the way ``kind`` reads it."""
    how = "{scale: [...]} (multipliers)" if need.mode == "scale" else "{values: [...]}"
    if need.axis not in axes:
        raise InputError("figures", f"{kind!r} needs the axis {need.axis}: {how}; the study has no such axis")
    settings = [setting for _, setting in axes[need.axis]]
    if any(mode != need.mode for mode, _ in settings):
        raise InputError("figures", f"{kind!r} needs the axis {need.axis} as {how}")
    missing = [x for x in need.includes if x not in {value for _, value in settings}]
    if missing:
        listed = ", ".join(f"{x:g}" for x in need.includes)
        raise InputError("figures", f"{kind!r} needs the axis {need.axis} to list the multipliers {listed}; "
                         f"it lacks {', '.join(f'{x:g}' for x in missing)}")


def _space(f: Fields) -> SearchSpace:
    """The `strategy:` block: each searched knob (strategy.KNOBS) as a value or a list of values to try,
    plus the caps max_micro_batch and max_interleave."""
    if not f.has("strategy"):
        return SearchSpace()
    s = f.sub("strategy")
    if "global_batch" in s.data:
        raise InputError("strategy.global_batch", "is set per study: move it to the top-level `global_batch:`")
    values = {k.name: s.raw(k.name, None) for k in KNOBS if k.search != GIVEN}   # every key read: known
    caps = {key: s.integer(key, None) for key in ("max_micro_batch", "max_interleave")}
    s.reject_unknown()
    return SearchSpace({k: v for k, v in values.items() if v is not None},
                       **{k: v for k, v in caps.items() if v is not None})


def describe(study: Study) -> str:
    """One paragraph: what the study evaluates."""
    counts = sorted({n for v in study.variants for n in v.devices})
    return (f"study {study.name}: {len(study.models)} model(s) x {len(study.variants)} cluster variant(s) on "
            f"{', '.join(map(str, counts))} devices; baseline: {study.variants[study.baseline].label}")
