"""cost/distinct.py: terms computed once per distinct combination equal the terms computed for every point."""
import dataclasses as dc

import numpy as np

from comet_dse.cost import distinct
from comet_dse.cost.distinct import distinct_rows, gathered, once_per_distinct
from comet_dse.design_space.space import SearchSpace, enumerate_strategies
from comet_dse.design_space.table import evaluate_columns
from comet_dse.presets.catalog import load_cluster, load_model


def test_groups_hold_equal_rows_and_every_point_maps_back():
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 5, 1000), rng.choice([0.5, 1.5, 2.0], 1000)
    first, inverse = distinct_rows([a, b])
    assert len(first) == len({(x, y) for x, y in zip(a, b)})
    assert np.array_equal(a[first][inverse], a) and np.array_equal(b[first][inverse], b)


def test_a_hash_collision_falls_back_to_every_point(monkeypatch):
    """If different rows hash alike, grouping is refused rather than giving them one row's terms (the hash is
    used where the columns' varying bits do not pack into one 64-bit key)."""
    monkeypatch.setattr(distinct, "packed_key", lambda columns: None)
    monkeypatch.setattr(distinct, "row_hash", lambda columns: np.zeros(len(columns[0]), dtype=np.uint64))
    a = np.arange(100) % 3
    assert distinct_rows([a]) is None


def test_packed_keys_are_one_to_one_on_the_bits():
    """Equal keys exactly where every column has equal bits: -0.0 and 0.0 apart, NaN with itself."""
    rng = np.random.default_rng(2)
    n = 2000
    columns = [rng.integers(0, 8, n), rng.choice([0.5, 1.5, 2.0, -0.0, 0.0, np.nan], n), rng.random(n) < 0.5,
               rng.choice([1, 7, 100], n).astype(np.int8), rng.choice([0.25, 3.0], n).astype(np.float32),
               rng.choice([1.0, 4096.0], n)]
    key = distinct.packed_key(columns)
    bits = [np.ascontiguousarray(c).view(f"u{c.dtype.itemsize}") if c.dtype.kind == "f" else c for c in columns]
    rows = list(zip(*(b.tolist() for b in bits)))
    row_of_key = {}
    for k, row in zip(key.tolist(), rows):
        assert row_of_key.setdefault(k, row) == row           # one key never holds two different rows
    assert len(row_of_key) == len(set(rows))                  # and two different keys never one row


def test_columns_too_wide_to_pack_are_grouped_by_hash_and_checked():
    rng = np.random.default_rng(3)
    a, b = np.resize(rng.random(40), 1000), np.resize(rng.random(30), 1000)
    assert distinct.packed_key([a, b]) is None                # 52 mantissa bits each: no room in 64
    first, inverse = distinct_rows([a, b])
    assert len(first) == len(set(zip(a.tolist(), b.tolist())))
    assert np.array_equal(a[first][inverse], a) and np.array_equal(b[first][inverse], b)


def test_small_batches_and_batches_of_mostly_distinct_rows_are_not_grouped():
    assert distinct_rows([np.zeros(10)]) is None
    assert distinct_rows([np.arange(1000)]) is None          # 1000 combinations for 1000 points
    assert distinct_rows([np.arange(1000) % 250]) is not None


def test_columns_that_never_vary_make_one_group():
    first, inverse = distinct_rows([np.ones(100), np.full(100, 7)])
    assert list(first) == [0] and not inverse.any() and len(inverse) == 100


def test_gathered_walks_structures_and_keeps_scalars():
    @dc.dataclass(frozen=True)
    class Pair:
        x: object
        y: object

    value = {"a": [np.array([1.0, 2.0]), 3.0], "b": (Pair(np.array([4, 5]), 0.0),)}
    out = gathered(value, np.array([1, 1, 0]))
    assert np.array_equal(out["a"][0], [2.0, 2.0, 1.0]) and out["a"][1] == 3.0
    assert np.array_equal(out["b"][0].x, [5, 5, 4]) and out["b"][0].y == 0.0


def test_rows_equal_in_value_but_not_in_bits_are_gathered_not_broadcast():
    """-0.0 == 0.0, but a broadcast of the first would change the other's bits."""
    out = gathered(np.array([0.0, -0.0]), np.array([1, 1, 0]))
    assert list(np.signbit(out)) == [True, True, False]
    same = gathered(np.array([np.nan, np.nan]), np.array([0, 1, 1]))
    assert np.isnan(same).all() and same.strides == (0,)      # equal bits: a view, no copy


def test_once_per_distinct_equals_computing_every_point():
    model = load_model("gpt3-175b")
    st = enumerate_strategies(model, 1024, 1536, SearchSpace(max_micro_batch=8))

    def compute(sub):
        return {"work": sub.tp * 3.0 + sub.micro_batch / sub.pp, "ones": 1.0}

    columns = [st.tp, st.micro_batch, st.pp]
    assert distinct_rows(columns) is not None
    grouped = once_per_distinct(st, columns, compute)
    assert np.array_equal(grouped["work"], compute(st)["work"]) and grouped["ones"] == 1.0


def test_pairs_of_two_groupings_are_exact_and_refused_when_too_many(monkeypatch):
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 7, 5000), rng.integers(0, 11, 5000)
    for table in (distinct.PAIR_TABLE, 0):          # counted in a table first, and encoded straight away
        monkeypatch.setattr(distinct, "PAIR_TABLE", table)
        first, inverse = distinct.paired_rows(a, b, 7, 11)
        assert len(first) == len(set(zip(a.tolist(), b.tolist())))
        assert np.array_equal(a[first][inverse], a) and np.array_equal(b[first][inverse], b)
        many = np.arange(5000)
        assert distinct.paired_rows(many % 50, many // 50, 50, 100) is None     # 5000 pairs for 5000 points


def test_a_batch_whose_layouts_and_shapes_pair_equals_its_points_computed_alone(monkeypatch):
    """cost/pipeline.py computes the slowest stage once per (layout, micro-batch shape) pair where the pairs are
    few: the same bits as computing every point (distinct.ungrouped)."""
    import comet_dse.cost.pipeline as pipeline

    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100")
    st = enumerate_strategies(model, 64, 256, SearchSpace(max_micro_batch=4))
    batch = st.take(np.resize(np.arange(min(len(st), 300)), 6000))
    found = []
    monkeypatch.setattr(pipeline, "paired_rows", lambda *args: found.append(distinct.paired_rows(*args)) or found[-1])
    paired = evaluate_columns(model, cluster, 64, batch)
    assert found and found[-1] is not None                # the batch was paired
    with distinct.ungrouped():
        alone = evaluate_columns(model, cluster, 64, batch)
    for name, column in alone.items():
        x, y = np.asarray(paired[name]), np.asarray(column)
        if x.dtype.kind == "f":
            x, y = x.view(np.uint64), y.view(np.uint64)
        assert np.array_equal(x, y), name
