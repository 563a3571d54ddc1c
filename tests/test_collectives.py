"""Collective costs against hand calculations."""
import numpy as np
import pytest

from comet_dse.cost import collectives as coll
from comet_dse.hardware.spec import Topology


def _dim(size, topo, bw=100e9, latency=0.0, link=None):
    return coll.Dim(size=size, topology=topo, bandwidth=bw, link_bandwidth=link or bw, latency=latency)


def test_spans_follow_placement():
    dims = (_dim(8, Topology.SWITCH), _dim(64, Topology.SWITCH))
    assert [float(x) for x in coll.spans(dims, 1.0, 8.0)] == [8, 1]      # TP inside a node
    assert [float(x) for x in coll.spans(dims, 1.0, 16.0)] == [8, 2]     # TP spilling over two nodes
    assert [float(x) for x in coll.spans(dims, 8.0, 32.0)] == [1, 32]    # DP across nodes
    assert [float(x) for x in coll.spans(dims, 2.0, 8.0)] == [4, 2]      # PP with tp=2


def test_ring_all_reduce_on_a_switch():
    dims = (_dim(8, Topology.SWITCH, bw=100e9, latency=1e-6),)
    s = 1e9
    t = coll.all_reduce_time(s, dims, [np.array(8.0)])
    assert t == pytest.approx(2 * (7 / 8 * s / 100e9 + 6 * 1e-6))   # 2 phases of min(7, 2*log2 8 = 6) steps


def test_hierarchical_all_reduce_shrinks_data_outward():
    dims = (_dim(8, Topology.SWITCH, bw=200e9), _dim(4, Topology.SWITCH, bw=20e9))
    s = 8e9
    t = coll.all_reduce_time(s, dims, [np.array(8.0), np.array(4.0)])
    assert t == pytest.approx(2 * (7 / 8 * s / 200e9 + 3 / 4 * (s / 8) / 20e9))


def test_torus_wraparound_doubles_bandwidth_of_a_partial_ring():
    dims = (_dim(16, Topology.TORUS, bw=90e9),)
    full = coll.reduce_scatter_time(1e9, dims, [np.array(16.0)])
    part = coll.reduce_scatter_time(1e9, dims, [np.array(8.0)])
    assert full == pytest.approx(15 / 16 * 1e9 / 90e9)
    assert part == pytest.approx(7 / 8 * 1e9 / 45e9)


def test_all_to_all_switch_vs_ring():
    s = 1e9
    switch = coll.all_to_all_time(s, (_dim(8, Topology.SWITCH, bw=100e9),), [np.array(8.0)])
    ring = coll.all_to_all_time(s, (_dim(8, Topology.RING, bw=100e9),), [np.array(8.0)])
    assert switch == pytest.approx(7 / 8 * s / 100e9)
    assert ring == pytest.approx(7 / 8 * s / 100e9 * 2.0)   # mean distance n/4 = 2 hops


def test_send_recv_takes_the_slowest_dimension_it_crosses():
    """A pipeline inside and across nodes runs at its slowest hop, inner or outer (was: always the outermost,
    so an NVLink scaled down to a crawl left a 16-stage pipeline across two nodes unchanged)."""
    slow_inner = (_dim(8, Topology.SWITCH, bw=1e9, latency=1e-6), _dim(64, Topology.SWITCH, bw=25e9, latency=5e-6))
    spans = [np.array(8.0), np.array(2.0)]
    assert coll.send_recv_time(1e8, slow_inner, spans) == pytest.approx(1e8 / 1e9 + 1e-6)
    fast_inner = (_dim(8, Topology.SWITCH, bw=300e9, latency=1e-6), slow_inner[1])
    assert coll.send_recv_time(1e8, fast_inner, spans) == pytest.approx(1e8 / 25e9 + 5e-6)
    ring = (_dim(4, Topology.RING, bw=400e9, link=100e9, latency=0.0),)
    assert coll.send_recv_time(1e8, ring, [np.array(4.0)]) == pytest.approx(1e8 / 100e9)   # one link on a ring


def test_send_recv_uses_the_dimension_it_spans():
    dims = (_dim(8, Topology.SWITCH, bw=300e9, latency=1e-6), _dim(64, Topology.SWITCH, bw=25e9, latency=5e-6))
    assert coll.send_recv_time(1e8, dims, [np.array(1.0), np.array(4.0)]) == pytest.approx(1e8 / 25e9 + 5e-6)
    assert coll.send_recv_time(1e8, dims, [np.array(4.0), np.array(1.0)]) == pytest.approx(1e8 / 300e9 + 1e-6)
