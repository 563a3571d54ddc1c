"""Hugging Face config.json files (GPT-2 and Llama style) read into Transformer specs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from comet_dse.base.errors import InputError
from comet_dse.cli import main
from comet_dse.model.load import transformer_from_hf_config
from comet_dse.model.spec import MLPKind, PositionEmbedding
from comet_dse.presets.catalog import load_model

# GPT-2 XL, as in the released gpt2-xl config.json (no n_inner: the MLP is 4 x n_embd).
GPT2_XL = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
    "n_layer": 48, "n_embd": 1600, "n_head": 25, "vocab_size": 50257, "n_positions": 1024, "n_ctx": 1024,
    "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5,
}
# Llama 3 8B, as in the released Meta-Llama-3-8B config.json.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
    "tie_word_embeddings": False, "attention_dropout": 0.0, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
}

# Parameter counts by hand from the formulas of model/spec.py:
#   attention = h*(a+2k)*d + (a+2k)*d + a*d*h + h      (QKV + output projection, with biases)
#   mlp       = 2*h*f + f + h (GELU)  |  3*h*f (SwiGLU)
#   layer     = attention + mlp + 4*h                   (two LayerNorms)
#   total     = L*layer + V*h [+ s*h learned positions] + 2*h [+ V*h untied head]
# GPT-2 XL: h=1600, a=k=25, d=64, f=6400, L=48, V=50257, s=1024, learned, tied.
GPT2_XL_ATTENTION = 1600 * 75 * 64 + 75 * 64 + 25 * 64 * 1600 + 1600      # 10,246,400
GPT2_XL_MLP = 2 * 1600 * 6400 + 6400 + 1600                                # 20,488,000
GPT2_XL_LAYER = GPT2_XL_ATTENTION + GPT2_XL_MLP + 4 * 1600                 # 30,740,800
GPT2_XL_PARAMS = 48 * GPT2_XL_LAYER + 50257 * 1600 + 1024 * 1600 + 2 * 1600
# Llama 3 8B: h=4096, a=32, k=8, d=128, f=14336, L=32, V=128256, RoPE (no table), untied,
# no biases, RMSNorm (h parameters per norm).
LLAMA_ATTENTION = 4096 * 48 * 128 + 32 * 128 * 4096                       # 41,943,040
LLAMA_MLP = 3 * 4096 * 14336                                               # 176,160,768
LLAMA_LAYER = LLAMA_ATTENTION + LLAMA_MLP + 2 * 4096                       # 218,112,000
LLAMA_PARAMS = 32 * LLAMA_LAYER + 128256 * 4096 + 4096 + 128256 * 4096


def test_hand_counts():
    """The hand arithmetic above, written out, so a typo there cannot hide."""
    assert GPT2_XL_PARAMS == 1_557_611_200  # also the count Hugging Face reports for gpt2-xl
    assert LLAMA_PARAMS == 8_030_261_248  # the published count of Meta-Llama-3-8B


def write_config(directory: Path, config: dict, name: str = "config.json") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.fixture
def gpt2_path(tmp_path) -> Path:
    return write_config(tmp_path / "gpt2-xl", GPT2_XL)


@pytest.fixture
def llama_path(tmp_path) -> Path:
    return write_config(tmp_path / "llama3-8b-hf", LLAMA3_8B)


# --- GPT-2 style ------------------------------------------------------------------------------

def test_gpt2_xl_fields(gpt2_path):
    m = transformer_from_hf_config(gpt2_path)
    assert m.name == "gpt2-xl"  # the folder holding config.json
    assert (m.layers, m.hidden, m.vocab, m.seq_len) == (48, 1600, 50257, 1024)
    assert (m.attention.heads, m.attention.kv_heads, m.attention.head_dim) == (25, 25, 64)
    assert m.mlp.ffn == 6400
    assert m.mlp.kind is MLPKind.GELU
    assert m.position is PositionEmbedding.LEARNED
    assert m.tied_embeddings is True
    assert m.dropout is True
    assert m.source == str(gpt2_path)


def test_gpt2_xl_params(gpt2_path):
    m = transformer_from_hf_config(gpt2_path)
    assert m.attention_params() == GPT2_XL_ATTENTION
    assert m.mlp_params() == GPT2_XL_MLP
    assert m.layer_params() == GPT2_XL_LAYER
    assert m.total_params() == GPT2_XL_PARAMS
    assert abs(m.total_params() - 1.558e9) / 1.558e9 < 0.01


def test_gpt2_explicit_n_inner_and_no_dropout(tmp_path):
    m = transformer_from_hf_config(write_config(tmp_path, {**GPT2_XL, "n_inner": 5000, "resid_pdrop": 0.0}))
    assert m.mlp.ffn == 5000
    assert m.dropout is False
    m = transformer_from_hf_config(write_config(tmp_path, {**GPT2_XL, "n_inner": None}))
    assert m.mlp.ffn == 6400


def test_gpt2_n_ctx_when_no_n_positions(tmp_path):
    config = {k: v for k, v in GPT2_XL.items() if k != "n_positions"}
    assert transformer_from_hf_config(write_config(tmp_path, {**config, "n_ctx": 2048})).seq_len == 2048


def test_name_or_path_names_the_model(tmp_path):
    m = transformer_from_hf_config(write_config(tmp_path / "x", {**GPT2_XL, "_name_or_path": "openai-community/gpt2-xl"}))
    assert m.name == "openai-community/gpt2-xl"


# --- Llama style ------------------------------------------------------------------------------

def test_llama3_8b_fields(llama_path):
    m = transformer_from_hf_config(llama_path)
    assert (m.layers, m.hidden, m.vocab, m.seq_len) == (32, 4096, 128256, 8192)
    assert (m.attention.heads, m.attention.kv_heads, m.attention.head_dim) == (32, 8, 128)
    assert m.mlp.ffn == 14336
    assert m.mlp.kind is MLPKind.SWIGLU
    assert m.position is PositionEmbedding.ROPE
    assert m.tied_embeddings is False
    assert m.dropout is False


def test_llama3_8b_params(llama_path):
    m = transformer_from_hf_config(llama_path)
    assert m.attention_params() == LLAMA_ATTENTION
    assert m.mlp_params() == LLAMA_MLP
    assert m.total_params() == LLAMA_PARAMS
    assert abs(m.total_params() - 8.03e9) / 8.03e9 < 0.01
    # the same architecture as the built-in preset
    assert m.total_params() == load_model("llama3-8b").total_params()


def test_llama_tied_embeddings_drop_the_head(tmp_path):
    tied = transformer_from_hf_config(write_config(tmp_path, {**LLAMA3_8B, "tie_word_embeddings": True}))
    assert tied.tied_embeddings is True
    assert tied.total_params() == LLAMA_PARAMS - 128256 * 4096


def test_llama_defaults_without_kv_heads(tmp_path):
    config = {k: v for k, v in LLAMA3_8B.items() if k != "num_key_value_heads"}
    assert transformer_from_hf_config(write_config(tmp_path, config)).attention.kv_heads == 32  # plain MHA


def test_llama_gelu_activation_and_explicit_head_dim(tmp_path):
    # LlamaMLP is gated whatever the activation: GELU there is GeGLU (three GEMMs)
    m = transformer_from_hf_config(write_config(tmp_path, {**LLAMA3_8B, "hidden_act": "gelu", "head_dim": 256}))
    assert m.mlp.kind is MLPKind.GEGLU
    assert m.mlp_params() == 3 * 4096 * 14336
    assert m.attention.head_dim == 256
    # without a model_type the activation decides, as before: GELU is the two-GEMM MLP
    plain = {k: v for k, v in LLAMA3_8B.items() if k != "model_type"}
    assert transformer_from_hf_config(write_config(tmp_path, {**plain, "hidden_act": "gelu"})).mlp.kind is MLPKind.GELU


# --- through presets.load_model and the CLI ---------------------------------------------------

def test_load_model_reads_config_json(gpt2_path, llama_path):
    assert load_model(str(gpt2_path)) == transformer_from_hf_config(gpt2_path)
    assert load_model(str(llama_path)) == transformer_from_hf_config(llama_path)
    assert load_model(str(llama_path)).attention.kv_heads == 8


def cli_json(capsys, *argv) -> dict:
    code = main([str(a) for a in argv] + ["--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    return json.loads(out)


GPT2_RUN = ["--cluster", "dgx-a100-80gb", "--devices", "8", "--tp", "1", "--pp", "1", "--dp", "8",
            "--global-batch", "64", "--micro-batch", "2"]


def test_cli_estimate_with_config_json(capsys, gpt2_path, llama_path):
    data = cli_json(capsys, "estimate", "--model", gpt2_path, *GPT2_RUN)
    assert data["inputs"]["model"] == "gpt2-xl"
    assert data["feasible"] is True, data["reasons"]
    assert data["tokens_per_second"] * data["step_time_s"] == pytest.approx(64 * 1024)
    # 6 FLOP per parameter per token at least (forward + backward), with these exact parameters
    assert data["model_flops_per_step"] > 6 * GPT2_XL_PARAMS * 64 * 1024 * 0.9

    code = main(["estimate", "--model", str(llama_path), "--cluster", "dgx-h100", "--devices", "8",
                 "--tp", "8", "--global-batch", "8"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith("llama3-8b-hf on 8 x dgx-h100")
    assert "Step time" in out


def test_cli_seq_len_overrides_the_config(capsys, gpt2_path):
    base = cli_json(capsys, "estimate", "--model", gpt2_path, *GPT2_RUN)
    longer = cli_json(capsys, "estimate", "--model", gpt2_path, *GPT2_RUN, "--seq-len", "4096")
    assert base["tokens_per_second"] * base["step_time_s"] == pytest.approx(64 * 1024)
    assert longer["tokens_per_second"] * longer["step_time_s"] == pytest.approx(64 * 4096)
    assert longer["step_time_s"] > 3 * base["step_time_s"]  # 4x the tokens, plus longer attention
    assert longer["model_flops_per_step"] > 4 * base["model_flops_per_step"]


# --- bad config.json --------------------------------------------------------------------------

@pytest.mark.parametrize("key, names", [
    ("n_layer", "n_layer or num_hidden_layers"),
    ("n_embd", "n_embd or hidden_size"),
    ("n_head", "n_head or num_attention_heads"),
    ("vocab_size", "vocab_size"),
])
def test_gpt2_missing_key(tmp_path, key, names):
    path = write_config(tmp_path, {k: v for k, v in GPT2_XL.items() if k != key})
    with pytest.raises(InputError) as info:
        transformer_from_hf_config(path)
    assert info.value.field == "config.json"
    assert f"missing {names}" in info.value.message


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size"])
def test_llama_missing_key(tmp_path, key):
    path = write_config(tmp_path, {k: v for k, v in LLAMA3_8B.items() if k != key})
    with pytest.raises(InputError) as info:
        load_model(str(path))
    assert key in str(info.value)
    assert str(info.value).startswith("config.json: missing ")


@pytest.mark.parametrize("key, value", [("n_layer", 0), ("n_embd", -1600), ("n_head", "25"), ("vocab_size", True)])
def test_gpt2_bad_value_names_the_key(tmp_path, key, value):
    with pytest.raises(InputError) as info:
        transformer_from_hf_config(write_config(tmp_path, {**GPT2_XL, key: value}))
    assert info.value.field == f"config.json:{key}"
    assert "positive integer" in info.value.message


def test_kv_heads_must_divide_heads(tmp_path):
    with pytest.raises(InputError) as info:
        transformer_from_hf_config(write_config(tmp_path, {**LLAMA3_8B, "num_key_value_heads": 5}))
    assert info.value.field == "config.json:kv_heads"
    assert "5 must divide heads=32" in info.value.message


def test_non_numeric_dropout_is_an_input_error(tmp_path):
    with pytest.raises(InputError) as info:
        transformer_from_hf_config(write_config(tmp_path, {**GPT2_XL, "resid_pdrop": "lots"}))
    assert info.value.field == "config.json:resid_pdrop"


@pytest.mark.parametrize("content", ["[1, 2, 3]", '"a string"'])
def test_config_must_be_an_object(tmp_path, content):
    path = tmp_path / "config.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match="must hold a JSON object"):
        transformer_from_hf_config(path)


def test_config_not_utf8(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe{\x00}")
    with pytest.raises(InputError, match="not UTF-8"):
        load_model(str(path))


def test_cli_missing_key_is_one_line(capsys, tmp_path):
    path = write_config(tmp_path, {k: v for k, v in LLAMA3_8B.items() if k != "intermediate_size"})
    code = main(["estimate", "--model", str(path), "--cluster", "dgx-a100-80gb", "--devices", "8", "--global-batch", "8"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err == "comet-dse: error: config.json: missing intermediate_size (needed for the MLP size)\n"
