"""TPU slice shapes (hardware/slices.py): the shapes Cloud TPU offers, how a chip count is laid out on them, what
`plan` offers, and bad `slices:` blocks."""
from __future__ import annotations

import copy
import math

import pytest

from comet_dse.answers.planner import sizes_for, why_not_offered
from comet_dse.base.errors import InputError
from comet_dse.hardware.load import cluster_from
from comet_dse.hardware.slices import Slices, layout
from comet_dse.presets.catalog import load_cluster, preset_data

# Cloud TPU v5p docs, "Configurations": the default shape of each accelerator type (chips -> topology); the
# layout rule (fewest slices, then the smallest sum of axes) was written without this table and must give it.
V5P_TABLE = {4: (2, 2, 1), 8: (2, 2, 2), 32: (2, 4, 4), 64: (4, 4, 4), 128: (4, 4, 8), 256: (4, 8, 8),
             512: (8, 8, 8), 1024: (8, 8, 16), 2048: (8, 16, 16), 4096: (16, 16, 16), 6144: (16, 16, 24)}
# Cloud TPU v5e docs: its eight 2D shapes.
V5E_TABLE = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}


@pytest.mark.parametrize("name,table", [("tpu-v5p", V5P_TABLE), ("tpu-v5e", V5E_TABLE)])
def test_one_slice_takes_the_providers_default_shape(name, table):
    cluster = load_cluster(name)
    for chips, shape in table.items():
        sizes = cluster.dim_sizes(chips)
        torus, slices = sizes[:len(shape)], sizes[len(shape):]
        assert sorted(torus) == sorted(shape), (name, chips, sizes)
        assert all(n == 1 for n in slices)


def test_a_larger_job_runs_on_the_fewest_equal_slices_over_the_data_center_network():
    v5p = load_cluster("tpu-v5p")
    assert v5p.dim_sizes(8192) == (16, 16, 16, 2)       # 6,144 does not divide 8,192: two 4,096-chip slices
    assert v5p.dim_sizes(18432) == (16, 16, 24, 3)      # Multislice's largest: three of the largest slice
    assert v5p.dim_sizes(448) == (4, 4, 4, 7)           # 7 cubes make no slice shape within 16x16x24
    for n in (448, 8192, 18432):
        assert math.prod(v5p.dim_sizes(n)) == n


def test_every_axis_fits_its_dimension():
    for name in ("tpu-v4", "tpu-v5e", "tpu-v5p"):
        cluster = load_cluster(name)
        caps, _ = cluster.slice_caps()
        for shape in cluster.slices.shapes(caps):
            sizes = cluster.dim_sizes(math.prod(shape))
            assert all(a <= c for a, c in zip(sizes, caps)), (name, shape, sizes)


def test_a_count_that_is_no_slice_is_still_costed_but_not_offered():
    v4 = load_cluster("tpu-v4")
    assert v4.dim_sizes(2) == (2, 1, 1)                 # a hypothetical machine, as the COMET studies ask
    assert not v4.orderable(2) and v4.orderable(4)
    assert "no whole number of equal tpu-v4 slices" in why_not_offered(v4, 2)
    refused = []
    assert sizes_for(v4, [2, 3, 4, 4096, 8192], refused) == [4, 4096]
    assert [n for n, _ in refused] == [8192]            # beyond the pod: refused, never replaced


def test_plan_replaces_a_count_by_the_nearest_whole_number_of_slices():
    v5p = load_cluster("tpu-v5p")
    assert sizes_for(v5p, [2, 6]) == [4]                # 2 -> 4 (2x2x1); 6 -> 4 or 8, the smaller on a tie
    assert sizes_for(v5p, [20000], []) == []


def test_machines_without_slices_are_laid_out_as_before():
    gb200 = load_cluster("gb200-nvl72")
    assert gb200.slices is None and gb200.orderable(128) and gb200.dim_sizes(128) == (64, 2)


def test_the_layout_rule_by_hand():
    s = Slices(listed=((2, 2, 1),), block=(4, 4, 4))
    assert layout(s, (8, 8, 8), None, 4) == (2, 2, 1, 1)
    assert layout(s, (8, 8, 8), None, 12) == (2, 2, 1, 3)
    assert layout(s, (8, 8, 8), 1, 12) is None          # no outer network: one slice only
    assert layout(s, (8, 8, 8), None, 6) is None


@pytest.mark.parametrize("block,needle", [
    ({"shapes": ["2x2"]}, "slices.shapes[0]"),
    ({"shapes": ["32x1x1"]}, "does not fit"),
    ({"block": "4x4"}, "slices.block"),
    ({"shapes": "2x2x1"}, "must be a list"),
    ({"cubes": "4x4x4"}, "must be a mapping"),
    ({"shapes": ["0x2x2"]}, "slices.shapes[0]"),
])
def test_a_bad_slices_block_is_one_clear_error(block, needle):
    data = copy.deepcopy(preset_data("clusters", "tpu-v5p"))
    data["slices"] = block
    with pytest.raises(InputError) as exc:
        cluster_from(data)
    assert needle in str(exc.value)


def test_a_replaced_network_drops_the_slices_it_no_longer_has():
    """A study's `network` axis or an override can replace the torus the shapes are cut from: then no shape
    applies and the count is laid out on the new network as on any other machine."""
    import dataclasses as dc

    v4 = load_cluster("tpu-v4")
    flat = dc.replace(v4, network=(dc.replace(v4.network[0], size=None),))
    assert not flat.rented_in_slices and flat.slice_layout(64) is None
    assert flat.dim_sizes(64) == (64,) and flat.orderable(2)
    wider = dc.replace(v4, network=tuple(dc.replace(d, size=2) for d in v4.network))   # a 2x2x2 torus
    assert wider.rented_in_slices and wider.dim_sizes(8) == (2, 2, 2)
