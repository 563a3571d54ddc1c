"""Collective communication costed by algorithm on the network dimensions a group spans.

Devices are numbered with the innermost network dimension varying fastest. A
group of ``size`` devices with ``stride`` (TP: stride 1; PP: stride tp; DP:
stride tp*pp) covers a number of coordinates in each dimension (its *span*).
Multi-dimension collectives are hierarchical: reduce-scatter inner to outer
dimension (data shrinking by each span), all-gather back outer to inner.

Per dimension with span n, data S bytes, per-device bandwidth B and step latency a:
    reduce-scatter = all-gather = (n-1)/n * S / B  +  steps(n) * a
    all-reduce     = reduce-scatter + all-gather
    all-to-all     = (n-1)/n * S / B * hops(n) + steps(n) * a
Sources: Thakur, Rabenseifner & Gropp 2005 (ring/recursive algorithms);
Patarasuk & Yuan 2009 (bandwidth-optimal all-reduce); docs/model.md.
All functions are element-wise over numpy arrays.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from comet_dse.hardware.spec import NetworkDim, Topology


@dataclass(frozen=True)
class Dim:
    """One network dimension as the cost model sees it (arrays allowed)."""

    size: object
    topology: Topology
    bandwidth: object
    link_bandwidth: object
    latency: object

    @classmethod
    def of(cls, dim: NetworkDim, size: int) -> "Dim":
        return cls(size=size, topology=dim.topology, bandwidth=dim.device_bandwidth,
                   link_bandwidth=dim.link_bandwidth * dim.efficiency, latency=dim.latency)


def spans(dims: tuple, stride, size) -> list:
    """Members of a (stride, size) group along each dimension, innermost first.

    For dimension i with c_i = product of the sizes inside it:
        span_i = clip(stride*size / c_i, 1, d_i) / clip(stride / c_i, 1, d_i)
    e.g. on 8-GPU nodes, DP=32 at stride 8 spans (1, 32); TP=16 at stride 1 spans (8, 2).
    """
    out, inner = [], 1.0
    for dim in dims:
        reach = np.clip(stride * size / inner, 1.0, dim.size)
        start = np.clip(stride / inner, 1.0, dim.size)
        out.append(np.maximum(reach / start, 1.0))
        inner = inner * dim.size
    return out


def effective_bandwidth(dim: Dim, n):
    """Per-device bandwidth a bandwidth-optimal collective gets on ``n`` members of ``dim`` [bytes/s].

    switch, ring: all the device's links. torus: all links when the group closes
    the ring (n == size), else half (a line). mesh: half (a ring embedded in a
    line uses each link once per direction). fully connected: the links to the
    n-1 peers in the group.
    """
    if dim.topology is Topology.SWITCH or dim.topology is Topology.RING:
        return dim.bandwidth * np.ones_like(n)
    if dim.topology is Topology.TORUS:
        return np.where(n >= dim.size, dim.bandwidth, 0.5 * dim.bandwidth)
    if dim.topology is Topology.MESH:
        return 0.5 * dim.bandwidth * np.ones_like(n)
    peers = np.maximum(dim.size - 1, 1)
    return dim.bandwidth * np.maximum(n - 1, 1) / peers


def latency_steps(dim: Dim, n, tree: bool = False):
    """Message steps of one reduce-scatter or all-gather phase.

    Reduce-scatter and all-gather are rings in NCCL: n-1 steps. An all-reduce
    (tree=True) on a switch or fully connected dimension takes the ring's n-1
    per phase for small groups and 2*ceil(log2 n) (a tree) once that is fewer,
    as NCCL switches from rings to trees at scale; on rings, tori and meshes n-1.
    """
    if tree and dim.topology in (Topology.SWITCH, Topology.FULLY_CONNECTED):
        return np.minimum(n - 1, 2.0 * np.ceil(np.log2(np.maximum(n, 1))))
    return n - 1


def _phase_time(nbytes, dims: tuple, group_spans: list, tree: bool):
    """One hierarchical reduce-scatter (or all-gather) phase over the spanned dimensions [s]."""
    total = np.zeros(np.broadcast(nbytes, *group_spans).shape)
    data = nbytes * 1.0
    for dim, n in zip(dims, group_spans):
        t = (n - 1) / n * data / effective_bandwidth(dim, n) + latency_steps(dim, n, tree) * dim.latency
        total = total + np.where(n > 1, t, 0.0)
        data = data / n
    return np.where(np.asarray(nbytes) > 0, total, 0.0)     # nothing to send: no collective runs


def reduce_scatter_time(nbytes, dims: tuple, group_spans: list):
    """Hierarchical ring reduce-scatter of ``nbytes`` per device over the spanned dimensions [s]."""
    return _phase_time(nbytes, dims, group_spans, tree=False)


def all_gather_time(nbytes, dims: tuple, group_spans: list):
    """Ring all-gather whose result is ``nbytes`` per device: same cost as the reduce-scatter [s]."""
    return _phase_time(nbytes, dims, group_spans, tree=False)


def all_reduce_time(nbytes, dims: tuple, group_spans: list):
    """Bandwidth-optimal all-reduce = two phases, each with tree latency where NCCL would use one [s]."""
    return 2.0 * _phase_time(nbytes, dims, group_spans, tree=True)


def outermost(group_spans: list) -> list:
    """Per dimension, True where it is the outermost one the group spans (n > 1 there, 1 beyond)."""
    flags, beyond = [], None
    for n in reversed(group_spans):
        spanned = np.asarray(n) > 1
        beyond = np.zeros_like(spanned) if beyond is None else beyond
        flags.append(spanned & ~beyond)
        beyond = beyond | spanned
    return flags[::-1]


def all_to_all_time(nbytes, dims: tuple, group_spans: list, outer_scale=1.0):
    """All-to-all where each device holds ``nbytes`` and keeps 1/n of it [s].

    Per dimension: (n-1)/n * S / B * hops + steps * latency, where hops is the
    mean path length a byte travels: 1 on a switch or fully connected, n/4 on a
    closed ring/torus (both directions), n/3 on a line (mesh, open torus).
    Dimensions are traversed one after another (dimension-ordered routing).
    On the outermost dimension the group spans, S is multiplied by
    ``outer_scale`` (a hierarchical exchange that sends fewer bytes across it,
    e.g. one copy per destination node).
    """
    total = np.zeros(np.broadcast(nbytes, *group_spans).shape)
    for dim, n, outer in zip(dims, group_spans, outermost(group_spans)):
        if dim.topology in (Topology.SWITCH, Topology.FULLY_CONNECTED):
            hops = np.ones_like(n)
        elif dim.topology is Topology.RING or dim.topology is Topology.TORUS:
            hops = np.where(n >= dim.size, np.maximum(n / 4.0, 1.0), np.maximum(n / 3.0, 1.0))
        else:
            hops = np.maximum(n / 3.0, 1.0)
        bw = dim.bandwidth if dim.topology is not Topology.FULLY_CONNECTED else effective_bandwidth(dim, n)
        data = nbytes * np.where(outer, outer_scale, 1.0)
        t = (n - 1) / n * data / bw * hops + (n - 1) * dim.latency
        total = total + np.where(n > 1, t, 0.0)
    return total


def send_recv_time(nbytes, dims: tuple, group_spans: list):
    """Point-to-point transfer between neighbours of a group (pipeline stages) [s].

    Neighbours of a group that spans several dimensions sit one step apart in
    the innermost spanned dimension, except at its wrap, where the step is in
    the next one: the group's transfers cross every spanned dimension, and a
    pipeline runs at the pace of its slowest hop:
        T = max over spanned dimensions of (S / B_hop + latency)
    A switch lets one transfer use all the device's links (B_hop = the device's
    bandwidth); rings, tori, meshes and fully connected dimensions give it one
    link (B_hop = link bandwidth). The slowest hop is usually the outermost
    dimension's, but not always (a narrow inner link, a scaled-down NVLink).
    """
    time = np.zeros(np.broadcast(nbytes, *group_spans).shape)
    for dim, n in zip(dims, group_spans):
        bw = dim.bandwidth if dim.topology is Topology.SWITCH else dim.link_bandwidth
        time = np.where(n > 1, np.maximum(time, nbytes / bw + dim.latency), time)
    return time
