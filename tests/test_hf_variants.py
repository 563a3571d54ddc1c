"""Architecture variants read from Hugging Face config.json files, each checked for its physical effect.

Gemma 2 (sliding window on alternate layers, soft-capping, head_dim 256 with
hidden 3,584), GPT-NeoX and Falcon (parallel residual), Qwen2 (Q/K/V biases),
Mistral (sliding window on every layer), Falcon and GPT-BigCode (multi-query
attention). Every expected number is worked out by hand in the test from the
formulas of docs/model.md ("Architecture variants").
"""
from __future__ import annotations

import dataclasses as dc
import json

import numpy as np
import pytest

from comet_dse.base.errors import InputError
from comet_dse.cli import main
from comet_dse.cost import collectives as coll
from comet_dse.cost.kernels import elementwise_time
from comet_dse.cost.layer_ops import FLOPS_SOFTCAP, causal_window_keys, layer_cost
from comet_dse.cost.layer_work import layer_work
from comet_dse.cost.microbatch_pass import embedding_and_head
from comet_dse.cost.pipeline import attention_params_per_device
from comet_dse.cost.shapes import LayerShape, context_of, device_of
from comet_dse.model.load import transformer_from, transformer_from_hf_config
from comet_dse.model.spec import MLPKind, Norm
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.declared import Strategy

# --- released config.json files, abridged to the keys the loader reads (values as published) -------
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attention_bias": False,
    "attention_dropout": 0.0, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "sliding_window": 4096, "vocab_size": 256000,
}
QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0, "hidden_act": "silu",
    "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False, "use_sliding_window": False,
    "vocab_size": 152064,
}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "sliding_window": 4096, "tie_word_embeddings": False, "vocab_size": 32000,
}
NEOX_20B = {
    "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_act": "gelu_fast",
    "hidden_size": 6144, "intermediate_size": 24576, "layer_norm_eps": 1e-5, "max_position_embeddings": 2048,
    "num_attention_heads": 64, "num_hidden_layers": 44, "rotary_emb_base": 10000, "rotary_pct": 0.25,
    "tie_word_embeddings": False, "use_parallel_residual": True, "vocab_size": 50432,
}
FALCON_7B = {
    "architectures": ["FalconForCausalLM"], "model_type": "falcon", "alibi": False, "attention_dropout": 0.0,
    "bias": False, "hidden_dropout": 0.0, "hidden_size": 4544, "multi_query": True,
    "new_decoder_architecture": False, "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True,
    "vocab_size": 65024,
}
STARCODER = {   # GPT-BigCode (StarCoder 15.5B): GPT-2 keys plus multi_query
    "architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "activation_function": "gelu_pytorch_tanh",
    "multi_query": True, "n_embd": 6144, "n_head": 48, "n_inner": 24576, "n_layer": 40, "n_positions": 8192,
    "vocab_size": 49152, "resid_pdrop": 0.1, "attn_pdrop": 0.1,
}


def load(tmp_path, config: dict, name: str = "config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config), encoding="utf-8")
    return transformer_from_hf_config(path)


def shape(s, t=1, sp=False, flash=True, b=1):
    return LayerShape(b=np.array([float(b)]), s=s, t=np.array([float(t)]), sp=np.array([sp]),
                      flash=np.array([flash]), e=2.0, gemm_e=np.array([2.0]))


@pytest.fixture(scope="module")
def dev(a100):
    return device_of(a100, StrategyArrays.of([Strategy(dtype="bf16", flash_attention=True)]))


# --- parameter counts --------------------------------------------------------------------------------

def test_gemma2_head_dim_256_in_the_parameter_count(tmp_path):
    m = load(tmp_path, GEMMA2_9B)
    h, a, k, d, f, L, V = 3584, 16, 8, 256, 14336, 42, 256000
    assert d != h // a                                      # 256, not 3584 / 16 = 224
    assert (m.attention.head_dim, m.mlp.kind, m.norm, m.norms_per_layer) == (256, MLPKind.GEGLU, Norm.RMSNORM, 4)
    attention = h * (a + 2 * k) * d + a * d * h             # QKV [h -> (a + 2k) d] and output [a d -> h], no biases
    mlp = 3 * h * f                                          # GeGLU: gate, up, down
    layer = attention + mlp + 4 * h                          # four RMSNorms (pre/post attention, pre/post MLP)
    assert m.layer_params() == layer
    assert m.total_params() == L * layer + V * h + h == 9_241_705_984   # tied embeddings, final norm
    assert abs(m.total_params() - 9.24e9) / 9.24e9 < 0.005               # the 9.24B of the model card


def test_qwen2_qkv_bias_parameter_count(tmp_path):
    m = load(tmp_path, QWEN2_7B)
    h, a, k, d, f, L, V = 3584, 28, 4, 128, 18944, 28, 152064
    assert (m.bias, m.qkv_biased, m.mlp_biased) == (False, True, False)
    assert m.sliding_window is None                        # use_sliding_window false
    attention = h * (a + 2 * k) * d + (a + 2 * k) * d + a * d * h   # biases on Q, K, V only
    layer = attention + 3 * h * f + 2 * h
    assert m.attention_params() == attention
    assert m.total_params() == L * layer + 2 * V * h + h   # untied: embedding and LM head
    assert abs(m.total_params() - 7.62e9) / 7.62e9 < 0.005  # Qwen2-7B: 7.62B published


def test_mistral_7b_parameter_count(tmp_path):
    m = load(tmp_path, MISTRAL_7B)
    layer = 4096 * 48 * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    assert m.total_params() == 32 * layer + 2 * 32000 * 4096 + 4096
    assert abs(m.total_params() - 7.24e9) / 7.24e9 < 0.005
    assert (m.sliding_window, m.window_layers, m.windowed_layers) == (4096, None, 32)


def test_neox_20b_parameter_count(tmp_path):
    m = load(tmp_path, NEOX_20B)
    h, f, L, V = 6144, 24576, 44, 50432
    assert (m.parallel_residual, m.norms_per_layer, m.norm, m.mlp.kind) == (True, 2, Norm.LAYERNORM, MLPKind.GELU)
    layer = (4 * h * h + 4 * h) + (2 * h * f + f + h) + 2 * 2 * h    # biases everywhere, two LayerNorms
    assert m.total_params() == L * layer + 2 * V * h + 2 * h == 20_554_567_680
    assert abs(m.total_params() - 20.55e9) / 20.55e9 < 0.005        # GPT-NeoX-20B (Black et al. 2022)


def test_falcon_7b_multi_query_and_one_norm(tmp_path):
    m = load(tmp_path, FALCON_7B)
    h, a, d, L, V = 4544, 71, 64, 32, 65024
    assert (m.attention.kv_heads, m.parallel_residual, m.norms_per_layer, m.tied_embeddings) == (1, True, 1, True)
    layer = h * (a + 2) * d + a * d * h + 2 * h * 4 * h + 2 * h     # one K and one V head; ffn 4h; one LayerNorm
    assert m.total_params() == L * layer + V * h + 2 * h


# --- multi-query attention over tensor parallelism -----------------------------------------------------

def test_gpt_bigcode_multi_query_replicates_the_kv_head_on_every_rank(tmp_path, dev):
    m = load(tmp_path, STARCODER)
    h, a, d, t = 6144, 48, 128, 8
    assert m.attention.kv_heads == 1
    # each of 8 ranks: 6 query heads and a copy of the one K and V head: QKV [h -> (6 + 2) d], with biases;
    # the output projection [a d / t -> h] with its bias split like its weights
    qkv = h * (a // t + 2) * d + (a // t + 2) * d
    out = (a * d * h + h) / t
    assert float(attention_params_per_device(m, np.array([8.0]))[0]) == pytest.approx(qkv + out, rel=1e-12)
    # the K and V a context-parallel rank passes on: one whole head per TP rank, b s/cp (d + d) e bytes
    cost = layer_cost(m, shape(8192, t=t, flash=True), dev)
    assert float(np.asarray(cost.cp_kv_bytes)[0]) == pytest.approx(8192 * 1 * 2 * d * 2.0)


# --- sliding-window attention ------------------------------------------------------------------------------

def test_causal_window_keys_formula():
    # query i attends to min(i + 1, w) keys: s w - w^2 / 2 scores; a causal kernel's s k / 2 gives k = w (2 - w/s)
    assert causal_window_keys(8192, 4096) == 4096 * (2 - 0.5) == 6144
    assert causal_window_keys(8192, 8192) == causal_window_keys(8192, 100_000) == 8192
    s, w = 1000, 100
    exact = sum(min(i + 1, w) for i in range(s))              # 94,950 scores, against s (s + 1) / 2 = 500,500
    assert s * causal_window_keys(s, w) / 2 == pytest.approx(exact, rel=0.01)


def test_mistral_window_cuts_flash_attention_flops_by_the_formula(tmp_path, dev):
    """w = 4096 at s = 8192: the causal kernel visits k = w (2 - w/s) = 6144 keys per query instead of 8192."""
    windowed = load(tmp_path, MISTRAL_7B).with_seq_len(8192)
    full = dc.replace(windowed, sliding_window=None)
    o = float(np.asarray(dev.overhead))
    core_w = layer_cost(windowed, shape(8192), dev).attention_core
    core_s = layer_cost(full, shape(8192), dev).attention_core
    assert core_w.memory[0] == core_s.memory[0] == 0.0          # compute-bound kernel at this length
    assert (core_w.math[0] - o) / (core_s.math[0] - o) == pytest.approx(6144 / 8192, rel=1e-12)
    # standard attention computes and masks every score: the window changes nothing there
    std_w = layer_cost(windowed, shape(8192, flash=False), dev)
    std_s = layer_cost(full, shape(8192, flash=False), dev)
    assert std_w.forward.total[0] == std_s.forward.total[0]
    assert std_w.saved_bytes[0] == std_s.saved_bytes[0]


def test_gemma2_windows_alternate_layers(tmp_path, dev):
    m = load(tmp_path, GEMMA2_9B)
    assert m.sliding_window == 4096 and m.window_layers == tuple(range(0, 42, 2)) and m.window_fraction == 0.5
    assert m.keys_per_query() == 0.5 * 8192 + 0.5 * 4096
    plain = dc.replace(m, attn_logit_softcap=None)             # the window alone
    o = float(np.asarray(dev.overhead))
    core_w = layer_cost(plain, shape(8192), dev).attention_core
    core_s = layer_cost(dc.replace(plain, sliding_window=None, window_layers=None), shape(8192), dev).attention_core
    # half the layers at k = 6144, half at 8192: 0.5 + 0.5 * 0.75 of the flash FLOPs
    assert (core_w.math[0] - o) / (core_s.math[0] - o) == pytest.approx(0.875, rel=1e-12)


def test_qwen2_windows_the_layers_from_max_window_layers_on(tmp_path):
    m = load(tmp_path, {**QWEN2_7B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20})
    assert m.window_layers == tuple(range(20, 28)) and m.windowed_layers == 8
    assert load(tmp_path, {**QWEN2_7B, "use_sliding_window": True, "max_window_layers": 28}).sliding_window is None


def test_layer_types_list_the_windowed_layers(tmp_path):
    types = ["sliding_attention" if i % 3 else "full_attention" for i in range(32)]
    m = load(tmp_path, {**MISTRAL_7B, "layer_types": types})
    assert m.window_layers == tuple(i for i in range(32) if i % 3)
    with pytest.raises(InputError) as info:
        load(tmp_path, {**MISTRAL_7B, "layer_types": ["chunked_attention"] * 32})
    assert info.value.field == "config.json:layer_types"


def test_window_model_flops_and_step_time(capsys, tmp_path):
    """MFU's model FLOPs count the causal scores: s w - w^2/2 per head on windowed layers, s^2/2 without."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MISTRAL_7B), encoding="utf-8")
    full_path = tmp_path / "full.json"
    full_path.write_text(json.dumps({**MISTRAL_7B, "sliding_window": None}), encoding="utf-8")
    run = ["--cluster", "dgx-h100", "--devices", "8", "--tp", "8", "--global-batch", "8", "--seq-len", "8192",
           "--flash-attention", "--json"]

    def estimate(p):
        assert main(["estimate", "--model", str(p), *run]) == 0
        out, err = capsys.readouterr()
        assert err == ""
        return json.loads(out)

    windowed, full = estimate(path), estimate(full_path)
    L, a, d, s, w, tokens = 32, 32, 128, 8192, 4096, 8 * 8192
    # per token the attention term is 6 L a (d_qk + d_v) x causal keys: s/2 without the window,
    # w (2 - w/s) / 2 with it (s w - w^2/2 scores per head and sequence)
    assert full["model_flops_per_step"] - windowed["model_flops_per_step"] == \
        pytest.approx(tokens * 6 * L * a * 2 * d * (s / 2 - w * (2 - w / s) / 2), rel=1e-9)
    assert windowed["step_time_s"] < full["step_time_s"]


# --- soft-capping ---------------------------------------------------------------------------------------

def test_attention_softcap_is_one_elementwise_pass_over_the_scores(tmp_path, dev):
    m = dc.replace(load(tmp_path, GEMMA2_9B), sliding_window=None, window_layers=None)
    bare = dc.replace(m, attn_logit_softcap=None)
    b, s, t, a, e = 1, 4096, 1, 16, 2.0
    scores = b * a / t * s * s
    capped, plain = layer_cost(m, shape(s, flash=False), dev), layer_cost(bare, shape(s, flash=False), dev)
    # standard attention keeps the capped scores for tanh's backward: e bytes per score
    assert capped.saved_bytes[0] - plain.saved_bytes[0] == pytest.approx(scores * e, rel=1e-12)
    assert capped.attention_core_bytes[0] - plain.attention_core_bytes[0] == pytest.approx(scores * e, rel=1e-12)
    # and runs one more element-wise kernel in forward: read and write e per score
    extra = elementwise_time(np.array([scores]), 2 * e, FLOPS_SOFTCAP, dev).total[0]
    assert capped.forward.total[0] - plain.forward.total[0] == pytest.approx(extra, rel=1e-9)
    # flash attention caps inside the kernel: FLOPS_SOFTCAP vector FLOPs on each of the s^2 / 2 scores it computes
    fcap, fplain = layer_cost(m, shape(s), dev), layer_cost(bare, shape(s), dev)
    vector = float(np.asarray(dev.vector))
    assert fcap.attention_core.total[0] - fplain.attention_core.total[0] == \
        pytest.approx(b * a / t * s * s / 2 * FLOPS_SOFTCAP / vector, rel=1e-9)
    assert fcap.saved_bytes[0] == fplain.saved_bytes[0]


def test_final_softcap_adds_one_pass_over_the_logits(tmp_path, a100):
    m = load(tmp_path, GEMMA2_9B)
    st = StrategyArrays.of([Strategy(tp=8, global_batch=8, dtype="bf16")])
    ctx = context_of(m, a100, 8, st)
    _, head = embedding_and_head(m, ctx)
    _, bare = embedding_and_head(dc.replace(m, final_logit_softcap=None), ctx)
    logits = 1 * 8192 * 256000 / 8
    extra = elementwise_time(np.array([logits]), 2 * 2.0, FLOPS_SOFTCAP, ctx.dev)
    got = (head["fwd_math"] + head["fwd_mem"] - bare["fwd_math"] - bare["fwd_mem"])[0]
    assert got == pytest.approx(extra.total[0], rel=1e-9)


# --- parallel residual ------------------------------------------------------------------------------------

def _tp_by_pass(model, cluster, sp=False):
    """(forward, backward) exposed TP seconds of one layer, and one all-reduce of b s h e over the TP group."""
    st = StrategyArrays.of([Strategy(tp=8, global_batch=8, dtype="bf16", sequence_parallel=sp)])
    ctx = context_of(model, cluster, 8, st)
    with np.errstate(divide="ignore", invalid="ignore"):
        work, _ = layer_work(model, ctx, st)
    all_reduce = coll.all_reduce_time(1 * model.seq_len * model.hidden * 2.0, ctx.dims, ctx.spans["tp"])
    backward = float(work["bwd_comm"][0])
    return float(work["tp"][0]) - backward, backward, float(np.asarray(all_reduce).ravel()[0])


def test_neox_parallel_residual_halves_the_forward_all_reduces(tmp_path, a100):
    neox = load(tmp_path, NEOX_20B)
    fwd, bwd, ar = _tp_by_pass(neox, a100)
    assert (fwd, bwd) == pytest.approx((1 * ar, 2 * ar), rel=1e-12)      # one g; an f per branch (two norms)
    seq_fwd, seq_bwd, _ = _tp_by_pass(dc.replace(neox, parallel_residual=False), a100)
    assert (seq_fwd, seq_bwd) == pytest.approx((2 * ar, 2 * ar), rel=1e-12)
    assert fwd == pytest.approx(seq_fwd / 2, rel=1e-12)
    # with SP: 2 all-gathers and 1 reduce-scatter forward, 1 all-gather and 2 reduce-scatters backward
    sp_fwd, sp_bwd, _ = _tp_by_pass(neox, a100, sp=True)
    assert (sp_fwd, sp_bwd) == pytest.approx((1.5 * ar, 1.5 * ar), rel=1e-12)


def test_one_shared_norm_needs_one_all_reduce_each_way(tmp_path, a100):
    """GPT-J / Falcon 7B layout: one norm feeds both branches, one all-reduce per pass."""
    shared = dc.replace(load(tmp_path, NEOX_20B), norms_per_layer=1)
    fwd, bwd, ar = _tp_by_pass(shared, a100)
    assert (fwd, bwd) == pytest.approx((ar, ar), rel=1e-12)


def test_parallel_residual_saves_the_shared_inputs_once(tmp_path, dev):
    neox = load(tmp_path, NEOX_20B)
    s, h, e = 2048, 6144, 2.0
    sequential = layer_cost(dc.replace(neox, parallel_residual=False), shape(s, t=8), dev).saved_bytes[0]
    two_norms = layer_cost(neox, shape(s, t=8), dev).saved_bytes[0]
    one_norm = layer_cost(dc.replace(neox, norms_per_layer=1), shape(s, t=8), dev).saved_bytes[0]
    assert sequential - two_norms == pytest.approx(s * h * e, rel=1e-12)      # both norms read x: kept once
    assert sequential - one_norm == pytest.approx(2 * s * h * e, rel=1e-12)   # and one output feeds both blocks


def test_gemma2_four_norms_run_and_are_saved(tmp_path, dev):
    m = dc.replace(load(tmp_path, GEMMA2_9B), attn_logit_softcap=None)
    two = dc.replace(m, norms_per_layer=2)
    s, h, e = 2048, 3584, 2.0
    four_cost, two_cost = layer_cost(m, shape(s), dev), layer_cost(two, shape(s), dev)
    assert four_cost.saved_bytes[0] - two_cost.saved_bytes[0] == pytest.approx(2 * s * h * e, rel=1e-12)
    norm = elementwise_time(np.array([s * h]), 2 * e, 8, dev).total[0]
    assert four_cost.forward.total[0] - two_cost.forward.total[0] == pytest.approx(2 * norm, rel=1e-9)


# --- Q/K/V biases ---------------------------------------------------------------------------------------

def test_qwen2_bias_gradients_only_for_qkv(tmp_path, dev):
    m = load(tmp_path, QWEN2_7B).with_seq_len(4096)
    none = dc.replace(m, qkv_bias=False)
    s, a, k, d, e = 4096, 28, 4, 128, 2.0
    grad = elementwise_time(np.array([s * (a + 2 * k) * d]), e, 1, dev).total[0]   # one read of dQKV
    assert layer_cost(m, shape(s, flash=False), dev).backward.total[0] - \
        layer_cost(none, shape(s, flash=False), dev).backward.total[0] == pytest.approx(grad, rel=1e-9)


# --- keys read but not modelled --------------------------------------------------------------------------

def test_rope_scaling_is_noted_and_the_estimate_still_runs(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MISTRAL_7B, "rope_scaling": {"type": "linear", "factor": 2.0}}), encoding="utf-8")
    code = main(["estimate", "--model", str(path), "--cluster", "dgx-h100", "--devices", "8", "--tp", "8",
                 "--global-batch", "8", "--seq-len", "4096", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    assert err == "comet-dse: note: config.json keys read but not modelled: rope_scaling\n"
    assert json.loads(out)["feasible"] is True


def test_noted_keys_only_when_present(tmp_path):
    assert load(tmp_path, NEOX_20B).unmodelled == ("rotary_pct",)
    assert load(tmp_path, {**NEOX_20B, "rotary_pct": 1.0}).unmodelled == ()
    assert load(tmp_path, MISTRAL_7B).unmodelled == ()
    assert load(tmp_path, {**MISTRAL_7B, "rope_scaling": None}).unmodelled == ()
    assert load(tmp_path, {**STARCODER, "attn_pdrop": 0.0}).unmodelled == ("attn_pdrop",)  # one dropout flag
    assert load(tmp_path, {**FALCON_7B, "alibi": True}).unmodelled == ("alibi",)


# --- comet-dse's own YAML schema ----------------------------------------------------------------------

def test_yaml_schema_reads_the_variants():
    base = {"name": "x", "layers": 4, "hidden": 256, "heads": 4, "ffn": 1024, "vocab": 1000, "seq_len": 512}
    m = transformer_from({**base, "parallel_residual": True, "qkv_bias": True, "bias": False, "mlp": "geglu",
                          "sliding_window": 128, "window_layers": "alternate", "attn_logit_softcap": 50,
                          "final_logit_softcap": 30})
    assert (m.parallel_residual, m.norms_per_layer, m.qkv_biased, m.mlp_biased) == (True, 1, True, False)
    assert (m.window_layers, m.attn_logit_softcap, m.final_logit_softcap) == ((0, 2), 50.0, 30.0)
    assert transformer_from({**base, "sliding_window": 128}).windowed_layers == 4
    with pytest.raises(InputError, match="norms_per_layer"):
        transformer_from({**base, "norms_per_layer": 3})
    with pytest.raises(InputError, match="window_layers"):
        transformer_from({**base, "sliding_window": 128, "window_layers": [5]})
    with pytest.raises(InputError, match="attn_logit_softcap"):
        transformer_from({**base, "attn_logit_softcap": -1})
