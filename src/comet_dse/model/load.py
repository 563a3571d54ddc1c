"""Transformer specs from mappings: comet-dse's own YAML schema and Hugging Face config.json."""
from __future__ import annotations

from pathlib import Path

from comet_dse.base.bounds import BOUNDS, shown
from comet_dse.base.errors import InputError
from comet_dse.base.loading import Fields, read_json
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
        name=f.name_text("name"),
        layers=f.integer("layers"),
        hidden=hidden,
        attention=Attention(heads=heads, kv_heads=f.integer("kv_heads", heads), head_dim=head_dim, latent=latent,
                            column_split=f.boolean("column_split", False)),
        mlp=MLP(ffn=f.integer("ffn"), kind=f.choice("mlp", MLPKind, MLPKind.GELU)),
        vocab=f.integer("vocab"),
        seq_len=f.integer("seq_len"),
        tied_embeddings=f.boolean("tied_embeddings", True),
        position=f.choice("position", PositionEmbedding, PositionEmbedding.LEARNED),
        dropout=f.boolean("dropout", True),
        bias=f.boolean("bias", True),
        norm=f.choice("norm", Norm, Norm.LAYERNORM),
        moe=moe,
        parallel_residual=f.boolean("parallel_residual", False),
        norms_per_layer=f.integer("norms_per_layer", None) or (1 if f.boolean("parallel_residual", False) else 2),
        qkv_bias=f.boolean("qkv_bias") if f.has("qkv_bias") else None,
        mlp_bias=f.boolean("mlp_bias") if f.has("mlp_bias") else None,
        sliding_window=f.integer("sliding_window", None),
        window_layers=_window_layers(f, "window_layers", f.integer("layers")),
        attn_logit_softcap=_positive_number(f, "attn_logit_softcap"),
        final_logit_softcap=_positive_number(f, "final_logit_softcap"),
        source=f.text("source", ""),
        description=f.text("description", ""),
    )
    f.reject_unknown()
    return model


def _window_layers(f: Fields, key: str, layers: int):
    """Which layers use the sliding window: ``all`` (default: None), ``alternate`` (0, 2, 4, ...: Gemma 2)
    or a list of 0-based layer indices."""
    value = f.raw(key, "all")
    if value == "all":
        return None
    if value == "alternate":
        return tuple(range(0, layers, 2))
    if isinstance(value, list):
        return tuple(value)
    raise InputError(f.name(key), f"must be all, alternate or a list of layer indices, got {value!r}")


def _positive_number(f: Fields, key: str):
    """An optional positive number (a soft-cap value); None when absent."""
    value = f.raw(key, None)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise InputError(f.name(key), f"must be a positive number, got {value!r}")
    return None if value is None else float(value)


# Hugging Face key names, GPT-2 style first, Llama style second.
_HF_KEYS = {
    "layers": ("n_layer", "num_hidden_layers"),
    "hidden": ("n_embd", "hidden_size"),
    "heads": ("n_head", "num_attention_heads"),
    "vocab": ("vocab_size",),
}


def _hf_get(config: dict, field: str, path: Path) -> int:
    """A count a config.json must give (layers, hidden, heads, vocab), in the bounds a model YAML's has
    (bounds.BOUNDS["integer"])."""
    for key in _HF_KEYS[field]:
        if key in config and config[key] is not None:
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(f"{path.name}:{key}", f"must be {BOUNDS['integer'].integer_text()}, "
                                 f"got {shown(value)}")
            return BOUNDS["integer"].check_integer(f"{path.name}:{key}", value)
    raise InputError(f"{path.name}", f"missing {' or '.join(_HF_KEYS[field])} (needed for {field})")


def _probability(config: dict, key: str, default: float, path: Path) -> float:
    try:
        return float(config.get(key, default) or 0.0)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{path.name}:{key}", f"must be a number, got {config[key]!r}") from None


def _hf_int(config: dict, key: str, path: Path, default: object = ...) -> int:
    value = config.get(key, default)
    if value is ...:
        raise InputError(f"{path.name}", f"missing {key}")
    if value is None and default is None:
        return None
    high = BOUNDS["integer"].high                 # the bound of a model YAML's counts
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise InputError(f"{path.name}:{key}", f"must be an integer in [0, {high:,}], got {shown(value)}")
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
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        if config.get(key) is not None and _hf_int(config, key, path) == 0:
            raise InputError(f"{path.name}:{key}", "must be a positive number of experts, got 0 (leave the key out, "
                             "or null, for a dense model)")
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


def _hf_falcon(config: dict, path: Path) -> dict:
    """Falcon's attention layout (FalconDecoderLayer, FalconAttention in transformers).

    new_decoder_architecture (Falcon 40B/180B): num_kv_heads KV heads, parallel
    attention and MLP, num_ln_in_parallel_attn norms (default 2: ln_attn, ln_mlp).
    Otherwise multi_query (default true; Falcon 7B) gives one KV head, and
    parallel_attn (default true) one shared input_layernorm; sequential
    blocks have two norms.
    """
    if _flag(config, "new_decoder_architecture", False, path):
        kv_heads = _hf_int(config, "num_kv_heads", path, None)
        norms = _hf_int(config, "num_ln_in_parallel_attn", path, None) or 2
        return {"parallel_residual": True, "norms_per_layer": norms,
                **({"kv_heads": kv_heads} if kv_heads is not None else {})}
    parallel = _flag(config, "parallel_attn", True, path)
    norms = (_hf_int(config, "num_ln_in_parallel_attn", path, None) or 1) if parallel else 2
    variants = {"parallel_residual": parallel, "norms_per_layer": norms}
    if _flag(config, "multi_query", True, path):
        variants["kv_heads"] = 1
    return variants


# What a config.json does not state but its model_type's modeling_*.py in Hugging Face
# transformers fixes (docs/model.md, "Hugging Face config.json"):
# a gated MLP (gate_proj, up_proj, down_proj) whatever the activation,
_GATED = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "gemma", "gemma2", "deepseek_v2", "deepseek_v3"}
# LayerNorm instead of RMSNorm and a plain two-GEMM GELU MLP,
_LAYERNORM_GELU = {"gpt_neox", "falcon"}
# tie_word_embeddings defaulting to true (GemmaConfig, Gemma2Config; FalconConfig keeps
# PretrainedConfig's default),
_TIED_BY_DEFAULT = {"gemma", "gemma2", "falcon"}
# biases on the Q, K and V projections only (Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False).
_QKV_BIAS_ONLY = {"qwen2", "qwen2_moe"}
# layer_types entries: does the layer use the sliding window?
_LAYER_TYPES = {"full_attention": False, "sliding_attention": True}

# Keys read from a config.json whose effect the cost model leaves out; ``unmodelled_note``
# names those present (with an effect) in one line. docs/model.md lists them with the reason.
UNMODELLED_KEYS = (
    "rope_scaling",             # RoPE frequency scaling: same kernels, only the angles change
    "rotary_pct", "partial_rotary_factor", "rotary_dim",   # RoPE on part of each head: costed on the whole head
    "alibi",                    # Falcon's ALiBi score bias: not costed (RoPE is costed instead)
    "num_nextn_predict_layers",  # DeepSeek-V3 multi-token prediction module: not costed
    "attn_pdrop", "resid_pdrop", "attention_dropout", "hidden_dropout",  # one dropout flag for both kinds
)


def _hf_number(config: dict, key: str, path: Path):
    """An optional positive number (soft-cap values); None when absent or null."""
    value = config.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise InputError(f"{path.name}:{key}", f"must be a positive number or null, got {value!r}")
    return None if value is None else float(value)


def _hf_window(config: dict, model_type: str, layers: int, path: Path) -> tuple:
    """(sliding_window, window_layers) as Hugging Face transformers applies them.

    ``layer_types`` (newer configs) lists full_attention / sliding_attention per
    layer. Otherwise: Qwen2 (or any config with use_sliding_window) windows the
    layers from max_window_layers (default 28) on, and only with
    use_sliding_window (default false); Gemma 2 the even layers 0, 2, 4, ...
    (Gemma2DecoderLayer.is_sliding); Mistral, Mixtral and others every layer.
    window_layers None means every layer.
    """
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or \
                any(not isinstance(kind, str) or kind not in _LAYER_TYPES for kind in types):
            raise InputError(f"{path.name}:layer_types",
                             f"must list {layers} layer types, each {' or '.join(_LAYER_TYPES)}")
        sliding = tuple(i for i, kind in enumerate(types) if _LAYER_TYPES[kind])
        if not sliding:
            return None, None
        if config.get("sliding_window") is None:
            raise InputError(f"{path.name}:sliding_window", "is needed by the sliding_attention layers")
        return _hf_int(config, "sliding_window", path), (None if len(sliding) == layers else sliding)
    if config.get("sliding_window") is None:
        return None, None
    window = _hf_int(config, "sliding_window", path)
    if "use_sliding_window" in config or model_type in _QKV_BIAS_ONLY:
        if not _flag(config, "use_sliding_window", False, path):
            return None, None
        first = _hf_int(config, "max_window_layers", path, 28)
        if first >= layers:
            return None, None
        return window, (tuple(range(first, layers)) if first else None)
    if model_type == "gemma2":
        return window, tuple(range(0, layers, 2))
    return window, None


def _hf_unmodelled(config: dict, head_dim: int, dropout: bool, other_dropout: str) -> tuple:
    """The ``UNMODELLED_KEYS`` present in ``config`` with an effect the model leaves out, in that order.

    The model has one dropout flag for attention and residual dropout; it follows
    one of the config's two probabilities, and the other (``other_dropout``) is
    named when it disagrees about being zero.
    """
    def below_one(key):
        value = config.get(key)
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1

    rotary_dim = config.get("rotary_dim")
    other = config.get(other_dropout)
    present = {
        "rope_scaling": config.get("rope_scaling") is not None,
        "rotary_pct": below_one("rotary_pct"),
        "partial_rotary_factor": below_one("partial_rotary_factor"),
        "rotary_dim": isinstance(rotary_dim, int) and 0 < rotary_dim < head_dim,
        "alibi": config.get("alibi") is True,
        "num_nextn_predict_layers": bool(config.get("num_nextn_predict_layers")),
        other_dropout: isinstance(other, (int, float)) and not isinstance(other, bool) and (other > 0) != dropout,
    }
    return tuple(key for key in UNMODELLED_KEYS if present.get(key))


def unmodelled_note(model: Transformer) -> str | None:
    """One line naming the config keys read but not modelled (None when there are none)."""
    if not model.unmodelled:
        return None
    return (f"comet-dse: note: {Path(model.source).name} keys read but not modelled: "
            f"{', '.join(model.unmodelled)}")


# model_types of Hugging Face transformers that are encoders (bidirectional attention, a masked-language or
# classification head) or encoder-decoders: their step is not the decoder-only (causal) training step the cost
# model describes, so a config.json of one is refused rather than costed as a decoder.
ENCODER_TYPES = frozenset({
    "bert", "roberta", "xlm-roberta", "xlm_roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2",
    "camembert", "mpnet", "ernie", "nezha", "modernbert", "longformer", "big_bird", "funnel", "layoutlm",
    "t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "led", "prophetnet", "whisper", "encoder-decoder",
})


def _refuse_encoders(config: dict, model_type: str, path: Path) -> None:
    """An InputError for a config.json of an encoder or encoder-decoder model (``ENCODER_TYPES``,
    ``is_encoder_decoder: true``): comet-dse costs decoder-only transformers (a BERT config was accepted and
    costed as a causal decoder)."""
    if model_type in ENCODER_TYPES or config.get("is_encoder_decoder") is True:
        raise InputError(f"{path.name}:model_type", f"{shown(model_type or 'encoder-decoder')} is an encoder or "
                         "encoder-decoder model; comet-dse models decoder-only (causal) transformers such as "
                         "llama, mistral, qwen2, gpt2, gpt_neox")


def transformer_from_hf_config(path: Path) -> Transformer:
    """Read a local Hugging Face config.json (GPT-2 or Llama style); no network access.

    GPT-2 style: n_layer, n_embd, n_head, n_inner (default 4*n_embd), n_positions;
    GELU MLP, learned positions, tied embeddings; multi_query (GPT-BigCode) for
    one KV head; model_type gptj: rotary, parallel residual with one norm,
    biases on the MLP only, untied.
    Llama style: num_hidden_layers, hidden_size, num_attention_heads,
    num_key_value_heads, intermediate_size, max_position_embeddings,
    tie_word_embeddings, attention_bias, mlp_bias; gated MLP (SwiGLU, or GeGLU
    for a GELU activation), rotary positions, RMSNorm; sliding_window,
    layer_types, use_sliding_window / max_window_layers, head_dim,
    attn_logit_softcapping, final_logit_softcapping. model_type adds what the
    config leaves to the code: Qwen2's Q/K/V biases, Gemma 2's four norms per
    layer and alternating windows, GPT-NeoX's parallel residual
    (use_parallel_residual) with LayerNorm and biases, Falcon's parallel
    attention, multi-query or num_kv_heads, ffn_hidden_size and bias.
    Keys read but not modelled: ``UNMODELLED_KEYS``, kept in Transformer.unmodelled.
    """
    path = Path(path)
    config = read_json(path, "model")     # a regular file of at most 256 KiB; keys given twice, huge numbers refused
    layers, hidden = _hf_get(config, "layers", path), _hf_get(config, "hidden", path)
    heads, vocab = _hf_get(config, "heads", path), _hf_get(config, "vocab", path)
    model_type = str(config.get("model_type") or "").lower()
    _refuse_encoders(config, model_type, path)
    gpt2_style = "n_embd" in config
    variants = {}
    if gpt2_style:
        ffn = config.get("n_inner") or 4 * hidden
        kind, position, norm, bias = MLPKind.GELU, PositionEmbedding.LEARNED, Norm.LAYERNORM, True
        tied = _flag(config, "tie_word_embeddings", model_type != "gptj", path)
        dropout_key, other_dropout = "resid_pdrop", "attn_pdrop"
        dropout = _probability(config, "resid_pdrop", 0.1, path) > 0.0
        seq_len = config.get("n_positions") or config.get("n_ctx") or 1024
        kv_heads = 1 if _flag(config, "multi_query", model_type == "gpt_bigcode", path) else heads
        if model_type == "gptj":     # GPTJBlock: one ln_1 feeding attention and MLP; GPTJAttention has no biases
            position, bias = PositionEmbedding.ROPE, False
            variants = {"parallel_residual": True, "norms_per_layer": 1, "mlp_bias": True}
    else:
        if model_type == "falcon":   # FalconConfig: ffn_hidden_size, default 4 x hidden_size
            ffn = _hf_int(config, "ffn_hidden_size", path, None) or 4 * hidden
        elif "intermediate_size" not in config:
            raise InputError(f"{path.name}", "missing intermediate_size (needed for the MLP size)")
        else:
            ffn = config["intermediate_size"]
        act = str(config.get("hidden_activation") or config.get("hidden_act") or "silu").lower()
        if model_type in _LAYERNORM_GELU:
            kind = MLPKind.GELU
        elif model_type in _GATED:
            kind = MLPKind.GEGLU if act.startswith("gelu") else MLPKind.SWIGLU
        else:
            kind = MLPKind.SWIGLU if act in ("silu", "swish", "swiglu") else MLPKind.GELU
        position = PositionEmbedding.ROPE
        tied = _flag(config, "tie_word_embeddings", model_type in _TIED_BY_DEFAULT, path)
        norm = Norm.LAYERNORM if model_type in _LAYERNORM_GELU else Norm.RMSNORM
        seq_len = config.get("max_position_embeddings") or 2048
        kv_heads = config.get("num_key_value_heads")    # absent or null: multi-head attention; 0 is refused
        kv_heads = heads if kv_heads is None else kv_heads
        dropout_key, other_dropout = "attention_dropout", "hidden_dropout"
        if model_type in _LAYERNORM_GELU:     # residual dropout (hidden_dropout) and attention dropout
            dropout_key, other_dropout = "hidden_dropout", "attention_dropout"
        dropout = _probability(config, dropout_key, 0.0, path) > 0.0
        bias = _flag(config, "attention_bias", model_type == "gpt_neox", path)
        variants = {"mlp_bias": _flag(config, "mlp_bias", False, path)}
        if model_type in _QKV_BIAS_ONLY:
            bias, variants = False, {"qkv_bias": True, "mlp_bias": False}
        elif model_type == "gpt_neox":        # GPTNeoXLayer: two norms, both on the layer input when parallel
            variants = {"mlp_bias": True, "parallel_residual": _flag(config, "use_parallel_residual", True, path)}
        elif model_type == "falcon":
            bias, variants = _flag(config, "bias", False, path), _hf_falcon(config, path)
            kv_heads = variants.pop("kv_heads", heads)
        elif model_type == "gemma2":          # input, post-attention, pre- and post-feedforward RMSNorms
            variants["norms_per_layer"] = 4
        window, window_layers = _hf_window(config, model_type, layers, path)
        variants.update(sliding_window=window, window_layers=window_layers,
                        attn_logit_softcap=_hf_number(config, "attn_logit_softcapping", path),
                        final_logit_softcap=_hf_number(config, "final_logit_softcapping", path))
    head_dim = _hf_int(config, "head_dim", path, None)
    if head_dim == 0:
        raise InputError(f"{path.name}:head_dim", "must be a positive integer (leave it out, or null, for "
                         "hidden size / heads), got 0")
    if head_dim is None:
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
            tied_embeddings=tied, position=position, dropout=dropout, bias=bias, norm=norm, **variants,
            unmodelled=_hf_unmodelled(config, head_dim, dropout, other_dropout),
            source=str(path),
        )
    except InputError as exc:
        raise InputError(f"{path.name}:{exc.field.removeprefix('model.')}", exc.message) from None
