"""Transformer specs from mappings: comet-dse's own YAML schema and Hugging Face config.json."""
from __future__ import annotations

import json
from pathlib import Path

from comet_dse.errors import InputError
from comet_dse.loading import Fields
from comet_dse.model.spec import MLP, Attention, LatentAttention, MLPKind, MoE, Norm, PositionEmbedding, Transformer


def transformer_from(data: dict, prefix: str = "model") -> Transformer:
    """Build a Transformer from a mapping shaped like presets/models/*.yaml."""
    f = Fields(data, prefix)
    hidden = f.integer("hidden")
    heads = f.integer("heads")
    head_dim = f.integer("head_dim", None)
    if head_dim is None:
        if hidden % heads:
            raise InputError(f.name("heads"), f"{heads} does not divide hidden={hidden}; give head_dim explicitly")
        head_dim = hidden // heads
    latent = None
    if f.has("latent_attention"):
        la = f.sub("latent_attention")
        latent = LatentAttention(
            q_lora_rank=la.integer("q_lora_rank", None), kv_lora_rank=la.integer("kv_lora_rank"),
            qk_nope_head_dim=la.integer("qk_nope_head_dim"), qk_rope_head_dim=la.integer("qk_rope_head_dim"),
            v_head_dim=la.integer("v_head_dim"))
        la.reject_unknown()
    moe = None
    if f.has("moe"):
        mo = f.sub("moe")
        moe = MoE(experts=mo.integer("experts"), top_k=mo.integer("top_k"), ffn=mo.integer("ffn"),
                  shared_ffn=mo.integer("shared_ffn", 0, minimum=0),
                  dense_layers=mo.integer("dense_layers", 0, minimum=0),
                  expert_groups=mo.integer("expert_groups", 1), groups_per_token=mo.integer("groups_per_token", 1))
        mo.reject_unknown()
    model = Transformer(
        name=f.text("name"),
        layers=f.integer("layers"),
        hidden=hidden,
        attention=Attention(heads=heads, kv_heads=f.integer("kv_heads", heads), head_dim=head_dim, latent=latent),
        mlp=MLP(ffn=f.integer("ffn"), kind=f.choice("mlp", MLPKind, MLPKind.GELU)),
        vocab=f.integer("vocab"),
        seq_len=f.integer("seq_len"),
        tied_embeddings=f.boolean("tied_embeddings", True),
        position=f.choice("position", PositionEmbedding, PositionEmbedding.LEARNED),
        dropout=f.boolean("dropout", True),
        bias=f.boolean("bias", True),
        norm=f.choice("norm", Norm, Norm.LAYERNORM),
        moe=moe,
        source=f.text("source", ""),
        description=f.text("description", ""),
    )
    f.reject_unknown()
    return model


# Hugging Face key names, GPT-2 style first, Llama style second.
_HF_KEYS = {
    "layers": ("n_layer", "num_hidden_layers"),
    "hidden": ("n_embd", "hidden_size"),
    "heads": ("n_head", "num_attention_heads"),
    "vocab": ("vocab_size",),
}


def _hf_get(config: dict, field: str, path: Path) -> int:
    for key in _HF_KEYS[field]:
        if key in config and config[key] is not None:
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InputError(f"{path.name}:{key}", f"must be a positive integer, got {value!r}")
            return value
    raise InputError(f"{path.name}", f"missing {' or '.join(_HF_KEYS[field])} (needed for {field})")


def _probability(config: dict, key: str, default: float, path: Path) -> float:
    try:
        return float(config.get(key, default) or 0.0)
    except (TypeError, ValueError):
        raise InputError(f"{path.name}:{key}", f"must be a number, got {config[key]!r}") from None


def _hf_int(config: dict, key: str, path: Path, default: object = ...) -> int:
    value = config.get(key, default)
    if value is ...:
        raise InputError(f"{path.name}", f"missing {key}")
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{path.name}:{key}", f"must be a non-negative integer, got {value!r}")
    return value


def _hf_latent(config: dict, path: Path):
    """DeepSeek-V2/V3 multi-head latent attention, when kv_lora_rank is present."""
    if config.get("kv_lora_rank") is None:
        return None
    return LatentAttention(
        q_lora_rank=_hf_int(config, "q_lora_rank", path, None) or None,
        kv_lora_rank=_hf_int(config, "kv_lora_rank", path),
        qk_nope_head_dim=_hf_int(config, "qk_nope_head_dim", path),
        qk_rope_head_dim=_hf_int(config, "qk_rope_head_dim", path),
        v_head_dim=_hf_int(config, "v_head_dim", path),
    )


def _hf_moe(config: dict, path: Path, layers: int):
    """Mixture-of-experts from DeepSeek-V3, Mixtral or Qwen-MoE keys (None for a dense model).

    DeepSeek: n_routed_experts, num_experts_per_tok, moe_intermediate_size,
      n_shared_experts (x moe_intermediate_size), first_k_dense_replace, and the
      group-limited routing n_group / topk_group.
    Mixtral: num_local_experts, num_experts_per_tok, intermediate_size (per expert).
    Qwen-MoE: num_experts, num_experts_per_tok, moe_intermediate_size,
      shared_expert_intermediate_size; every layer is MoE (decoder_sparse_step 1).
    """
    if config.get("n_routed_experts"):
        expert_ffn = _hf_int(config, "moe_intermediate_size", path)
        return MoE(experts=_hf_int(config, "n_routed_experts", path), top_k=_hf_int(config, "num_experts_per_tok", path),
                   ffn=expert_ffn, shared_ffn=_hf_int(config, "n_shared_experts", path, 0) * expert_ffn,
                   dense_layers=_hf_int(config, "first_k_dense_replace", path, 0),
                   expert_groups=_hf_int(config, "n_group", path, None) or 1,
                   groups_per_token=_hf_int(config, "topk_group", path, None) or 1)
    if config.get("num_local_experts"):
        return MoE(experts=_hf_int(config, "num_local_experts", path), top_k=_hf_int(config, "num_experts_per_tok", path),
                   ffn=_hf_int(config, "intermediate_size", path))
    if config.get("num_experts") and "moe_intermediate_size" in config:
        if _hf_int(config, "decoder_sparse_step", path, 1) != 1 or config.get("mlp_only_layers"):
            raise InputError(f"{path.name}:decoder_sparse_step", "only models with a MoE block in every layer are supported")
        return MoE(experts=_hf_int(config, "num_experts", path), top_k=_hf_int(config, "num_experts_per_tok", path),
                   ffn=_hf_int(config, "moe_intermediate_size", path),
                   shared_ffn=_hf_int(config, "shared_expert_intermediate_size", path, 0))
    return None


def _flag(config: dict, key: str, default: bool, path: Path) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise InputError(f"{path.name}:{key}", f"must be true or false, got {value!r}")
    return value


def transformer_from_hf_config(path: Path) -> Transformer:
    """Read a local Hugging Face config.json (GPT-2 or Llama style); no network access.

    GPT-2 style: n_layer, n_embd, n_head, n_inner (default 4*n_embd), n_positions;
    GELU MLP, learned positions, tied embeddings.
    Llama style: num_hidden_layers, hidden_size, num_attention_heads,
    num_key_value_heads, intermediate_size, max_position_embeddings,
    tie_word_embeddings, attention_bias; SwiGLU MLP, rotary positions, RMSNorm.
    """
    path = Path(path)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError("model", f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise InputError("model", f"{path} is not valid JSON (line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise InputError("model", f"{path} is not UTF-8 text") from None
    if not isinstance(config, dict):
        raise InputError("model", f"{path} must hold a JSON object")
    layers, hidden = _hf_get(config, "layers", path), _hf_get(config, "hidden", path)
    heads, vocab = _hf_get(config, "heads", path), _hf_get(config, "vocab", path)
    gpt2_style = "n_embd" in config
    if gpt2_style:
        ffn = config.get("n_inner") or 4 * hidden
        kind, position, norm, bias = MLPKind.GELU, PositionEmbedding.LEARNED, Norm.LAYERNORM, True
        tied = _flag(config, "tie_word_embeddings", True, path)
        dropout = _probability(config, "resid_pdrop", 0.1, path) > 0.0
        seq_len = config.get("n_positions") or config.get("n_ctx") or 1024
        kv_heads = heads
    else:
        if "intermediate_size" not in config:
            raise InputError(f"{path.name}", "missing intermediate_size (needed for the MLP size)")
        ffn = config["intermediate_size"]
        act = str(config.get("hidden_act", "silu")).lower()
        kind = MLPKind.SWIGLU if act in ("silu", "swish", "swiglu") else MLPKind.GELU
        position = PositionEmbedding.ROPE
        tied = _flag(config, "tie_word_embeddings", False, path)
        norm = Norm.RMSNORM
        bias = _flag(config, "attention_bias", False, path)
        seq_len = config.get("max_position_embeddings") or 2048
        kv_heads = config.get("num_key_value_heads") or heads
        dropout = _probability(config, "attention_dropout", 0.0, path) > 0.0
    head_dim = config.get("head_dim")
    if not head_dim:
        if hidden % heads:
            raise InputError(f"{path.name}", f"hidden size {hidden} is not a multiple of {heads} heads and no head_dim is given")
        head_dim = hidden // heads
    name = config.get("_name_or_path") or path.parent.name or path.stem
    latent = _hf_latent(config, path)
    moe = _hf_moe(config, path, layers)
    try:
        return Transformer(
            name=str(name), layers=layers, hidden=hidden,
            attention=Attention(heads=heads, kv_heads=kv_heads, head_dim=head_dim, latent=latent), moe=moe,
            mlp=MLP(ffn=ffn, kind=kind), vocab=vocab, seq_len=seq_len,
            tied_embeddings=tied, position=position, dropout=dropout, bias=bias, norm=norm,
            source=str(path),
        )
    except InputError as exc:
        raise InputError(f"{path.name}:{exc.field.removeprefix('model.')}", exc.message) from None
