"""comet-dse export: Chakra traces decoded through the compiled schema and checked against the estimate, as Chakra's
reader and ASTRA-sim's workload layer read them; the ASTRA-sim 1.0 workload against the COMET authors' simulator."""
from __future__ import annotations

import csv
import json
from collections import Counter, defaultdict
from importlib import resources
from pathlib import Path

from dataclasses import replace

import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.export import astrasim_inputs as asi
from comet_dse.export.chakra_schema import SCHEMA_VERSION, read_trace, schema
from comet_dse.export.folder import MARKER, export
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.declared import Strategy

from cli_run import one_line_error, run

pytest.importorskip("google.protobuf")

MODEL = load_model("megatron-1.7b")
DGX = load_cluster("dgx-a100-80gb")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "comet-astrasim"
ROWS = list(csv.DictReader(resources.files("comet_dse").joinpath("data", "validation", "comet_astrasim.csv")
                           .read_text().splitlines()))

H100 = load_cluster("dgx-h100")
MIXTRAL = load_model("mixtral-8x7b").with_seq_len(4096)
TINY_MOE = load_model(str(resources.files("comet_dse").joinpath("data", "validation", "models",
                                                                "megatron-ci-tiny-moe.yaml")))
# the tiny MoE model with its first two layers dense (DeepSeek's first_k_dense_replace; model.moe.dense_layers)
TINY_MOE_DENSE_FIRST = replace(TINY_MOE, moe=replace(TINY_MOE.moe, dense_layers=2))
# megatron-1.7b cut to 14 layers: with the embedding's and the loss's slots 16, which 4 x 2 and 2 x 4 chunks divide
MODEL_14 = replace(MODEL, layers=14)
STRATEGIES = {        # name -> (devices, strategy[, cluster[, model]]); DGX A100 and megatron-1.7b unless given
    "tp2-pp4-dp2-interleaved": (16, Strategy(tp=2, pp=4, dp=2, global_batch=16, micro_batch=1, interleave=2)),
    "fp8-dp-pp-tp-placement-separate-accumulation": (8, Strategy(
        tp=2, pp=2, dp=2, global_batch=8, micro_batch=1, dtype="fp8", placement="dp-pp-tp",
        grad_accumulation="separate", flash_attention=True), H100),
    "tp2-pp2-dp2-sp-zero1-full": (8, Strategy(tp=2, pp=2, dp=2, global_batch=8, micro_batch=2,
                                              sequence_parallel=True, zero=1, recompute="full", dp_overlap=False)),
    "tp4-dp2": (8, Strategy(tp=4, dp=2, global_batch=8, micro_batch=2, flash_attention=True)),
    "pp5-uneven": (5, Strategy(pp=5, global_batch=10, micro_batch=1)),
    "zero3-fsdp": (8, Strategy(tp=2, pp=2, dp=2, global_batch=8, micro_batch=2, zero=3)),
    "zero3-kept-gathered-step-sync": (8, Strategy(dp=8, global_batch=16, micro_batch=1, zero=3,
                                                  reshard_after_forward=False, grad_sync="step")),
    "pp4-embedding-loss": (4, Strategy(pp=4, global_batch=8, micro_batch=2, pipeline_split="embedding-loss",
                                       pipeline_engine="deepspeed")),
    # mixture-of-experts: expert all-to-alls over EP, the routed experts' gradients over expert DP
    "mixtral-tp2-pp2-ep4-sp-zero1": (16, Strategy(tp=2, pp=2, dp=4, ep=4, global_batch=8, micro_batch=1,
                                                  sequence_parallel=True, zero=1, flash_attention=True),
                                     H100, MIXTRAL),
    "mixtral-fp8-dispatch-ep2-edp2-full": (8, Strategy(tp=2, dp=4, ep=2, global_batch=8, micro_batch=1, dtype="fp8",
                                                       ep_fp8_dispatch=True, recompute="full", zero=1,
                                                       flash_attention=True, moe_dispatcher="flex"), H100, MIXTRAL),
    "tiny-moe-dense-first-pp2-ep2-edp2": (8, Strategy(pp=2, dp=4, ep=2, global_batch=8, micro_batch=1,
                                                      moe_imbalance=1.3), DGX, TINY_MOE_DENSE_FIRST),
    "tiny-moe-tp2-pp3-ep2-overlap": (24, Strategy(tp=2, pp=3, dp=4, ep=2, global_batch=16, micro_batch=2,
                                                  ep_overlap=True, recompute="selective"), DGX, TINY_MOE),
    # context parallelism: the K/V ring beside each layer's compute, or the all-gather and reduce-scatter
    "cp2-ring-tp2-dp2": (8, Strategy(tp=2, cp=2, dp=2, global_batch=8, micro_batch=1, flash_attention=True)),
    "cp4-all-gather-pp2-full": (8, Strategy(cp=4, pp=2, global_batch=4, micro_batch=1, cp_algorithm="all-gather",
                                            recompute="full", flash_attention=True)),
    "cp4-ring-full-placement-dp-pp-tp": (16, Strategy(cp=4, pp=2, dp=2, global_batch=4, micro_batch=1,
                                                      recompute="full", placement="dp-pp-tp", zero=1)),
    "tiny-moe-cp2-ep2-sp-zero1": (16, Strategy(tp=2, cp=2, dp=4, ep=2, global_batch=8, micro_batch=1,
                                               sequence_parallel=True, zero=1), DGX, TINY_MOE),
    # the embedding-loss split with interleaving: 16 slots in p v equal chunks, the first and the last a layer short
    "pp4-v2-embedding-loss-zero3": (8, Strategy(pp=4, dp=2, global_batch=16, micro_batch=2, interleave=2,
                                                pipeline_split="embedding-loss", zero=3), DGX, MODEL_14),
    "pp2-v4-embedding-loss-tp2-sp": (8, Strategy(tp=2, pp=2, dp=2, global_batch=8, micro_batch=1, interleave=4,
                                                 pipeline_split="embedding-loss", sequence_parallel=True), DGX,
                                     MODEL_14),
    "tiny-moe-14-pp2-v2-embedding-loss-ep2": (8, Strategy(pp=2, dp=4, ep=2, global_batch=8, micro_batch=1,
                                                          interleave=2, pipeline_split="embedding-loss"),
                                              DGX, replace(TINY_MOE, layers=14)),
    # ZeRO 3 of a MoE model: the shared shards over DP, the routed experts' over expert DP, unit by unit
    "tiny-moe-dense-first-zero3-ep2-edp2": (8, Strategy(pp=2, dp=4, ep=2, global_batch=8, micro_batch=1, zero=3),
                                            DGX, TINY_MOE_DENSE_FIRST),
    "tiny-moe-zero3-step-sync-kept-cp2": (16, Strategy(cp=2, dp=8, ep=4, global_batch=16, micro_batch=1, zero=3,
                                                      grad_sync="step", reshard_after_forward=False), DGX, TINY_MOE),
}


def load(folder: Path) -> dict:
    """rank -> (GlobalMetadata, [Node]) of every ET file of an export."""
    out = {}
    for path in (folder / "chakra").glob("workload.*.et"):
        out[int(path.name.split(".")[1])] = read_trace(path.read_bytes())
    return out


def attrs(node) -> dict:
    """Attribute name -> its value (the oneof field that is set)."""
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}


def case(name: str) -> tuple:
    """(devices, strategy, cluster, model) of STRATEGIES[name]."""
    devices, strategy, *rest = STRATEGIES[name]
    return devices, strategy, rest[0] if rest else DGX, rest[1] if len(rest) > 1 else MODEL


@pytest.fixture(scope="module", params=list(STRATEGIES))
def exported(request, tmp_path_factory):
    devices, strategy, cluster, model = case(request.param)
    folder = export(model, cluster, devices, strategy, tmp_path_factory.mktemp("export") / "out")
    return devices, strategy, folder, load(folder), cluster, model


def assert_well_formed(traces: dict, devices: int, node_types: tuple) -> None:
    """Every rank has a trace: its metadata of this schema first, ids 0..n-1, every data dependency on an earlier
    node (a graph in file order has no cycle), a name, a type among ``node_types``, no CPU op."""
    assert sorted(traces) == list(range(devices))
    for rank, (meta, nodes) in traces.items():
        assert meta.version == SCHEMA_VERSION
        assert [n.id for n in nodes] == list(range(len(nodes)))
        for n in nodes:
            assert all(d < n.id for d in n.data_deps) and n.name
            assert n.type in node_types
            assert attrs(n)["is_cpu_op"] is False

def test_every_rank_decodes_and_reads_as_chakras_feeder_reads_it(exported):
    """One file per rank; the metadata first; ids unique; every data dependency on an earlier node (the feeder
    resolves them, and a graph in file order has no cycle); every node type one the workload layer issues."""
    devices, _, folder, traces, _, _ = exported
    s = schema()
    assert_well_formed(traces, devices, (s.COMP_NODE, s.COMM_COLL_NODE, s.COMM_SEND_NODE, s.COMM_RECV_NODE))
    table = json.loads((folder / "chakra" / "ranks.json").read_text())
    assert {int(r): v["nodes"] for r, v in table.items()} == {r: len(t[1]) for r, t in traces.items()}


def test_compute_durations_add_up_to_the_estimates_compute(exported):
    """The busiest rank's forward and backward nodes sum to the estimate's forward + backward + recompute (whole
    microseconds, rounded once per rank); no rank computes more; the optimizer node is the estimate's."""
    devices, strategy, _, traces, cluster, model = exported
    result = estimate(model, cluster, devices, strategy)
    expected = sum(result.phases_s.values()) * 1e6
    per_rank = {}
    for rank, (_, nodes) in traces.items():
        parts = defaultdict(int)
        for n in nodes:
            if n.type == schema().COMP_NODE:
                parts[attrs(n)["comet_dse_part"]] += n.duration_micros
        per_rank[rank] = parts["forward"] + parts["backward"]
        assert parts["optimizer"] == pytest.approx(result.breakdown_s["optimizer"] * 1e6, abs=1)
    assert max(per_rank.values()) == pytest.approx(expected, abs=1.0)


def test_flops_over_all_ranks_are_the_estimates_hardware_flops(exported):
    devices, strategy, _, traces, cluster, model = exported
    total = sum(attrs(n).get("num_ops", 0) for _, nodes in traces.values() for n in nodes)
    assert total == pytest.approx(estimate(model, cluster, devices, strategy).hardware_flops_per_step, rel=1e-9)


def test_bytes_of_every_collective_and_transfer(exported):
    """TP collectives are on b s/cp h e bytes (an all-gather's comm_size the 1/t each rank brings, as ASTRA-sim
    reads it), pipeline transfers 1/t of it (Megatron's scatter-gather), the DP gradient reductions fp32
    gradients of every parameter once over the stages of one TP rank (the tied embedding's copy on the last
    stage included; the layers' norms and a MoE layer's router, replicated on every TP rank, t times); a MoE
    model's routed experts reduced over expert DP instead, each EP block's ranks holding all of them."""
    devices, strategy, folder, traces, cluster, model = exported
    s = schema()
    act = strategy.micro_batch * model.seq_len // strategy.cp * model.hidden * 2
    groups = json.loads((folder / "astrasim2" / "comm_groups.json").read_text())
    reduced, gathered = defaultdict(lambda: defaultdict(float)), defaultdict(lambda: defaultdict(float))
    nodes_of = Counter()      # collectives summed per part and rank: each comm_size is rounded to a whole byte
    for rank, (_, nodes) in traces.items():
        for n in nodes:
            a = attrs(n)
            if n.type == s.COMM_COLL_NODE:
                assert rank in groups[a["pg_name"]]
                if ".tp_" in n.name and "loss" not in n.name:     # an all-gather: each rank's piece (ASTRA-sim)
                    assert a["comm_size"] == (act // strategy.tp if a["comm_type"] == s.ALL_GATHER else act)
                for part in ("dp", "expert"):
                    if f"{part}_gradient" in n.name:
                        reduced[part][rank] += a["comm_size"]
                        nodes_of[("reduced", part, rank)] += 1
                    if f"{part}_weight_all_gather" in n.name:      # the whole tensor: the piece x the members
                        gathered[part][rank] += a["comm_size"] * len(groups[a["pg_name"]])
                        nodes_of[("gathered", part, rank)] += len(groups[a["pg_name"]])
            elif n.type in (s.COMM_SEND_NODE, s.COMM_RECV_NODE) and ".cp_" not in n.name:    # a pipeline transfer
                assert a["comm_size"] == act // strategy.tp
    if strategy.dp * strategy.cp == 1:
        return
    table = json.loads((folder / "chakra" / "ranks.json").read_text())
    block = [int(r) for r, v in table.items() if v["tp"] == 0 and v.get("cp", 0) == 0 and v["dp"] < strategy.ep]
    tied = model.vocab * model.hidden if (model.tied_embeddings and strategy.pp > 1) else 0
    replicated = model.layers * model.layer_norm_params() + model.moe_layers * model.hidden * (
        model.moe.experts if model.moe else 0)
    experts = model.moe_layers * model.moe.experts * model.ffn_params(model.moe.ffn) if model.moe else 0
    expert_dp = strategy.dp * strategy.cp // strategy.ep > 1
    params = {"dp": model.total_params() - experts + tied + (strategy.tp - 1) * replicated,
              "expert": experts if expert_dp else 0}
    reductions = 1     # per step; ZeRO 3 reduce-scatters every micro-batch unless grad_sync step
    m = strategy.global_batch // (strategy.dp * strategy.micro_batch)
    if strategy.zero >= 3 and strategy.grad_sync.value == "micro-batch":
        reductions = m
    # 16-bit weights gathered: once a step (ZeRO 1/2, after the optimizer); ZeRO 3 each micro-batch's forward,
    # and its backward again when they were freed after forward
    times = {0: 0, 1: 1, 2: 1, 3: m * (1 + strategy.reshard_after_forward)}[int(strategy.zero)]
    for part, copies in (("dp", strategy.ep), ("expert", 1)):    # an EP block holds the shared weights ep times
        scale = strategy.tp / copies
        rounding = {kind: 0.5 * scale * sum(nodes_of[(kind, part, r)] for r in block)
                    for kind in ("reduced", "gathered")}
        per_block = sum(reduced[part][r] for r in block) * scale
        assert per_block / 4 / reductions == pytest.approx(params[part], rel=1e-9, abs=rounding["reduced"] / 4)
        gathered_block = sum(gathered[part][r] for r in block) * scale
        assert gathered_block / 2 == pytest.approx(times * params[part], rel=1e-9, abs=rounding["gathered"] / 2)


def test_sends_match_receives_and_groups_agree(exported):
    """Every send has one receive of the same bytes and tag on its destination; every member of a group issues
    the same collectives in the same order (ASTRA-sim pairs them by order)."""
    _, _, folder, traces, _, _ = exported
    s = schema()
    sends, recvs, seq = defaultdict(int), defaultdict(int), defaultdict(list)
    for rank, (_, nodes) in traces.items():
        for n in nodes:
            a = attrs(n)
            if n.type == s.COMM_SEND_NODE:
                assert a["comm_src"] == rank
                sends[(a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"])] += 1
            elif n.type == s.COMM_RECV_NODE:
                assert a["comm_dst"] == rank
                recvs[(a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"])] += 1
            elif n.type == s.COMM_COLL_NODE:
                seq[(a["pg_name"], rank)].append((a["comm_type"], a["comm_size"]))
    assert sends == recvs and all(v == 1 for v in sends.values())
    groups = json.loads((folder / "astrasim2" / "comm_groups.json").read_text())
    for gid, members in groups.items():
        orders = {tuple(seq[(gid, r)]) for r in members}
        assert len(orders) == 1 and orders != {()}


def _run_to_completion(traces: dict, groups: dict) -> float:
    """Execute every rank's graph as ASTRA-sim's workload layer issues it, with communication taking no time:
    compute takes its duration; the k-th collective a rank issues on a group ends when every member issued its
    k-th (ASTRA-sim pairs them by order); a receive once its send was issued (the analytical backend's sends
    are eager); and, as ASTRA-sim's HardwareResource, one communication node other than a receive in flight
    per rank, ready nodes issued in id order. Returns the finishing time [us]; raises on a deadlock."""
    s = schema()
    done = {r: {} for r in traces}
    issued = {r: set() for r in traces}
    calls = defaultdict(lambda: defaultdict(dict))      # group -> k -> rank -> (start, node id)
    count = defaultdict(int)                            # (group, rank) -> collectives issued
    sent = {}
    while any(len(done[r]) < len(nodes) for r, (_, nodes) in traces.items()):
        progress = False
        for rank, (_, nodes) in traces.items():
            for n in nodes:
                if n.id in done[rank] or n.id in issued[rank] or not all(d in done[rank] for d in n.data_deps):
                    continue
                if n.type in (s.COMM_COLL_NODE, s.COMM_SEND_NODE) and issued[rank]:
                    continue                    # a collective of this rank is in flight
                start = max([done[rank][d] for d in n.data_deps], default=0.0)
                a = attrs(n)
                if n.type == s.COMP_NODE:
                    done[rank][n.id] = start + n.duration_micros
                elif n.type == s.COMM_SEND_NODE:
                    sent[(rank, a["comm_dst"], a["comm_tag"])] = start
                    done[rank][n.id] = start
                elif n.type == s.COMM_RECV_NODE:
                    key = (a["comm_src"], rank, a["comm_tag"])
                    if key not in sent:
                        continue
                    done[rank][n.id] = max(start, sent[key])
                else:
                    group = a["pg_name"]
                    calls[group][count[(group, rank)]][rank] = (start, n.id)
                    count[(group, rank)] += 1
                    issued[rank].add(n.id)
                progress = True
        for group, by_index in calls.items():
            for k in list(by_index):
                if len(by_index[k]) == len(groups[group]):
                    end = max(start for start, _ in by_index[k].values())
                    for rank, (_, nid) in by_index.pop(k).items():
                        done[rank][nid] = end
                        issued[rank].discard(nid)
                    progress = True
        if not progress:
            raise AssertionError("deadlock: no node can run")
    return max(max(d.values()) for d in done.values())


def test_the_step_runs_to_completion(exported):
    """No rank waits forever (sends matched, collectives complete). With free communication the step is the
    critical rank's kernels and the optimizer when there is no pipeline, and with one no longer than those plus
    comet-dse's bubble, (p - 1)/v slowest-stage micro-batches: the traces' stages other than the slowest are
    faster, so their share of the warm-up and drain is shorter."""
    devices, strategy, folder, traces, cluster, model = exported
    end = _run_to_completion(traces, json.loads((folder / "astrasim2" / "comm_groups.json").read_text()))
    result = estimate(model, cluster, devices, strategy)
    b = result.breakdown_s
    cast = max(n.duration_micros for _, nodes in traces.values() for n in nodes if n.name == "fp8_weight_cast"
               ) / 1e6 if strategy.dtype.value == "fp8" else 0.0      # fp8's weight cast, once, before the step
    kernels = sum(result.phases_s.values()) + b["optimizer"] + cast
    if strategy.pp == 1:
        assert end == pytest.approx(kernels * 1e6, abs=2.0)
    else:
        assert kernels * 1e6 - 2.0 <= end <= (kernels + b["pipeline_bubble"]) * 1e6 + 2.0


# --- the ASTRA-sim 1.0 workload of the COMET authors' fork ---------------------------------------------------

def _compute_by_the_fork(text: str, peak: float, bandwidth: float) -> float:
    """Seconds of compute the fork's HYBRID_TRANSFORMER_FWD_IN_BCKWD loop runs for ``text``, read as its parser
    reads it (OPS, MEM_BYTES per phase; enable-roofline: max(OPS / peak, MEM / bandwidth)): every row's forward,
    input and weight gradient, and at each checkpoint initiator the re-run forward of the rows from its
    checkpoint up to it (Workload::iterate_hybrid_parallel_Transformer_fwd_in_bckwd)."""
    lines = text.splitlines()
    head = lines[0].split()
    checkpoints = [int(x) for x in head[head.index("checkpoints:") + 2: head.index("checkpoint_initiates:")]]
    initiators = [int(x) for x in head[head.index("checkpoint_initiates:") + 2:]]
    rows = [line.split("\t") for line in lines[2:2 + int(lines[1])]]
    phase = [[max(float(r[c]) / peak, float(r[c + 1]) / bandwidth) for c in (2, 7, 12)] for r in rows]
    total = sum(sum(p) for p in phase)
    for end, start in zip(initiators, reversed(checkpoints)):
        total += sum(phase[i][0] for i in range(start, end))
    return total


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['cluster']}-MP{r['mp']}")
def test_the_v1_workload_gives_the_simulators_compute(row):
    """Each split of results.csv, written as the fork's workload and read by its rules: the compute it ran
    (whole milliseconds in the file) to 0.5 %."""
    cluster = load_cluster({"tpu-v4": "tpu-v4", "dgx-a100": "dgx-a100-80gb"}[row["cluster"]])
    mp, dp = int(row["mp"]), int(row["dp"])
    text = asi.workload_v1(load_model("comet-transformer-1t"), cluster, mp, dp, 2048)
    acc = cluster.accelerator
    compute = _compute_by_the_fork(text, acc.peak_flops["bf16"], acc.hbm.bandwidth)
    assert compute == pytest.approx(float(row["sim_compute_ms"]) / 1e3, rel=0.005, abs=0.5e-3)


def test_the_v1_files_are_the_authors_formats():
    """MP128 x DP32 on 4,096 TPU v4: the workload is the authors' file but for the cycles column (theirs a constant
    the roofline ignores, ours the roofline's cycles); system and network files as the rebuilt run's."""
    tpu = load_cluster("tpu-v4")
    ours = asi.workload_v1(load_model("comet-transformer-1t"), tpu, 128, 32, 2048)
    acc = tpu.accelerator
    for line in ours.splitlines()[2:]:
        cells = line.split("\t")
        assert int(cells[4]) == round(max(int(cells[2]) / acc.peak_flops["bf16"], int(cells[3]) / acc.hbm.bandwidth)
                                      * 1e9)
    if not SHARED.exists():
        pytest.skip("../shared/comet-astrasim is not here")
    theirs = (SHARED / "inputs" / "workload_tpu_dgx_4096_mp128.txt").read_text()
    cycles = (4, 9, 14)
    strip = lambda line: [c for i, c in enumerate(line.split("\t")) if i not in cycles]   # noqa: E731
    assert [strip(x) for x in ours.splitlines()] == [strip(x) for x in theirs.splitlines()]
    assert asi.system_v1(tpu, 3) == (SHARED / "inputs" / "tpuv4.txt").read_text()
    assert json.loads(asi.network_v1(tpu, 4096)) == json.loads((SHARED / "inputs" / "tpuv4_4096.json").read_text())
    assert json.loads(asi.network_v1(DGX, 4096)) == json.loads((SHARED / "inputs" / "dgxa100_4096.json").read_text())


def test_the_v2_network_is_comet_dses_per_device_bandwidth():
    """ASTRA-sim reads GB/s as 2^30 bytes/s: DGX A100's NVLink, 12 x 25 GB/s x 0.78, is 217.93 there
    (234e9 / 2^30); its 7 us per step is 3.5 us per link, a message crossing two (to the switch and out);
    dimensions of one NPU are left out (the parser refuses them)."""
    text = asi.network_v2(DGX, 8)
    assert "npus_count: [ 8 ]" in text and "topology: [ Switch ]" in text
    assert "bandwidth: [ 217.929" in text and "latency: [ 3500.000 ]" in text
    assert "latency: [ 1000.000, 1000.000, 1000.000 ]" in asi.network_v2(load_cluster("tpu-v4"), 4096)
    assert "npus_count: [ 8, 2 ]" in asi.network_v2(DGX, 16)


def test_the_descriptor_is_the_vendored_schema_compiled():
    """_et_def_descriptor.py is what protoc makes of et_def.proto (scripts/chakra_descriptor.py)."""
    pytest.importorskip("grpc_tools")
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "scripts" / "chakra_descriptor.py"
    spec = importlib.util.spec_from_file_location("chakra_descriptor", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from comet_dse.export._et_def_descriptor import SERIALIZED

    assert module.compiled() == SERIALIZED


# --- the command ---------------------------------------------------------------------------------------------

ARGS = ("export", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80gb", "--devices", 8, "--tp", 4,
        "--global-batch", 8)


def test_the_command_writes_replaces_its_own_and_refuses_the_rest(tmp_path, capsys):
    out = tmp_path / "out"
    code, text, err = run(capsys, *ARGS, "-o", out)
    assert code == 0 and "astrasim1/" in text, err
    assert (out / MARKER).exists() and len(list((out / "chakra").glob("*.et"))) == 8
    assert (out / "astrasim1" / "workload.txt").read_text().startswith("HYBRID_TRANSFORMER_FWD_IN_BCKWD")
    assert run(capsys, *ARGS, "-o", out)[0] == 0            # its own export, unchanged: replaced
    (out / "notes.txt").write_text("mine")
    one_line_error(run(capsys, *ARGS, "-o", out), "output", "notes.txt")
    assert (out / "notes.txt").read_text() == "mine"
    assert not list(tmp_path.glob(".out.tmp-*"))


@pytest.mark.parametrize("extra, needles", [
    (("--zero", 1, "--hybrid-shard"), ("hybrid-shard", "hybrid sharding")),
    (("--max-nodes", 10), ("max-nodes", "nodes")),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, extra, needles):
    out = tmp_path / "out"
    one_line_error(run(capsys, *ARGS, *extra, "-o", out), *needles)
    assert not out.exists() and not list(tmp_path.iterdir())


# --- the schedule --------------------------------------------------------------------------------------------

def _order(pp, interleave, microbatches, stage):
    from comet_dse.export.plan import plan_of
    from comet_dse.export.schedule import order

    strategy = Strategy(pp=pp, interleave=interleave, global_batch=microbatches, micro_batch=1)
    return [f"{phase}{k}.{c}" for phase, k, c in order(plan_of(MODEL, DGX, pp, strategy), stage)]


def test_1f1b_order_by_hand():
    """Stage 0 of 4 with 6 micro-batches: 3 warm-up forwards, then one forward one backward, then the drain."""
    assert _order(4, 1, 6, 0) == ["F0.0", "F1.0", "F2.0", "F3.0", "B0.0", "F4.0", "B1.0", "F5.0", "B2.0",
                                  "B3.0", "B4.0", "B5.0"]
    assert _order(4, 1, 6, 3) == [x for k in range(6) for x in (f"F{k}.0", f"B{k}.0")]


def test_interleaved_order_by_hand():
    """Megatron-LM's interleaved schedule, last of 2 stages, 2 chunks, 4 micro-batches: warm-up 2 (p - s - 1) +
    (v - 1) p = 2 forwards of chunk 0; forward virtual micro-batch j runs chunk (j mod 4) // 2 of micro-batch
    (j // 4) 2 + j mod 2, backward chunks counted from the last."""
    assert _order(2, 2, 4, 1) == ["F0.0", "F1.0", "F0.1", "B0.1", "F1.1", "B1.1", "F2.0", "B0.0", "F3.0", "B1.0",
                                  "F2.1", "B2.1", "F3.1", "B3.1", "B2.0", "B3.0"]


def test_no_traces_writes_the_papers_split_without_4096_traces(tmp_path, capsys):
    """--no-traces: the configurations and the 1.0 workload of a 4,096-device split, no chakra/ folder; the
    workload is the one workload_v1 writes for MP 128 x DP 32."""
    out = tmp_path / "comet"
    code, text, err = run(capsys, "export", "--model", "comet-transformer-1t", "--cluster", "tpu-v4", "--devices",
                          4096, "--tp", 128, "--global-batch", 2048, "--seq-len", 2048, "--no-traces", "-o", out)
    assert code == 0, err
    assert not (out / "chakra").exists() and (out / "astrasim2" / "network.yml").exists()
    tpu = load_cluster("tpu-v4")
    assert (out / "astrasim1" / "workload.txt").read_text() == asi.workload_v1(
        load_model("comet-transformer-1t").with_seq_len(2048), tpu, 128, 32, 2048)
    assert json.loads((out / "astrasim1" / "network.json").read_text()) == json.loads(asi.network_v1(tpu, 4096))


@pytest.mark.parametrize("layers", [1, 2, 5, 24, 61, 126, 128])
@pytest.mark.parametrize("pp", [1, 2, 3, 4, 7, 8, 16])
@pytest.mark.parametrize("slots", [0, 1])
def test_each_stages_layers_follow_the_cost_models_split(layers, pp, slots):
    """The traces' layers per stage (cost/pipeline.py: layers_per_stage) place every layer once, the first and the
    last stage as the cost model's split has them, the middle stages at most one apart with the extra ones first,
    the fullest of them the cost model's full stage."""
    from comet_dse.cost.pipeline import layers_per_stage, stage_layer_counts

    if (layers + 2 * slots) // pp < slots:
        return                     # a split the export refuses: the slots leave an end stage less than nothing
    each = layers_per_stage(layers, pp, slots)
    first, last, most = (float(x) for x in stage_layer_counts(layers, pp, float(slots)))
    assert len(each) == pp and sum(each) == layers and min(each) >= 0
    assert (each[0], each[-1]) == (first, last)
    middle = each[1:-1]
    if middle:
        assert max(middle) == most and max(middle) - min(middle) <= 1 and middle == sorted(middle, reverse=True)


def test_each_stages_layers_by_hand():
    """Llama 3 405B's 126 layers on 16 stages with the embedding and the loss in their own slots: 128 slots, 8 a
    stage, the ends 7; 61 layers on 4 stages: 15 each and the one extra to the first middle stage."""
    from comet_dse.cost.pipeline import layers_per_stage

    assert layers_per_stage(126, 16, 1) == [7] + [8] * 14 + [7]
    assert layers_per_stage(61, 4) == [15, 16, 15, 15]
    assert layers_per_stage(5, 2) == [2, 3] and layers_per_stage(24, 1, 1) == [24]


# --- the embedding-loss split with interleaving ---------------------------------------------------------------

def test_embedding_loss_chunks_by_hand():
    """14 layers + the embedding's and the loss's slots on 4 stages of 2 chunks: 8 virtual chunks of 2 slots, the
    first (stage 0, chunk 0) and the last (stage 3, chunk 1) one layer each; Llama 3 405B's 126 layers on 8 stages
    of 4 chunks: 32 of 4 slots, stage 0 3, 4, 4, 4 and the last stage 4, 4, 4, 3."""
    from comet_dse.export.plan import chunk_layers_of

    assert chunk_layers_of(14, 4, 2, 1) == ((1, 2), (2, 2), (2, 2), (2, 1))
    llama = chunk_layers_of(126, 8, 4, 1)
    assert llama[0] == (3, 4, 4, 4) and llama[-1] == (4, 4, 4, 3) and set(llama[1:-1]) == {(4, 4, 4, 4)}


@pytest.mark.parametrize("pp, interleave", [(2, 2), (2, 4), (4, 2), (4, 4), (8, 2), (3, 2), (6, 3)])
def test_embedding_loss_chunks_hold_the_cost_models_stage_layers(pp, interleave):
    """For every layer count whose L + 2 slots divide into pp x interleave chunks of at least 2, each stage's
    chunks sum to cost/pipeline.py's layers for that stage, every chunk but the first and the last holds the same
    number, and every layer is placed once."""
    from comet_dse.cost.pipeline import layers_per_stage
    from comet_dse.export.plan import chunk_layers_of

    chunks = pp * interleave
    for layers in range(2 * chunks - 2, 130, chunks):
        split = chunk_layers_of(layers, pp, interleave, 1)
        assert [sum(c) for c in split] == layers_per_stage(layers, pp, 1)
        n = (layers + 2) // chunks
        flat = [x for stage in split for x in stage]
        assert sum(flat) == layers and split[0][0] == split[-1][-1] == n - 1
        assert sorted(flat)[2:] == [n] * (len(flat) - 2)


def test_embedding_loss_interleaved_traces_place_the_layers(tmp_path):
    """megatron-1.7b cut to 14 layers, pp 4 v 2, embedding-loss: stage 0 runs the embedding and layer 0 (virtual
    stage 0), then layers 7 and 8 (virtual stage 4); stage 3 layers 5 and 6, then 13 and the loss."""
    devices, strategy, cluster, model = case("pp4-v2-embedding-loss-zero3")
    folder = export(model, cluster, devices, strategy, tmp_path / "out")
    traces = load(folder)
    table = json.loads((folder / "chakra" / "ranks.json").read_text())

    def layers_of(stage):
        rank = next(int(r) for r, v in table.items() if v["pp"] == stage and v["dp"] == 0)
        names = [n.name for n in traces[rank][1] if n.name.startswith("mb0.") and n.name.endswith(".fwd")
                 and n.type == schema().COMP_NODE]
        return names

    assert layers_of(0) == ["mb0.embedding.fwd", "mb0.layer0.fwd", "mb0.layer7.fwd", "mb0.layer8.fwd"]
    assert layers_of(3) == ["mb0.layer5.fwd", "mb0.layer6.fwd", "mb0.layer13.fwd", "mb0.head_loss.fwd"]


def test_embedding_loss_interleaving_needs_equal_chunks(tmp_path, capsys):
    """24 layers + 2 slots do not divide into 4 x 2 chunks: one line naming interleave; 2 x 2 x 13 chunks of 26
    slots would leave the first without a layer (megatron-1.7b's 24 layers cannot be split so; Megatron-LM
    requires the division)."""
    args = ("export", "--model", "megatron-1.7b", "--cluster", "dgx-a100-80gb", "--devices", 8, "--pp", 4,
            "--interleave", 2, "--global-batch", 8, "--pipeline-split", "embedding-loss", "-o", tmp_path / "out")
    one_line_error(run(capsys, *args), "interleave", "embedding-loss", "pp x interleave")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("zero", [0, 1])
def test_overlapped_gradient_reduction_and_weight_gather_sit_where_the_estimate_hides_them(tmp_path, zero):
    """With dp_overlap (the default), each layer's gradients are reduced right after its backward in the last
    micro-batch, before the next layer's backward starts, and (ZeRO 1/2) each layer's updated weights are
    gathered before its forward in the first micro-batch; none of them blocks the stream. Without dp_overlap
    the reduction follows the last backward whole and the gather follows the optimizer (exposed, as the
    estimate charges them then)."""
    for overlap in (True, False):
        strategy = Strategy(tp=2, pp=2, dp=2, global_batch=8, micro_batch=1, zero=zero, dp_overlap=overlap)
        folder = export(MODEL, DGX, 8, strategy, tmp_path / f"z{zero}-{overlap}")
        _, nodes = load(folder)[0]
        names = [n.name for n in nodes]
        m = strategy.global_batch // (strategy.dp * strategy.micro_batch)
        kind = "reduce_scatter" if zero else "all_reduce"
        reductions = [i for i, name in enumerate(names) if f"dp_gradient_{kind}" in name]
        gathers = [i for i, name in enumerate(names) if "dp_weight_all_gather" in name]
        last_bwd = max(i for i, name in enumerate(names) if name.endswith(".bwd"))
        optimizer = names.index("optimizer")
        if overlap:
            layers = sum(1 for name in names if name.startswith(f"mb{m - 1}.") and name.endswith(".bwd")
                         and ".layer" in name)
            assert len(reductions) == layers > 1
            assert all(names[i].startswith(f"mb{m - 1}.layer") for i in reductions)
            assert min(reductions) < last_bwd                    # issued inside the last backward, not after it
            assert all(nodes[i].id not in nodes[i + 1].data_deps or nodes[i + 1].type != schema().COMP_NODE
                       for i in reductions)                      # the next compute does not wait for it
            if zero:
                first_fwd = min(i for i, name in enumerate(names) if name.startswith("mb0.layer") and
                                name.endswith(".fwd"))
                assert len(gathers) == layers and min(gathers) < first_fwd < optimizer
                assert all(names[i].startswith("mb0.layer") for i in gathers)
        else:
            assert len(reductions) == 1 and reductions[0] > last_bwd
            assert len(gathers) == (1 if zero else 0) and all(i > optimizer for i in gathers)
