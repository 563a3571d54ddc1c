"""Cluster overrides: change a resource of a loaded cluster by name, with units, and add an expansion tier.

``comet-dse estimate | search | whatif --set NAME=VALUE --expansion CAP@BW[@LAT]`` and the Python API's
``load_cluster(ref, overrides={...}, expansion=...)`` come here. A resource is named as a study axis
(studies/README.md: ``hbm_capacity``, ``network.x.bandwidth`` (per device, per direction; it sets the link
bandwidth to the value / the links per device), ``network.x.link_bandwidth`` (per link), ``network.x.topology``,
...) or
as one dtype's peak (``peak_flops.fp8``). The value is absolute, with units (``51.2GiB``, ``100GB/s``,
``torus``), or a multiplier of the cluster's own value (``x2``, ``0.5x``).

Validation is the study file's own, not a copy of it: the value is parsed and applied by
design_space/study.py (``_axes``, ``_apply``), which checks it against the plausibility bounds a cluster
file's field is checked against (hardware/load.py), and an expansion tier is read by the cluster
file's reader (``tier_from``). Errors name the option, e.g.
``--set hbm_capacity: '80TB' is outside the plausible range [1, 4.39805e+12] in SI units``.
"""
from __future__ import annotations

import argparse
import dataclasses as dc
import difflib
import re

from comet_dse.base.bounds import BOUNDS, shown
from comet_dse.base.errors import InputError
from comet_dse.base.loading import Fields
from comet_dse.base.units import KIND_FLOPS, parse_quantity
from comet_dse.hardware import economics_block as economics
from comet_dse.hardware.load import tier_from
from comet_dse.hardware.spec import DTYPES, Cluster
from comet_dse.whole_run.economics import check_design

_SCALE = re.compile(r"^\s*(?:x\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)|([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*x)\s*$")


def resource_names(cluster: Cluster) -> list:
    """Every resource ``--set`` can change on ``cluster``: the study axes (but the named-network axis),
    each network dimension's fields and each dtype's peak FLOP/s."""
    from comet_dse.design_space.study import CLUSTER_AXES, DIM_AXES

    names = [n for n in CLUSTER_AXES if n != "network"]
    names += [f"peak_flops.{d}" for d in DTYPES]
    names += [f"network.{d.name}.{attr}" for d in cluster.network for attr in DIM_AXES]
    names += [*economics.FIELDS, *economics.CHOICES]
    names += [f"{head}.{r}" for head in ("unit_price", "unit_power") for r in economics.resource_names(cluster)]
    return names


def parse_assignment(text: str, option: str = "--set") -> tuple:
    """``'hbm_capacity=51.2GiB'`` -> ``('hbm_capacity', '51.2GiB')``; an InputError naming ``option`` otherwise."""
    name, sep, value = str(text).partition("=")
    if not sep or not name.strip() or not value.strip():
        raise InputError(option, f"expected NAME=VALUE, e.g. hbm_capacity=51.2GiB or network.x.topology=ring, "
                         f"got {text!r}")
    return name.strip(), value.strip()


def apply_overrides(cluster: Cluster, settings, expansion=None, where: str = "--set") -> Cluster:
    """``cluster`` with an expansion tier added (``expansion``) and then each resource of ``settings`` set.

    settings: a mapping or a list of (name, value) pairs; a value is a number in SI units, a string with
      units or a topology name, or a multiplier written ``x2`` / ``0.5x``. Their order never matters: every
      multiplier scales the cluster's own value (as given, with the expansion tier), price and power settings
      are anchored at the cluster as given, and a part (``peak_flops.bf16``, ``network.<dim>.bandwidth``)
      set beside its whole (``peak_flops``, ``network_bandwidth``) takes its own value, not the whole's
      compounded (``apply_in_order``).
    expansion: ``'512GiB@64GB/s'`` (optionally ``@latency``), or a mapping with capacity, bandwidth and
      optionally latency, as a study's ``expansion:``.
    where: how errors name the settings ("--set" on the command line, "overrides" in the Python API).
    The returned cluster's name records what was changed, e.g. ``tpu-v4[hbm_capacity=51.2GiB]``.
    """
    pairs = _pairs(settings, where)
    _refuse_repeats(pairs, where)
    _refuse_overlaps(pairs, where)
    changed = []
    if expansion is not None:
        cluster = with_expansion(cluster, expansion, "--expansion" if where == "--set" else "expansion")
        changed.append(f"expansion={_text(expansion)}")
    cluster = apply_in_order(cluster, pairs, where)
    changed += [f"{name}={value}" for name, value in pairs]
    if not changed:
        return cluster
    check_design(cluster, where)
    return dc.replace(cluster, name=f"{cluster.name}[{', '.join(changed)}]")


def apply_in_order(cluster: Cluster, pairs: list, where: str) -> Cluster:
    """``cluster`` with every setting of ``pairs`` applied so that their order does not matter: first the
    price and power settings (anchored at ``cluster``), then the other settings of a whole resource or of
    an ungrouped one, then each part of a grouped resource, computed on ``cluster`` itself (a multiplier of
    ``peak_flops.bf16`` scales the cluster's bf16 peak, not a peak another setting already scaled) and
    written over what its whole set."""
    first = [p for p in pairs if economics.is_setting(str(p[0]))]
    parts = [p for p in pairs if _scope(str(p[0]))[1] is not None]
    rest = [p for p in pairs if p not in first and p not in parts]
    out = cluster
    for name, value in first + rest:
        out = _set_one(out, str(name), value, where)
    for name, value in parts:
        out = _copy_part(out, _set_one(cluster, str(name), value, where), str(name))
    return out


def _copy_part(target: Cluster, source: Cluster, name: str) -> Cluster:
    """``target`` with the one part ``name`` sets (a dtype's peak, a dimension's link bandwidth or latency)
    taken from ``source``."""
    group, part = _scope(name)
    if group == "peak_flops":
        peaks = {**target.accelerator.peak_flops, part: source.accelerator.peak_flops[part]}
        return dc.replace(target, accelerator=dc.replace(target.accelerator, peak_flops=peaks))
    attr = "latency" if group == "network_latency" else "link_bandwidth"
    new = {d.name: getattr(d, attr) for d in source.network}
    dims = tuple(dc.replace(d, **{attr: new[d.name]}) if d.name == part else d for d in target.network)
    return dc.replace(target, network=dims)


def _pairs(settings, where: str) -> list:
    """``settings`` as a list of (name, value) pairs: a mapping, or pairs; anything else (text such as
    'hbm_capacity=80GiB', a number) is an InputError naming ``where`` (it was a bare ValueError)."""
    if settings is None:
        return []
    if isinstance(settings, dict):
        return list(settings.items())
    if isinstance(settings, (str, bytes)) or not isinstance(settings, (list, tuple)):
        raise InputError(where, "must be a mapping of resource name to value, such as {'hbm_capacity': '51.2 GiB', "
                         f"'peak_flops': 'x2'}}, got {shown(settings)}")
    pairs = []
    for pair in settings:
        if isinstance(pair, (str, bytes)) or not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise InputError(where, f"each setting must be a (name, value) pair, got {shown(pair)}")
        pairs.append(tuple(pair))
    return pairs


def _scope(name: str) -> tuple:
    """(what a setting changes, which part of it: None for all of it). peak_flops sets every dtype's peak,
    peak_flops.<dtype> one; network_bandwidth every dimension's link bandwidth, network.<dim>.bandwidth and
    .link_bandwidth one dimension's (two ways to write it); network_latency every dimension's latency."""
    if name == "peak_flops" or name.startswith("peak_flops."):
        return "peak_flops", name.partition(".")[2] or None
    if name in ("network_bandwidth", "network_latency"):
        return name, None
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "network" and parts[2] in ("bandwidth", "link_bandwidth", "latency"):
        return f"network_{'latency' if parts[2] == 'latency' else 'bandwidth'}", parts[1]
    return name, None


def _refuse_overlaps(pairs: list, where: str) -> None:
    """Refuse one part set twice under two names (network.<dim>.bandwidth and network.<dim>.link_bandwidth
    are one quantity, per device and per link): one of them would silently win. A whole and one of its parts
    together are fine: the part takes its own value (apply_in_order)."""
    seen = {}
    for name, _ in pairs:
        scope = _scope(str(name))
        if scope[1] is not None and scope in seen:
            raise InputError(f"{where} {name}", f"sets what {where} {seen[scope]} sets already (the same "
                             "quantity, per device or per link); give one of them")
        seen[scope] = str(name)


def _refuse_repeats(pairs: list, where: str) -> None:
    """Refuse a resource set twice: the second ``--set x=2x`` would scale the first's value, not the
    cluster's, and a second absolute value would silently win."""
    seen = set()
    for name, _ in pairs:
        if str(name) in seen:
            raise InputError(f"{where} {name}", "is given twice; set each resource once")
        seen.add(str(name))


def _text(expansion) -> str:
    if isinstance(expansion, dict):
        return "@".join(str(expansion[k]) for k in ("capacity", "bandwidth", "latency") if k in expansion)
    return str(expansion)


def with_expansion(cluster: Cluster, spec, where: str = "--expansion") -> Cluster:
    """``cluster`` with the expansion tier ``spec`` (``CAP@BW[@LAT]`` or a mapping), read as a cluster
    file's or a study's ``expansion:`` is (hardware.load.tier_from, the same bounds and messages)."""
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split("@")]
        if len(parts) not in (2, 3) or not all(parts):
            raise InputError(where, f"expected CAPACITY@BANDWIDTH[@LATENCY], e.g. 512GiB@64GB/s or "
                             f"512GiB@64GB/s@1us, got {spec!r}")
        spec = dict(zip(("capacity", "bandwidth", "latency"), parts))
    tier = tier_from(Fields(spec, where), "expansion", True)
    return dc.replace(cluster, accelerator=dc.replace(cluster.accelerator, expansion=tier))


def _set_one(cluster: Cluster, name: str, value, where: str) -> Cluster:
    """``cluster`` with resource ``name`` set to ``value`` (absolute or ``xN``), checked like a study axis."""
    from comet_dse.design_space.study import _apply, _axes

    field = f"{where} {name}"
    known = resource_names(cluster)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise InputError(field, f"unknown cluster resource; {hint}known: {', '.join(known)}")
    factor = _multiplier(value, field)
    if name.startswith("peak_flops."):
        return _set_peak(cluster, name.split(".", 1)[1], value, factor, field)
    spec = {"scale": [factor]} if factor is not None else {"values": [value]}
    try:
        (label, setting), = _axes(Fields({"axes": {name: spec}}, ""), [cluster], {"base": cluster.network})[name]
        return _apply(cluster, name, label, setting, {"base": cluster.network})
    except InputError as exc:
        message = exc.message.replace("add one with a top-level `expansion:`", "add one with --expansion CAP@BW")
        raise InputError(field, message) from None


def _multiplier(value, field: str) -> float | None:
    """The factor of ``x2`` / ``0.5x``, or None when ``value`` is an absolute value."""
    match = _SCALE.match(value) if isinstance(value, str) else None
    if not match:
        return None
    factor = float(match.group(1) or match.group(2))
    if not 0 < factor < float("inf"):
        raise InputError(field, f"a multiplier must be a positive finite number, got {value!r}")
    return factor


def _set_peak(cluster: Cluster, dtype: str, value, factor: float | None, field: str) -> Cluster:
    """``cluster`` with the peak FLOP/s of one dtype set (bounds as a cluster file's ``peak_flops``)."""
    acc = cluster.accelerator
    bound = BOUNDS["peak_flops"]
    if factor is None:
        number = bound.check(field, parse_quantity(value, KIND_FLOPS, field), repr(value))
    elif dtype not in acc.peak_flops:
        raise InputError(field, f"{acc.name} has no {dtype} rate to scale; give a value like '500TFLOP/s' "
                         f"(it has {', '.join(sorted(acc.peak_flops))})")
    else:
        number = bound.check(field, acc.peak_flops[dtype] * factor,
                             f"x{factor:g} of {acc.peak_flops[dtype]:g} = {acc.peak_flops[dtype] * factor:g}")
    peaks = {**acc.peak_flops, dtype: number}
    return dc.replace(cluster, accelerator=dc.replace(acc, peak_flops=peaks))


class GivenOnce(argparse.Action):
    """An option that may be given once: a second ``--expansion`` was silently last-wins (one tier is added,
    so two are a mistake, not a list)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            raise argparse.ArgumentError(self, f"is given twice ({getattr(namespace, self.dest)!r} and {values!r}); "
                                         "give it once")
        setattr(namespace, self.dest, values)


def add_override_options(parser) -> None:
    """The ``--set`` and ``--expansion`` options of estimate, search and whatif."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                        help="change one cluster resource, with units or as a multiplier (xN); repeatable: "
                             "hbm_capacity=51.2GiB, hbm_bandwidth=x2, peak_flops=x2 (every dtype), "
                             "peak_flops.fp8=2PFLOP/s, network_bandwidth=x2, network.<dim>.bandwidth=450GB/s (per "
                             "device, per direction), network.<dim>.link_bandwidth=25GB/s (per link), "
                             "network.<dim>.topology=torus, network.<dim>.size=36 (a smaller scale-up domain), "
                             "sram_capacity, expansion_capacity, ...; power and "
                             "price: rent=2USD/h, pue=1.1, energy_price=0.08USD/kWh, lifetime=4years, "
                             "node_power=4.6kW, cost_basis=own, unit_price.hbm_capacity=15USD/GiB, "
                             "unit_power.hbm_bandwidth=31W/(TB/s); goodput: mtbf=50000h, restart_time=10min, "
                             "checkpoint=async, checkpoint_interval=1h, storage_bandwidth=122MB/s, "
                             "checkpoint_bytes=14, goodput=off (docs/economics.md) "
                             "(the study axes, studies/README.md)")
    parser.add_argument("--expansion", default=None, metavar="CAP@BW[@LAT]", action=GivenOnce,
                        help="add an expansion memory tier (CXL-like), e.g. 512GiB@64GB/s or 512GiB@64GB/s@1us")


def cluster_from_args(cluster: Cluster, args) -> Cluster:
    """The command's cluster with its ``--expansion`` and ``--set`` options applied."""
    pairs = [parse_assignment(text) for text in getattr(args, "overrides", None) or []]
    return apply_overrides(cluster, pairs, getattr(args, "expansion", None))
