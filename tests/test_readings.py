"""The readings of the COMET paper's setup (report/readings.py, docs/case-studies.md "Readings"): each answer's
assumptions give the documented footprint and step time for one split, by hand; a reading's selection equals a run
with its override; every combination is a reading; the findings table round-trips to findings.json."""
import dataclasses as dc
import html as htmlmod
import json
import re
from pathlib import Path

import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.base.errors import InputError
from comet_dse.design_space.engine import run_study
from comet_dse.design_space.study import load_study
from comet_dse.hardware.spec import MemoryTier
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.report import analysis, readings as rd
from comet_dse.report.build import build_report
from comet_dse.report.findings import text as value_text
from comet_dse.strategy.declared import Strategy

GiB = 2.0**30
COMET = load_model("comet-transformer-1t")
TPU = load_cluster("tpu-v4")
A100 = load_cluster("dgx-a100-80gb")
PAPER = dict(pp=1, recompute="full", grad_precision="16-bit", model_parallel="pure-mp", micro_batch=1)
STUDIES = Path(__file__).resolve().parents[1] / "studies" / "comet"


# --- each answer, by hand, on one split ---------------------------------------------------------------------

def test_layer_gradients_on_tpu_v4_mp64_dp64_by_hand():
    """`layer` (grad_buffer layer): TPU v4, MP64 x DP64, ZeRO 1, micro-batch 1 (m = 2048/64 = 32). With P the
    parameters on a chip (about 929.06e9 / 64) and P_l one layer's (7,248,076,800 / 64), 2-byte gradients:
        whole: 2 P;   layer: 2 x 2 P_l (two layers in flight) + 2 P / 64 (the DP shard of 32 micro-batches)
    The documented footprint (docs/case-studies.md): about 44 GiB, which fits 1.6 x 32 GiB; 70.7 GiB whole."""
    point = Strategy(tp=64, dp=64, global_batch=2048, zero=1, **PAPER)
    whole = estimate(COMET, TPU, 4096, point)
    layer = estimate(COMET, TPU, 4096, dc.replace(point, grad_buffer="layer"))
    p = whole.memory_bytes["weights"] / 2.0
    assert p == pytest.approx(929.0625e9 / 64, rel=2e-3)
    assert whole.memory_bytes["gradients"] == pytest.approx(2 * p)
    assert layer.memory_bytes["gradients"] == pytest.approx(2 * 2 * 7_248_076_800 / 64 + 2 * p / 64, rel=1e-9)
    assert layer.memory_bytes["optimizer"] == whole.memory_bytes["optimizer"] == pytest.approx(12 * p / 64)
    saved = whole.memory_bytes["gradients"] - layer.memory_bytes["gradients"]
    assert whole.memory_per_device_bytes - layer.memory_per_device_bytes == pytest.approx(saved * 1.004, rel=1e-6)
    # The two totals as docs/case-studies.md quotes them: regression pins (activations and buffers are not
    # re-derived here; the reserve is XLA's 1.25 GiB + 0.4 %).
    assert layer.memory_per_device_bytes / GiB == pytest.approx(44.4, abs=0.1)
    assert whole.memory_per_device_bytes / GiB == pytest.approx(70.7, abs=0.1)
    assert 32 * GiB < layer.memory_per_device_bytes < 1.6 * 32 * GiB


def test_layer_gradients_step_time_by_hand():
    """`layer` with one micro-batch (m = 1): megatron-1.7b on one DGX A100 node, DP 8, global batch 8. Each of
    the 24 layers all-reduces its g P / 24 bytes (fp32 main gradients, g = 4) on NVLink, 8 GPUs (234 GB/s
    achievable, 6 tree steps of 7 us per phase):
        t = 2 (7/8 x 4 P / 24 / 234e9 + 6 x 7e-6)
    prefetched behind the next layer's backward; t < T_b / 24, so only the last layer's shows: exposed = t.
    The gradients held: g x 2 P_l (two layers), against g x P whole."""
    model = load_model("megatron-1.7b")
    point = Strategy(dp=8, global_batch=8, micro_batch=1, recompute="full", grad_buffer="layer")
    e = estimate(model, A100, 8, point)
    p = e.memory_bytes["weights"] / 2.0
    t = 2 * (7 / 8 * 4 * p / 24 / (12 * 25e9 * 0.78) + 6 * 7e-6)
    assert t < (e.phases_s["backward"] + e.phases_s["recompute"]) / 24
    assert e.breakdown_s["dp_communication"] == pytest.approx(t, rel=1e-9)
    assert e.memory_bytes["gradients"] == pytest.approx(4 * 2 * model.layer_params(), rel=1e-9)
    whole = estimate(model, A100, 8, dc.replace(point, grad_buffer="whole"))
    assert whole.memory_bytes["gradients"] == pytest.approx(4 * p)
    # Without overlap every layer's all-reduce is exposed: 24 t.
    off = estimate(model, A100, 8, dc.replace(point, dp_overlap=False))
    assert off.breakdown_s["dp_communication"] == pytest.approx(24 * t, rel=1e-9)


def test_seq1024_keeps_the_tokens_and_halves_each_sequence():
    """`seq1024`: 1,024 tokens and global batch 4,096, the same 4,194,304 tokens per step. By hand, per TPU v4
    chip at MP256_DP16, micro-batch 1, full recomputation: each layer keeps its input, b s h x 2 bytes, so the
    checkpoints of 128 layers halve (12.0 to 6.0 GiB) while the micro-batches per step double (128 to 256);
    the model FLOPs (Narayanan Eq. 3, causal keys s/2) differ only in the attention scores:
        tokens x 6 L a (d_qk + d_v) x (1024 - 512)."""
    short = COMET.with_seq_len(1024)
    point = Strategy(tp=256, dp=16, global_batch=2048, zero=1, **PAPER)
    long_, half = estimate(COMET, TPU, 4096, point), estimate(short, TPU, 4096, dc.replace(point, global_batch=4096))
    for e, s in ((long_, 2048), (half, 1024)):      # 128 checkpoints of b s h x 2 bytes, one layer's transient
        checkpoints = 128 * s * 24576 * 2
        assert checkpoints <= e.memory_bytes["activations"] <= 1.03 * checkpoints
    assert long_.microbatches * 2 == half.microbatches == 256
    from comet_dse.cost.flops import model_flops
    tokens = 4096 * 1024
    diff = model_flops(COMET, 2048) - model_flops(short, 4096)
    assert diff == pytest.approx(tokens * 6 * 128 * 128 * (192 + 192) * (1024 - 512), rel=1e-9)


def test_the_a100_40gb_preset_by_hand():
    """`40gb`: 40 GiB less 1.48 GiB reserved (0.41 driver + 0.5 context + 0.574 NCCL), 1.555 TB/s; the rest as
    the 80 GB part. A split that needs between 39 and 78 GiB fits only the 80 GB part."""
    small = load_cluster("dgx-a100-40gb")
    assert small.accelerator.state_capacity == 40 * GiB and small.reserved_memory == pytest.approx(1.48 * GiB)
    assert small.accelerator.hbm.bandwidth == 1.555e12 and small.accelerator.peak_flops == A100.accelerator.peak_flops
    point = Strategy(tp=64, dp=64, global_batch=2048, zero=1, **PAPER)
    e80, e40 = estimate(COMET, A100, 4096, point), estimate(COMET, small, 4096, point)
    need = e80.memory_per_device_bytes
    assert 40 * GiB < need < 80 * GiB and e80.feasible and not e40.feasible
    # The memory-bound part of the step scales with the HBM bandwidth:
    assert e40.breakdown_s["memory"] == pytest.approx(e80.breakdown_s["memory"] * 2.039 / 1.555, rel=0.02)


def test_the_dojo_tray_preset_by_hand():
    """`tray`: 6 tiles, 640 GiB of HBM (20 DIPs) and 66 GB of SRAM that holds state. On 64 trays with ZeRO 1
    (P = 929e9 / MP per tray, C = 128 x 2048 x 24576 x 2 = 12.9 GB of checkpoints): MP8 whole needs
    2P + 2P + 12P/8 + C = 652 GB, under the 753 GB a tray holds; MP4 whole 2P + 2P + 12P/16 + C = 1,116 GB, over
    it; MP4 with the gradients of two layers and their DP shard (layer) 2P + 2 x 2 P_l/4 + 2P/16 + 12P/16 + C
    = 688 GB: it fits."""
    tray = load_cluster("dojo-tray")
    assert tray.accelerator.state_capacity == 640 * GiB + 66e9
    assert tray.accelerator.peak_flops["bf16"] == pytest.approx(6 * 9.05e15)

    def need(mp, buffer):
        e = estimate(COMET, tray, 64, Strategy(tp=mp, dp=64 // mp, global_batch=2048, zero=1, grad_buffer=buffer,
                                                 **PAPER))
        return e.memory_per_device_bytes, e.feasible

    p8, p4, c = 929.0625e9 / 8, 929.0625e9 / 4, 128 * 2048 * 24576 * 2
    assert need(8, "whole")[0] == pytest.approx(5.5 * p8 + c, rel=0.005) and need(8, "whole")[1]
    assert need(4, "whole")[0] == pytest.approx(4.75 * p4 + c, rel=0.005) and not need(4, "whole")[1]
    layer = 2 * p4 + 4 * 7_248_076_800 / 4 + 2 * p4 / 16 + 12 * p4 / 16 + c
    assert need(4, "layer")[0] == pytest.approx(layer, rel=0.005) and need(4, "layer")[1]


def test_the_dojo_d1_mesh_preset_by_hand():
    """`d1`: 64 D1 dies as an 8 x 8 block of the die mesh (the `dojo` preset's 5 x 5 tiles cannot hold 64), each
    row and column crossing one tile edge at 9 TB/s / 5 dies = 1.8 TB/s. A die holds 6.4 GiB of DIP HBM and 440 MB
    of SRAM: 64 of them 426 GiB, so MP8_DP8 needs 2P + 2P + 12P/8 + C with P = 929e9 / 8 and nothing fits."""
    d1 = load_cluster("dojo-d1-mesh")
    assert d1.dim_sizes(64) == (8, 8)
    with pytest.raises(InputError):
        load_cluster("dojo").dim_sizes(64)
    assert all(d.link_bandwidth == 1.8e12 and d.topology.value == "mesh" for d in d1.network)
    assert d1.accelerator.state_capacity == pytest.approx(6.4 * GiB + 440e6)
    assert d1.accelerator.peak_flops["bf16"] == 362e12
    point = Strategy(tp=8, dp=8, global_batch=2048, zero=1, grad_buffer="whole", **PAPER)
    e = estimate(COMET, d1, 64, point)
    p8, c = 929.0625e9 / 8, 128 * 2048 * 24576 * 2
    assert e.memory_per_device_bytes == pytest.approx(5.5 * p8 + c, rel=0.005)
    assert not e.feasible and e.memory_per_device_bytes > 80 * d1.accelerator.state_capacity     # 89x


def _with_tier(cluster, hbm: float, capacity: float, bandwidth: float):
    acc = dc.replace(cluster.accelerator, hbm=dc.replace(cluster.accelerator.hbm, capacity=hbm),
                     expansion=MemoryTier("expansion", capacity, bandwidth, 1.0, 0.0))
    return dc.replace(cluster, accelerator=acc)


def test_the_remote_memory_roofline_by_hand():
    """`roofline` (expansion_roofline): a slow tier (1 GB/s) holding the optimizer state and half the weights and
    gradients W_x of megatron-1.7b on 8 A100s, 8 micro-batches. Each pass's traffic hides only behind that
    pass's own duration, C = its kernels (compute- and memory-bound; no in-layer communication here) per
    micro-batch; here it all shows beyond it:
        T = m (W_x / B - C_f) + m (2 W_x / B - C_b) + max(0, 2 O_x / B - T_opt)
          = 3 m W_x / B - (forward + backward + recompute) + ...
    while the prefetched tier (expansion_overlap) also hides it behind exposed communication."""
    model = load_model("megatron-1.7b")
    # DP reduction not overlapped: no communication kernel runs beside the GEMMs, so "compute" is their math alone
    point = Strategy(dp=8, global_batch=64, micro_batch=1, recompute="full", dp_overlap=False)
    parts = estimate(model, A100, 8, point).memory_bytes
    opt, wg = parts["optimizer"], parts["weights"] + parts["gradients"]
    hbm = estimate(model, A100, 8, point).memory_per_device_bytes - opt - 0.5 * wg
    bw, m = 1e9, 8
    cluster = _with_tier(A100, hbm, 64 * GiB, bw)
    roof = estimate(model, cluster, 8, dc.replace(point, expansion_roofline=True))
    assert roof.feasible
    w_x = roof.memory_tiers_bytes["expansion"] - opt
    assert w_x == pytest.approx(0.5 * wg, rel=1e-6)
    passes = sum(roof.phases_s.values())
    hand = 3 * m * w_x / bw - passes + max(0.0, 2 * opt / bw - roof.breakdown_s["optimizer"])
    assert roof.breakdown_s["offload"] == pytest.approx(hand, rel=1e-9)
    overlapped = estimate(model, cluster, 8, dc.replace(point, expansion_overlap=True))
    assert overlapped.breakdown_s["offload"] < roof.breakdown_s["offload"]


def test_the_remote_memory_roofline_compute_roof_by_hand():
    """`roofline` with the tier's compute roof P_x (MemoryTier.compute, the authors' remote-mem-roofline-peak-perf):
    megatron-1.7b on 8 A100s, half its weights and gradients in a fast tier (1 TB/s, so the stream never binds)
    computed on at 1 TFLOP/s. Per micro-batch the forward's GEMMs on the spilled half take s_w F_f / P_x, the
    backward's (with the full recomputation) s_w F_b / P_x (no activations spilled), F_f and F_b one device's
    share of the step's FLOP: 2 tokens (P_matmul + V h) + the causal scores forward, twice that backward, the
    layers' forward again recomputed; each pass then lasts its capped work, and the excess over its own duration shows:
        T = m [(s_w F_f / P_x - C_f) + (s_w F_b / P_x - C_b)] + max(0, 2 O_x / B - T_opt)
    The same tier without a roof hides its stream; the prefetched tier ignores the roof."""
    model = load_model("megatron-1.7b")
    point = Strategy(dp=8, global_batch=64, micro_batch=1, recompute="full", dp_overlap=False)
    parts = estimate(model, A100, 8, point).memory_bytes
    opt, wg = parts["optimizer"], parts["weights"] + parts["gradients"]
    hbm = estimate(model, A100, 8, point).memory_per_device_bytes - opt - 0.5 * wg
    bw, roof, m = 1e12, 1e12, 8
    plain = _with_tier(A100, hbm, 64 * GiB, bw)
    capped = dc.replace(plain, accelerator=dc.replace(plain.accelerator, expansion=dc.replace(
        plain.accelerator.expansion, compute=roof)))
    on = dc.replace(point, expansion_roofline=True)
    est = estimate(model, capped, 8, on)
    s_w = (est.memory_tiers_bytes["expansion"] - opt) / wg
    assert s_w == pytest.approx(0.5, rel=1e-6)
    tokens = 8 * model.seq_len                       # one micro-batch of each of the 8 replicas
    att = model.attention
    scores = 2 * model.layers * model.causal_keys_per_query() * att.heads * (att.qk_dim + att.v_dim)
    matmul = 12 * model.hidden**2 * model.layers if not model.mlp.gated else None
    assert matmul is not None and model.mlp.ffn == 4 * model.hidden and att.heads * att.qk_dim == model.hidden
    forward = tokens * (2 * (matmul + model.vocab * model.hidden) + scores) / 8
    backward = 2 * forward + tokens * (2 * matmul + scores) / 8     # the layers' forward recomputed (not the head)
    c_f = est.phases_s["forward"] / m
    c_b = (est.phases_s["backward"] + est.phases_s["recompute"]) / m
    hand = m * ((s_w * forward / roof - c_f) + (s_w * backward / roof - c_b))
    hand += max(0.0, 2 * opt / bw - est.breakdown_s["optimizer"])
    assert s_w * forward / roof > c_f and s_w * backward / roof > c_b      # the roof binds in both passes
    assert est.breakdown_s["offload"] == pytest.approx(hand, rel=1e-6)
    assert estimate(model, plain, 8, on).breakdown_s["offload"] < 1e-3 * est.breakdown_s["offload"]
    prefetched = dc.replace(point, expansion_overlap=True)
    assert (estimate(model, capped, 8, prefetched).breakdown_s["offload"]
            == estimate(model, plain, 8, prefetched).breakdown_s["offload"])


@pytest.mark.parametrize("preset, model_name, knobs", [
    ("tpu-v4", "comet-transformer-1t", dict(tp=64, dp=64, global_batch=2048, zero=1, **PAPER)),
    ("dgx-h100", "llama3-70b", dict(tp=8, pp=4, dp=4, global_batch=256, interleave=2, zero=1)),
])
def test_a_higher_compute_roof_never_slows_a_step(preset, model_name, knobs):
    """The step never gets slower as the tier's compute roof rises, and no roof is the fastest."""
    cluster = load_cluster(preset)
    model = load_model(model_name)
    point = Strategy(**knobs, expansion_roofline=True)
    devices = 4096 if preset == "tpu-v4" else 128
    need = estimate(model, cluster, devices, point).memory_per_device_bytes
    tiered = _with_tier(cluster, 0.6 * need, need, 64e9)
    times = []
    for roof in (1e12, 1e13, 1e14, 1e15, None):
        acc = dc.replace(tiered.accelerator, expansion=dc.replace(tiered.accelerator.expansion, compute=roof))
        times.append(estimate(model, dc.replace(tiered, accelerator=acc), devices, point).step_time_s)
    assert all(a >= b for a, b in zip(times, times[1:])), times
    assert times[0] > 1.5 * times[-1]          # a 1 TFLOP/s roof on 40 % of the state shows


# --- the readings block -----------------------------------------------------------------------------------

TINY = """name: {name}
description: tiny
models: [megatron-22b]
cluster: dgx-a100-80gb
devices: 64
global_batch: 64
axes:
  hbm_capacity: {{scale: [1.0, 2.0]}}
strategy:
  tp: [1, 2, 4, 8]
  micro_batch: [1]
  interleave: [1]
  recompute: [full]
  zero: [0]
  grad_buffer: [whole, layer]
{extra}figures: [capacity]
"""
READINGS = """title: Mine
readings:
  studies: [tiny]
  questions:
    - question: grid
      answers:
        - {name: any, assumes: every MP}
        - {name: four, assumes: powers of 4, set: {mp: {dgx-a100-80gb: [1, 4]}}}
    - question: gradients
      answers:
        - {name: whole, set: {strategy: {grad_buffer: whole}}}
        - {name: layer, set: {strategy: {grad_buffer: layer}}}
    - question: sequence
      answers:
        - {name: long}
        - {name: short, set: {seq_len: 1024, global_batch: 128}}
findings:
  - finding: "x1: the smallest split that fits"
    paper: MP4_DP16
    measure: first-fit
    paper_setup: {study: tiny, variant: {hbm_capacity: 1.0}}
    modern_setup: {study: tiny, variant: {hbm_capacity: 1.0}}
    evidence: a tiny test
  - finding: "x2 over x1"
    paper: 1.0
    measure: speedup
    paper_setup: {study: tiny, variant: {hbm_capacity: 2.0}, over: {hbm_capacity: 1.0}}
    modern_setup: {study: tiny, variant: {hbm_capacity: 2.0}, over: {hbm_capacity: 1.0}}
    not_public: what the paper measured
"""


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("readings") / "mine"
    folder.mkdir()
    (folder / "tiny.yaml").write_text(TINY.format(name="tiny", extra=""))
    (folder / "report.yaml").write_text(READINGS)
    return build_report(folder, folder.parent / "out", progress=False)


def test_every_combination_of_answers_is_a_reading(tiny_report):
    rows = json.loads((tiny_report.parent / "findings.json").read_text())
    names = ["any whole long", "any whole short", "any layer long", "any layer short",
             "four whole long", "four whole short", "four layer long", "four layer short"]
    for row in rows:
        assert sorted(row["readings"]) == sorted(names)
        assert {"finding", "paper", "unit", "readings", "status", "evidence"} <= set(row)
    fit, speed = rows
    assert speed["status"] == "not determinable" and "what the paper measured" in speed["evidence"]
    assert fit["status"] in ("reproduced", "not reproduced")
    # no declared reading: the status is the literal reading's; the other readings are counted in its evidence
    assert (fit["status"] == "reproduced") == (fit["readings"]["any whole long"] == "MP4_DP16")
    assert fit["reproduced_under"] == sum(v == "MP4_DP16" for v in fit["readings"].values())
    if fit["status"] == "not reproduced" and fit["reproduced_under"]:
        assert "reproduced only under other readings" in fit["evidence"]
    # Under the powers-of-4 grid only MP1 and MP4 are read: never MP2 or MP8.
    assert all(v in ("MP1_DP64", "MP4_DP16", None) for k, v in fit["readings"].items() if k.startswith("four"))
    assert (tiny_report.parent / "data" / "tiny-short.parquet").exists()      # the sequence answer's own run


def test_a_selection_equals_a_run_with_the_override(tiny_report, tmp_path):
    """The reading `four layer long` selects rows of the study as written; the same study with `mp:` and
    grad_buffer layer, run on its own, gives the same fastest strategy and step time per variant."""
    folder = tiny_report.parent.parent / "mine"
    full = load_study(folder / "tiny.yaml")
    data = analysis.load(tiny_report.parent / "data" / "tiny.parquet", ("grad_buffer",))
    text = (folder / "tiny.yaml").read_text().replace("grad_buffer: [whole, layer]", "grad_buffer: [layer]")
    (tmp_path / "own.yaml").write_text(text + "mp: [1, 4]\n")
    own = load_study(tmp_path / "own.yaml")
    run_study(own, tmp_path / "own.parquet", progress=False)
    mine = analysis.load(tmp_path / "own.parquet", ("grad_buffer",))
    block = rd.from_yaml(__import__("yaml").safe_load(READINGS)["readings"])
    reading = next(r for r in block.all() if r.name == "four layer long")
    rows = rd.mask(data, full, reading)
    for v in full.variants:
        a = data["step_time_s"][rows & (data["variant"] == v.index) & data["feasible"]]
        b = mine["step_time_s"][(mine["variant"] == v.index) & mine["feasible"]]
        assert sorted(a) == pytest.approx(sorted(b))
    assert set((data["tp"] * data["pp"])[rows]) == {1, 4}


def test_the_findings_table_round_trips_to_findings_json(tiny_report):
    """Every row of the page's table holds what findings.json holds: the paper's value, the literal and the best
    reading's values, the span over the readings and the status (no declared reading here)."""
    _round_trip(tiny_report)


def _round_trip(page: Path):
    rows = json.loads((page.parent / "findings.json").read_text())
    table = page.read_text().split('<table class="findings">', 1)[1].split("</table>", 1)[0]
    body = [r for r in table.split("<tr>")[2:]]
    assert len(body) == len(rows)
    for row, tr in zip(rows, body):
        cells = [htmlmod.unescape(re.sub(r"<small>.*?</small>|<[^>]+>", "", c)).strip()
                 for c in re.findall(r'<td class="l">(.*?)</td>', tr, flags=re.S)]
        unit = row["unit"]
        declared = int(row["declared"]["reading"] != row["literal"]["reading"] or declared_column(page))
        assert cells[0] == f"F{rows.index(row) + 1}" and cells[1] == row["finding"]
        assert cells[2] == value_text(row["paper"], unit)
        if declared:
            assert cells[3] == value_text(row["declared"]["value"], unit)
        cells = cells[declared:]
        assert cells[3] == value_text(row["literal"]["value"], unit)
        assert cells[4] == value_text(row["best"]["value"], unit)
        assert cells[5] == row["span"] and cells[6] == row["status"]
        assert cells[7] == value_text(row["modern_setup"]["value"], unit)
        assert cells[8] == row["evidence"]
        assert row["readings"][row["literal"]["reading"]] == row["literal"]["value"]
        assert row["readings"][row["best"]["reading"]] == row["best"]["value"]


def declared_column(page: Path) -> bool:
    return "<th class=\"l\">declared reading (" in page.read_text()


def test_the_score_sentence_counts_what_the_json_says(tiny_report):
    """Without a declared reading the headline is the literal reading's; the best one is named after it."""
    rows = json.loads((tiny_report.parent / "findings.json").read_text())
    best, literal = rows[0]["best"]["reading"], rows[0]["literal"]["reading"]
    from comet_dse.report.findings import matches

    def score(name):
        return sum(1 for r in rows if r["status"] != "not determinable" and matches(r["paper"], r["readings"][name],
                                                                                      r["unit"]))
    html = htmlmod.unescape(tiny_report.read_text())
    assert (f"Score: comet-dse reproduces {score(literal)} of the paper's 2 findings under the literal reading "
            f"({literal})") in html
    assert f"the best one (picked by its score, after the results) reproduces {score(best)} ({best})" in html


def test_a_reading_that_selects_what_a_study_does_not_search_is_refused(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "tiny.yaml").write_text(TINY.format(name="tiny", extra="").replace("[whole, layer]", "[whole]"))
    (folder / "report.yaml").write_text(READINGS)
    with pytest.raises(InputError) as info:
        build_report(folder, tmp_path / "out", progress=False)
    assert "grad_buffer layer" in info.value.message and not (tmp_path / "out").exists()


def test_the_shipped_readings_are_every_combination_of_their_answers():
    """studies/comet/report.yaml: 8 questions, 2 x 2 x 2 x 2 x 2 x 3 x 3 x 3 = 864 readings; the first is the
    literal one, the studies as written. A study without an expansion tier runs again only for the sequence
    length; one with a tier also for the tier's compute roof."""
    import yaml

    block = rd.from_yaml(yaml.safe_load((STUDIES / "report.yaml").read_text())["readings"])
    every = block.all()
    assert len(every) == 864 and len(block.questions) == 8
    literal = every[0]
    assert literal.name == "seq2048 grid2 whole 80gb x4096 tile prefetch comet-dse"
    assert not literal.run and not literal.clusters and literal.cost == "comet-dse"
    seq = {"seq_len": 1024, "global_batch": 4096}
    assert block.runs(tier=False) == {"": {}, "seq1024": seq}
    roof = {"expansion": {"compute": "10 TFLOP/s"}}
    assert block.runs(tier=True) == {"": {}, "seq1024": seq, "roofline-peak": roof, "seq1024+roofline-peak": {**seq, **roof}}


ROOFS = """name: roofs
description: compute roofs
models: [comet-transformer-1t]
cluster: tpu-v4
devices: 4096
global_batch: 2048
expansion: {{capacity: 64 GiB, bandwidth: 64 GB/s{compute}}}
axes:
  expansion_compute: {axis}
strategy: {{model_parallel: pure-mp, pp: 1, expansion_roofline: [true]}}
figures: [speedup]
"""


def test_a_study_sweeps_the_tiers_compute_roof(tmp_path):
    """The study axis `expansion_compute` sets the tier's compute roof per variant (values in FLOP/s); scaling it
    needs a roof to scale, which the study's tier may give."""
    path = tmp_path / "roofs.yaml"
    path.write_text(ROOFS.format(compute="", axis='{values: ["10 TFLOP/s", "1 PFLOP/s"]}'))
    roofs = [v.cluster.accelerator.expansion.compute for v in load_study(path).variants]
    assert roofs == [10e12, 1e15]
    path.write_text(ROOFS.format(compute="", axis="{scale: [2]}"))
    with pytest.raises(InputError) as info:
        load_study(path)
    assert info.value.field == "axes.expansion_compute" and "no compute roof to scale" in info.value.message
    path.write_text(ROOFS.format(compute=", compute: 10 TFLOP/s", axis="{scale: [0.5, 2]}"))
    assert [v.cluster.accelerator.expansion.compute for v in load_study(path).variants] == [5e12, 20e12]


@pytest.mark.parametrize("value", ["10 TFLOP/s", "{}", "[1, 2]"])
def test_a_tier_answer_must_be_a_mapping_of_tier_fields(value):
    raw = {"studies": ["tiny"], "questions": [{"question": "tier", "answers": [
        {"name": "plain"}, {"name": "roof", "set": {"expansion": __import__("yaml").safe_load(value)}}]}]}
    with pytest.raises(InputError) as info:
        rd.from_yaml(raw)
    assert info.value.field == "report.readings.questions[0].answers[1].set.expansion"
    assert "mapping of expansion-tier fields" in info.value.message


def test_a_tier_answer_runs_only_the_studies_with_a_tier_again():
    """`set: {expansion: {compute: ...}}` merges into a study's own `expansion:` (capacity, bandwidth and latency
    stay the file's) and leaves a study without a tier as written (no run of its own)."""
    from comet_dse.report.build import load_folder, reading_runs

    text, studies = load_folder(STUDIES)
    runs = reading_runs(text, studies)
    assert {s.name for s in runs["roofline-peak"]} == {"paper-rq5-expansion@roofline-peak"}
    assert {s.name for s in runs["seq1024"]} == {f"{n}@seq1024" for n in text.readings.studies}
    written = next(s for s in studies if s.name == "paper-rq5-expansion").variants[0].cluster.accelerator.expansion
    again = runs["seq1024+roofline-peak"][0]
    tier = again.variants[0].cluster.accelerator.expansion
    assert tier.compute == 10e12 and written.compute is None
    assert (tier.capacity, tier.bandwidth, tier.latency) == (written.capacity, written.bandwidth, written.latency)
    assert again.models[0].seq_len == 1024


def test_a_study_searches_each_clusters_mp_grid(tmp_path):
    """`mp: {cluster: [...]}`: the named cluster's splits on its grid, the other cluster's every MP."""
    text = TINY.format(name="two", extra="").replace("cluster: dgx-a100-80gb", "clusters: [dgx-a100-80gb, dgx-h100]")
    text = text.replace("  hbm_capacity: {scale: [1.0, 2.0]}", "  hbm_capacity: {scale: [1.0]}")
    (tmp_path / "two.yaml").write_text(text + "mp: {dgx-a100-80gb: [1, 4]}\n")
    study = load_study(tmp_path / "two.yaml")
    run_study(study, tmp_path / "two.parquet", progress=False)
    data = analysis.load(tmp_path / "two.parquet")
    by_cluster = {v.cluster.name: set((data["tp"] * data["pp"])[data["variant"] == v.index]) for v in study.variants}
    assert by_cluster["dgx-a100-80gb"] == {1, 4} and {1, 2, 4, 8, 16} <= by_cluster["dgx-h100"]
    with pytest.raises(InputError) as info:
        (tmp_path / "bad.yaml").write_text(text + "mp: {tpu-v4: [4]}\n")
        load_study(tmp_path / "bad.yaml")
    assert info.value.field == "mp.tpu-v4"


DECLARED = """# four layer long
answers:
  grid: {answer: four, evidence: the paper names powers of 4}
  gradients: {answer: layer, evidence: the workload reduces layer by layer}
  sequence: {answer: long, evidence: the file's tokens}
"""


@pytest.fixture(scope="module")
def declared_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("declared") / "mine"
    folder.mkdir()
    (folder / "tiny.yaml").write_text(TINY.format(name="tiny", extra=""))
    (folder / "report.yaml").write_text(READINGS + "declared_reading: declared.yaml\n")
    (folder / "declared.yaml").write_text(DECLARED)       # a YAML file of the folder that is not a study
    return build_report(folder, folder.parent / "out", progress=False)


def test_a_declared_reading_heads_the_score_and_sets_the_statuses(declared_report):
    rows = json.loads((declared_report.parent / "findings.json").read_text())
    fit, speed = rows
    assert fit["declared"]["reading"] == "four layer long"
    assert fit["declared"]["value"] == fit["readings"]["four layer long"]
    assert (fit["status"] == "reproduced") == (fit["readings"]["four layer long"] == "MP4_DP16")
    assert speed["status"] == "not determinable"
    html = htmlmod.unescape(declared_report.read_text())
    hit = int(fit["status"] == "reproduced")
    assert (f"Score: comet-dse reproduces {hit} of the paper's 2 findings under its declared reading "
            f"(four layer long)") in html
    assert "the workload reduces layer by layer" in html            # each answer's evidence is on the page
    _round_trip(declared_report)


@pytest.mark.parametrize("text, field", [
    (DECLARED.replace("  sequence: {answer: long, evidence: the file's tokens}\n", ""),
     "report.declared_reading.answers.sequence"),
    (DECLARED.replace("answer: four", "answer: five"), "report.declared_reading.answers.grid.answer"),
    (DECLARED.replace("evidence: the paper names powers of 4", "evidence: ''"),
     "report.declared_reading.answers.grid.evidence"),
    (DECLARED + "  colour: {answer: red, evidence: none}\n", "report.declared_reading.answers.colour"),
])
def test_a_declared_reading_answers_every_question_with_evidence(tmp_path, text, field):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "tiny.yaml").write_text(TINY.format(name="tiny", extra=""))
    (folder / "report.yaml").write_text(READINGS + "declared_reading: declared.yaml\n")
    (folder / "declared.yaml").write_text(text)
    with pytest.raises(InputError) as info:
        build_report(folder, tmp_path / "out", progress=False)
    assert info.value.field == field and not (tmp_path / "out").exists()
    from comet_dse.cli import main
    assert main(["report", str(folder), "--output", str(tmp_path / "out"), "--no-progress"]) == 2


def test_the_shipped_declared_reading_answers_every_question():
    """studies/comet/declared_reading.yaml names one answer, with its evidence, to each of the 8 questions."""
    from comet_dse.report.build import load_report_text

    readings = load_report_text(STUDIES).readings
    chosen = readings.declared_reading()
    assert chosen is not None and len(readings.declared) == 8
    assert chosen.name == "seq1024 grid2 whole 80gb x4096 tile roofline sim-gemm"
    assert all(evidence for _, _, evidence in readings.declared)
