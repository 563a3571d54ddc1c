"""Every strategy knob is declared once (strategy.KNOBS); these tests walk the declaration.

A knob added to Strategy is picked up here without editing this file, except
for an integer knob, which needs an entry in INT_ALTERNATIVES (the test says so).
"""
import dataclasses as dc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from comet_dse import cost
from comet_dse.answers.estimate import estimate
from comet_dse.cli import build_parser
from comet_dse.cli.options import space_from, strategy_from
from comet_dse.cost.distinct import map_leaves
from comet_dse.cost.layout import layout_terms
from comet_dse.cost.microbatch_pass import microbatch_terms
from comet_dse.cost.shapes import context_of
from comet_dse.design_space.search import strategy_at
from comet_dse.design_space.study import load_study
from comet_dse.design_space.table import evaluate_columns
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import Choice, Dtype, Zero
from comet_dse.strategy.declared import KNOBS, LAYOUT_KNOBS, Strategy
from comet_dse.strategy.knob import GIVEN

H100 = load_cluster("dgx-h100")
MOE = load_model("mixtral-8x7b").with_seq_len(4096)
DEVICES = 64
# A point where every knob matters: MoE with TP, CP, EP, PP and DP, fp8 (so fp8 dispatch is allowed).
BASE = Strategy(tp=2, cp=2, ep=2, pp=2, dp=8, global_batch=64, micro_batch=1, dtype="fp8", recompute="selective",
                sequence_parallel=True, zero=1)
# Integer knobs: another value, with what must change with it to keep tp*cp*pp*dp = 64 devices.
INT_ALTERNATIVES = {
    "tp": {"tp": 4, "dp": 4},
    "cp": {"cp": 1, "dp": 16},
    "ep": {"ep": 4},
    "pp": {"pp": 4, "dp": 4},
    "dp": {"dp": 4, "pp": 4},
    "global_batch": {"global_batch": 128},
    "micro_batch": {"micro_batch": 2},
    "interleave": {"interleave": 2},
}


def alternatives(knob) -> list:
    """Overrides of BASE, each giving ``knob`` another value (all values of a choice)."""
    if knob.kind is int:
        assert knob.name in INT_ALTERNATIVES, f"add an alternative value of the new knob {knob.name} to INT_ALTERNATIVES"
        return [INT_ALTERNATIVES[knob.name]]
    if knob.kind is bool:
        return [{knob.name: not getattr(BASE, knob.name)}]
    if knob.kind is float:
        return [{knob.name: getattr(BASE, knob.name) * 1.5}]
    return [{knob.name: value} for value in knob.kind if value != getattr(BASE, knob.name)]


def _alternating(knob, n=64) -> list:
    variants = [BASE] + [dc.replace(BASE, **o) for o in alternatives(knob)]
    return [variants[i % len(variants)] for i in range(n)]


def _assert_rows_equal_estimates(cols: dict, points: list) -> None:
    for i, point in enumerate(points):
        e = estimate(MOE, H100, DEVICES, point)
        assert cols["step_time_s"][i] == pytest.approx(e.step_time_s, rel=1e-12, nan_ok=True), (i, point)
        assert cols["memory_per_device_bytes"][i] == pytest.approx(e.memory_per_device_bytes, rel=1e-9, abs=1)
        assert bool(cols["feasible"][i]) == e.feasible
        assert cols["mfu"][i] == pytest.approx(e.mfu, rel=1e-12, nan_ok=True)
        for part, seconds in e.breakdown_s.items():
            assert cols[f"time_{part}_s"][i] == pytest.approx(seconds, rel=1e-12, abs=1e-15, nan_ok=True), (part, point)
        for part, size in e.memory_bytes.items():
            assert cols[f"memory_{part}_bytes"][i] == pytest.approx(size, rel=1e-9, abs=1), (part, point)


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_a_batch_in_which_the_knob_alternates_equals_the_per_point_estimates(knob):
    points = _alternating(knob)
    cols = evaluate_columns(MOE, H100, DEVICES, StrategyArrays.of(points))
    _assert_rows_equal_estimates(cols, points)


@pytest.mark.parametrize("module, key, knob_name", [("cache", "MICROBATCH_KNOBS", "flash_attention"),
                                                     ("cache", "LAYOUT_KNOBS", "zero")])
def test_the_alternation_test_catches_a_knob_missing_from_a_grouping_key(monkeypatch, module, key, knob_name):
    """Without the knob in the key its terms are grouped by, a batch differs from its points (the test can fail)."""
    knob = next(k for k in KNOBS if k.name == knob_name)
    points = _alternating(knob)
    where = getattr(cost, module)
    monkeypatch.setattr(where, key, tuple(n for n in getattr(where, key) if n != knob.name))
    cols = evaluate_columns(MOE, H100, DEVICES, StrategyArrays.of(points))
    with pytest.raises(AssertionError):
        _assert_rows_equal_estimates(cols, points)


@pytest.mark.parametrize("knob", [k for k in KNOBS if not k.microbatch], ids=lambda k: k.name)
def test_knobs_left_out_of_the_microbatch_key_do_not_change_the_microbatch_terms(knob):
    """Where the placement's TP and DP strides (also in the key) are equal, the terms must be equal."""
    for override in alternatives(knob):
        pair = StrategyArrays.of([BASE, dc.replace(BASE, **override)])
        strides = pair.strides()
        if strides["tp"][0] != strides["tp"][1] or strides["dp"][0] != strides["dp"][1]:
            continue
        terms = microbatch_terms(MOE, context_of(MOE, H100, DEVICES, pair), pair)
        for name, values in terms.items():
            assert values[0] == values[1], f"{knob.name} changes the micro-batch term {name}: declare microbatch=True"


def _leaves(value) -> list:
    """The arrays and numbers in a Layout (cost/distinct.py: map_leaves), each as 2 values."""
    out = []
    map_leaves(lambda leaf: out.append(np.broadcast_to(leaf, (2,))), value)
    return out


# Layout terms are checked at BASE and where ZeRO 3 and hybrid sharding make every one of them non-zero.
LAYOUT_BASES = (BASE, dc.replace(BASE, zero=3, hybrid_shard=True, pp=1, dp=16))


@pytest.mark.parametrize("knob", [k for k in KNOBS if not k.layout], ids=lambda k: k.name)
def test_knobs_left_out_of_the_layout_key_do_not_change_the_layout_terms(knob):
    for base in LAYOUT_BASES:
        for override in alternatives(knob):
            other = dc.replace(base, **override)
            if any(getattr(other, n) != getattr(base, n) for n in LAYOUT_KNOBS):
                continue       # the override also moved a layout knob (tp*cp*pp*dp stays the device count)
            pair = StrategyArrays.of([base, other])
            for values in _leaves(layout_terms(MOE, pair, context_of(MOE, H100, DEVICES, pair))):
                assert values[0] == values[1], f"{knob.name} changes a layout term: declare layout=True"


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.applies is not None], ids=lambda k: k.name)
def test_a_knob_that_does_not_apply_cannot_change_the_result(knob):
    """Search keeps one value where a knob does not apply, so there it must not matter."""
    assert knob.name in WHERE_NOT, f"add to WHERE_NOT a point where {knob.name} does not apply"
    base = dc.replace(BASE, **WHERE_NOT[knob.name])
    assert not knob.applies(base), f"pick a point where {knob.name} does not apply"
    reference = estimate(MOE, H100, DEVICES, base)
    for override in alternatives(knob):
        other = estimate(MOE, H100, DEVICES, dc.replace(base, **override))
        assert other.step_time_s == reference.step_time_s, override
        assert other.memory_bytes == reference.memory_bytes, override


# For each knob with ``applies``: overrides of BASE where it does not apply.
WHERE_NOT = {
    "sequence_parallel": {"tp": 1, "dp": 16}, "tp_overlap": {"tp": 1, "dp": 16},
    "cp_algorithm": {"cp": 1, "dp": 16}, "ep_overlap": {"ep": 1}, "ep_fp8_dispatch": {"ep": 1},
    "zero": {"dp": 1, "cp": 1, "pp": 32, "ep": 1}, "dp_overlap": {"dp": 1, "cp": 1, "pp": 32, "ep": 1},
    "pipeline_split": {"pp": 1, "dp": 16}, "pp_overlap": {"interleave": 1}, "attention_kernel": {"flash_attention": False},
    "pipeline_engine": {"pp": 1, "dp": 16}, "reshard_after_forward": {"zero": 1}, "hybrid_shard": {"zero": 0},
    "grad_precision": {"dtype": "fp16"}, "fp8_amax_reduction": {"dtype": "bf16"}, "fp8_fused_cast": {"dtype": "bf16"}, "grad_sync": {"zero": 2},
}


def _knob_value(knob, draw):
    if knob.kind is bool:
        return draw(hs.booleans())
    if knob.kind is float:
        return draw(hs.floats(min_value=knob.low, max_value=knob.high, allow_nan=False))
    if knob.kind is int:
        return draw(hs.integers(min_value=1, max_value=8))
    return draw(hs.sampled_from(list(knob.kind)))


@hs.composite
def random_strategies(draw):
    values = {k.name: _knob_value(k, draw) for k in KNOBS}
    if values["ep_fp8_dispatch"]:   # the one CROSS_RULE
        values["dtype"] = Dtype.FP8
    return Strategy(**values)


@settings(max_examples=60, deadline=None)
@given(random_strategies())
def test_a_strategy_survives_the_round_trip_through_arrays_and_the_result_table(strategy):
    arrays = StrategyArrays.of([strategy])
    assert arrays.strategy(0) == strategy
    cols = evaluate_columns(MOE, H100, DEVICES, arrays)
    assert strategy_at(cols, 0) == strategy
    assert Strategy(**strategy.to_dict()) == strategy


@settings(max_examples=25, deadline=None)
@given(hs.lists(random_strategies(), min_size=2, max_size=6), hs.randoms(use_true_random=False))
def test_a_grouped_batch_of_random_strategies_equals_its_points(strategies, rng):
    """Each strategy repeated to 96 points in a shuffled batch: the micro-batch and layout terms are then
    grouped (cost/distinct.py), and every row must still equal the strategy's own estimate."""
    points = [strategies[i % len(strategies)] for i in range(96)]
    rng.shuffle(points)
    cols = evaluate_columns(MOE, H100, DEVICES, StrategyArrays.of(points))
    rows = sorted({point: i for i, point in enumerate(points)}.values())      # one row of each strategy
    _assert_rows_equal_estimates({k: np.asarray(v)[rows] for k, v in cols.items()}, [points[i] for i in rows])


def _nondefault(knob):
    """A valid value other than the default, as Python value and as command-line text."""
    if knob.kind is bool:
        return (not knob.default), ("off" if knob.default else "on")
    if knob.kind is float:          # 2.5, or the middle of a narrower range (a share: 0.5)
        value = 2.5 if knob.high is None or knob.high >= 2.5 else (knob.low + knob.high) / 2
        return value, f"{value:g}"
    if knob.kind is int:
        return 2, "2"
    value = next(m for m in knob.kind if m != knob.default)
    return value, str(value)


def _with_context(knob) -> dict:
    """Other knobs that ``knob``'s value needs (the CROSS_RULES)."""
    return {"dtype": Dtype.FP8} if knob.name == "ep_fp8_dispatch" else {}


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_every_knob_is_reachable_from_estimate_search_and_a_study(knob, tmp_path):
    value, text = _nondefault(knob)
    context = _with_context(knob)
    extra = [arg for name, v in context.items() for arg in (f"--{name.replace('_', '-')}", str(v))]
    common = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--devices", "64"]
    dashed = knob.name.replace("_", "-")
    batch = [] if knob.search == GIVEN else ["--global-batch", "64"]

    # estimate: one value (a switch as its flag)
    option = [knob.flag] if knob.kind is bool else [f"--{dashed}", text]
    args = build_parser().parse_args(["estimate", *common, *batch, *option, *extra]
                                     + (["--pp", "32"] if knob.name == "dp" else []))
    assert getattr(strategy_from(args, 64), knob.name) == value

    # search: a list of values (the global batch: its one value)
    args = build_parser().parse_args(["search", *common, *batch, f"--{dashed}", text, *extra])
    if knob.search == GIVEN:
        assert getattr(args, knob.name) == value
    else:
        assert space_from(args).given(knob.name) == (value,)

    # study: `strategy: {knob: value}`, the global batch at the top level
    yaml_value = str(value).lower() if knob.kind is bool else (int(value) if isinstance(value, Zero) else str(value))
    block = "" if knob.search == GIVEN else f"strategy:\n  {knob.name}: {yaml_value}\n" + "".join(
        f"  {name}: {v}\n" for name, v in context.items())
    batch_line = f"global_batch: {text}\n" if knob.search == GIVEN else "global_batch: 64\n"
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nmodels: [mixtral-8x7b]\ncluster: dgx-h100\ndevices: [64]\n{batch_line}{block}")
    study = load_study(path)
    if knob.search == GIVEN:
        assert study.variants[0].global_batch == value
    else:
        assert study.space.given(knob.name) == (value,)


def test_choices_are_enums_with_codes_in_arrays():
    arrays = StrategyArrays.of([BASE])
    for knob in KNOBS:
        if issubclass(knob.kind, Choice):
            assert isinstance(getattr(BASE, knob.name), knob.kind)
            assert getattr(arrays, knob.name).dtype == np.int64
    assert arrays.uses(Dtype.FP8)[0] and not arrays.uses(Dtype.BF16)[0]


def test_a_strategy_names_the_bad_knob():
    with pytest.raises(ValueError, match="placement: must be one of tp-pp-dp"):
        Strategy(placement="sideways")
    with pytest.raises(ValueError, match="ep-fp8-dispatch: needs dtype fp8"):
        Strategy(ep_fp8_dispatch=True)


def test_the_docs_list_every_knob():
    """docs/usage.md's estimate options and studies/README.md's strategy keys and columns name every knob."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "docs" / "usage.md").read_text()
    studies = (root / "studies" / "README.md").read_text()
    strategy_keys = studies.split("### Strategy", 1)[1].split("###", 1)[0]
    columns = studies.split("## Result columns", 1)[1].split("##", 1)[0]
    for knob in KNOBS:
        assert f"`{knob.flag}`" in readme, f"docs/usage.md: add {knob.flag} to the options of estimate"
        assert f"`{knob.name}`" in columns, f"studies/README.md: add {knob.name} to the result columns"
        if knob.search != GIVEN:
            assert f"`{knob.name}`" in strategy_keys, f"studies/README.md: add {knob.name} to the strategy keys"
