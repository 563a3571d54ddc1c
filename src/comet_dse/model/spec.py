"""The workload: a decoder-only transformer, as a frozen, validated spec.

The spec is split into parts (attention, MLP) so that later variants —
mixture-of-experts MLPs, latent attention — are new part types rather than a
reshaped spec.

Symbols used across the cost model (see docs/model.md):
    L layers, h hidden size, a attention heads, k KV heads, d = h/a head dim
    (unless given), f FFN size, V vocabulary, s sequence length, w sliding
    window (tokens).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from comet_dse.base.bounds import BOUNDS, shown
from comet_dse.base.errors import InputError


class MLPKind(str, Enum):
    """Feed-forward block type."""

    GELU = "gelu"
    """Two GEMMs, h -> f -> h, with a GELU between (GPT, Megatron)."""
    SWIGLU = "swiglu"
    """Gated: three GEMMs (gate and up h -> f, down f -> h), SiLU(gate) * up (Llama)."""
    GEGLU = "geglu"
    """Gated like SwiGLU, with GELU(gate) * up (Gemma, Gemma 2: GemmaMLP)."""


class Norm(str, Enum):
    """Normalisation layer type."""

    LAYERNORM = "layernorm"
    """LayerNorm: scale and bias, 2h parameters (GPT, Megatron)."""
    RMSNORM = "rmsnorm"
    """RMSNorm: scale only, h parameters (Llama)."""


class PositionEmbedding(str, Enum):
    """How positions are encoded."""

    LEARNED = "learned"
    """A learned s x h table added to the token embeddings (GPT, Megatron)."""
    ROPE = "rope"
    """Rotary embeddings applied to Q and K; no parameters (Llama)."""


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank Q and KV projections.

    Q = W_uq RMSNorm(W_dq x) (or W_q x without q_lora_rank); [K_nope, V] = W_ukv
    RMSNorm(W_dkv x); a shared rotary key part of qk_rope_head_dim per token.
    Per head, scores use qk_nope_head_dim + qk_rope_head_dim and values v_head_dim.
    """

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class Projection:
    """One linear layer of attention: elements in and out, and how tensor parallelism shards it.

    shard: "out" (column-parallel: output features split over t), "in"
    (row-parallel: input features split), or "none" (replicated).
    """

    name: str
    n_in: int
    n_out: int
    shard: str

    def params(self, bias: bool) -> int:
        """Weights n_in * n_out, plus n_out biases when the model uses them."""
        return self.n_in * self.n_out + (self.n_out if bias else 0)


@dataclass(frozen=True)
class Attention:
    """Multi-head attention with optional grouped KV heads (GQA/MQA) or latent projections (MLA)."""

    heads: int
    kv_heads: int
    head_dim: int
    latent: LatentAttention | None = None
    column_split: bool = False
    """Model parallelism may split the columns of Q, K and V over more ranks than there are heads (each
    rank a share of a head), as COMET's workload splits h = 24,576 columns over 128 to 4096 devices; only
    pure model parallelism (the ``model_parallel`` knob) uses it, whole heads otherwise."""

    @property
    def qk_dim(self) -> int:
        """Per-head dimension of queries and keys."""
        if self.latent:
            return self.latent.qk_nope_head_dim + self.latent.qk_rope_head_dim
        return self.head_dim

    @property
    def v_dim(self) -> int:
        """Per-head dimension of values (and of the attention output)."""
        return self.latent.v_head_dim if self.latent else self.head_dim

    def kv_heads_per_rank(self, t):
        """KV heads one of t tensor-parallel ranks holds: k/t, or one whole (replicated) head when k < t.

        With fewer KV heads than ranks (multi-query attention: k = 1) each rank
        keeps a copy of the K and V head its query heads read, as vLLM's
        QKVParallelLinear does (num_kv_head_replicas = t/k); Megatron-Core
        instead requires t to divide k. With ``column_split`` the K and V columns
        are split like Q's: k/t, a fraction of a head when t > k. Works on arrays of t.
        """
        share = self.kv_heads / np.asarray(t, dtype=float)
        return share if self.column_split else np.maximum(share, 1.0)

    def tp_share(self, proj: "Projection", t):
        """Fraction of a projection's weights and outputs one of t TP ranks holds [-].

        1/t for a split projection, 1 for a replicated one; the fused QKV
        projection holds a/t query heads and ``kv_heads_per_rank`` K and V heads:
        (a/t + 2 max(k/t, 1)) / (a + 2k), which is 1/t when t divides k.
        """
        if proj.shard == "none":
            return 1.0
        if proj.name == "qkv":
            a, k = self.heads, self.kv_heads
            return (a / np.asarray(t, dtype=float) + 2.0 * self.kv_heads_per_rank(t)) / (a + 2 * k)
        return 1.0 / np.asarray(t, dtype=float)

    def latent_norm_params(self) -> int:
        """MLA's norms on the compressed query and KV (q_lora_rank + kv_lora_rank; 0 without MLA)."""
        lat = self.latent
        return ((lat.q_lora_rank or 0) + lat.kv_lora_rank) if lat else 0

    def projections(self, hidden: int) -> list:
        """The attention's linear layers, in order, as Projections.

        MHA/GQA: QKV [h -> (a + 2k) d] column-parallel, output [a d -> h] row-parallel.
        MLA: Q down/up (or one Q projection), KV down (with the rotary key) and up,
        output; the down projections are replicated across TP, the up ones split by head.
        """
        a, k = self.heads, self.kv_heads
        if not self.latent:
            return [Projection("qkv", hidden, (a + 2 * k) * self.head_dim, "out"),
                    Projection("out", a * self.head_dim, hidden, "in")]
        lat = self.latent
        q = ([Projection("q_down", hidden, lat.q_lora_rank, "none"),
              Projection("q_up", lat.q_lora_rank, a * self.qk_dim, "out")] if lat.q_lora_rank
             else [Projection("q", hidden, a * self.qk_dim, "out")])
        return q + [Projection("kv_down", hidden, lat.kv_lora_rank + lat.qk_rope_head_dim, "none"),
                    Projection("kv_up", lat.kv_lora_rank, a * (lat.qk_nope_head_dim + lat.v_head_dim), "out"),
                    Projection("out", a * self.v_dim, hidden, "in")]


@dataclass(frozen=True)
class MLP:
    """Dense feed-forward block."""

    ffn: int
    kind: MLPKind = MLPKind.GELU

    @property
    def gated(self) -> bool:
        """Three GEMMs (gate, up, down) instead of two."""
        return self.kind in (MLPKind.SWIGLU, MLPKind.GEGLU)


@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts feed-forward block (replaces the dense MLP on MoE layers).

    experts: routed experts; top_k: experts per token; ffn: FFN size of one
    routed expert; shared_ffn: total FFN size of the always-active shared
    experts (0 for none); dense_layers: the first layers that keep the dense
    MLP (DeepSeek's first_k_dense_replace). Experts use the model's MLP kind.
    expert_groups, groups_per_token: group-limited routing (DeepSeek-V2/V3
    device- or node-limited routing; n_group and topk_group in their
    config.json): the experts form expert_groups equal groups and each token's
    top_k experts come from at most groups_per_token of them. 1 and 1: no limit.
    """

    experts: int
    top_k: int
    ffn: int
    shared_ffn: int = 0
    dense_layers: int = 0
    expert_groups: int = 1
    groups_per_token: int = 1

    @property
    def group_limited(self) -> bool:
        """True when routing is restricted to some of several expert groups."""
        return self.expert_groups > 1


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer (pre-LayerNorm), sizes in elements.

    Architecture variants (docs/model.md, "Architecture variants"):
    parallel_residual: attention and MLP read the same normalised input and
      their outputs are summed (GPT-J, GPT-NeoX, Falcon);
    norms_per_layer: 2 (pre-norms); 4 adds a norm on each block's output
      (Gemma 2); with parallel_residual 1 (one shared norm) or 2 (one per
      branch, both on the layer input: GPT-NeoX);
    qkv_bias, mlp_bias: biases of the Q/K/V projections and of the MLP
      (None: as ``bias``, which also sets the output projection's);
    sliding_window, window_layers: attention of the listed layers (0-based;
      None: every layer) looks back at most sliding_window tokens;
    attn_logit_softcap, final_logit_softcap: c tanh(x / c) on the attention
      scores and on the output logits (Gemma 2);
    unmodelled: config keys that were read but are not modelled (the CLI notes them).
    """

    name: str
    layers: int
    hidden: int
    attention: Attention
    mlp: MLP
    vocab: int
    seq_len: int
    tied_embeddings: bool = True
    position: PositionEmbedding = PositionEmbedding.LEARNED
    dropout: bool = True
    bias: bool = True
    norm: Norm = Norm.LAYERNORM
    moe: MoE | None = None
    parallel_residual: bool = False
    norms_per_layer: int = 2
    qkv_bias: bool | None = None
    mlp_bias: bool | None = None
    sliding_window: int | None = None
    window_layers: tuple | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    unmodelled: tuple = field(default=(), compare=False, hash=False)
    source: str = ""
    description: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "vocab", "seq_len"):
            _require_positive(f"model.{name}", getattr(self, name))
        _require_positive("model.heads", self.attention.heads)
        _require_positive("model.kv_heads", self.attention.kv_heads)
        _require_positive("model.head_dim", self.attention.head_dim)
        _require_positive("model.ffn", self.mlp.ffn)
        if self.attention.heads % self.attention.kv_heads:
            raise InputError("model.kv_heads", f"{self.attention.kv_heads} must divide heads={self.attention.heads}")
        if self.moe:
            for name in ("experts", "top_k", "ffn"):
                _require_positive(f"model.moe.{name}", getattr(self.moe, name))
            if self.moe.top_k > self.moe.experts:
                raise InputError("model.moe.top_k", f"{self.moe.top_k} exceeds the {self.moe.experts} experts")
            if not 0 <= self.moe.dense_layers < self.layers:
                raise InputError("model.moe.dense_layers", f"must be in [0, {self.layers}), got {self.moe.dense_layers}")
            groups = self.moe.expert_groups
            if groups < 1 or self.moe.experts % groups:
                raise InputError("model.moe.expert_groups",
                                 f"must be a positive divisor of the {self.moe.experts} experts, got {groups}")
            if not 1 <= self.moe.groups_per_token <= groups:
                raise InputError("model.moe.groups_per_token",
                                 f"must be in [1, expert_groups={groups}], got {self.moe.groups_per_token}")
        self._check_variants()

    def _check_variants(self) -> None:
        """Norm count, window and soft-cap values that the cost model can read."""
        allowed = (1, 2) if self.parallel_residual else (2, 4)
        if self.norms_per_layer not in allowed:
            kind = "with parallel_residual" if self.parallel_residual else "without parallel_residual"
            raise InputError("model.norms_per_layer",
                             f"must be {' or '.join(map(str, allowed))} {kind}, got {self.norms_per_layer!r}")
        if self.sliding_window is not None:
            _require_positive("model.sliding_window", self.sliding_window)
        if self.window_layers is not None:
            if self.sliding_window is None:
                raise InputError("model.window_layers", "needs sliding_window")
            layers = self.window_layers
            if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.layers for i in layers) \
                    or list(layers) != sorted(set(layers)):
                raise InputError("model.window_layers",
                                 f"must be increasing layer indices in [0, {self.layers}), got {list(layers)!r}")
        for name in ("attn_logit_softcap", "final_logit_softcap"):
            cap = getattr(self, name)
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
                raise InputError(f"model.{name}", f"must be a positive number, got {cap!r}")

    # --- architecture variants ------------------------------------------------------
    @property
    def qkv_biased(self) -> bool:
        """Biases on the projections that produce Q, K and V (Qwen2: only these)."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def mlp_biased(self) -> bool:
        """Biases on the MLP (and expert) linear layers."""
        return self.bias if self.mlp_bias is None else self.mlp_bias

    def projection_bias(self, proj: Projection) -> bool:
        """Whether an attention projection has a bias: the output projection follows ``bias``, the others ``qkv_biased``."""
        return self.bias if proj.name == "out" else self.qkv_biased

    @property
    def windowed_layers(self) -> int:
        """Layers whose attention is limited to the sliding window (0 without one)."""
        if self.sliding_window is None:
            return 0
        return self.layers if self.window_layers is None else len(self.window_layers)

    @property
    def window_fraction(self) -> float:
        """Share of the layers with a sliding window [-] (0 without a window, 1 when every layer has it)."""
        return self.windowed_layers / self.layers

    def keys_per_query(self) -> float:
        """Keys each query attends to, averaged over the layers, causality ignored [tokens]:
        (1 - f_w) s + f_w min(s, w), f_w = ``window_fraction``. Equal to s without a window."""
        if not self.windowed_layers:
            return float(self.seq_len)
        f_w = self.window_fraction
        return (1.0 - f_w) * self.seq_len + f_w * min(self.seq_len, self.sliding_window)

    def causal_keys_per_query(self) -> float:
        """Keys each query attends to in a causal (decoder) model, averaged over queries and layers [tokens]:
        (1 - f_w) s / 2 + f_w k_w / 2, k_w = w (2 - w / s) with w = min(w, s).

        Query i sees i + 1 keys: s^2 / 2 scores per head and sequence (continuous form, the convention of
        FlashAttention's and Megatron-LM's causal FLOP counts), and s w - w^2 / 2 with a sliding window.
        Half of ``keys_per_query`` without a window."""
        s = float(self.seq_len)
        if not self.windowed_layers:
            return s / 2.0
        f_w = self.window_fraction
        w = min(s, float(self.sliding_window))
        return (1.0 - f_w) * s / 2.0 + f_w * w * (2.0 - w / s) / 2.0

    @property
    def tp_operators(self) -> tuple:
        """Megatron-LM's tensor-parallel operators per layer: (f, g).

        f (identity forward, all-reduce backward) sits before each column-parallel
        input, g (all-reduce forward, identity backward) after each row-parallel
        output (Shoeybi et al. 2019, Fig. 3). Sequential blocks: f = g = 2.
        Parallel residual: one g for the summed branch outputs (GPT-NeoX's
        row-parallel layers with parallel_output, mesh-transformer-jax's g_psum);
        f = 1 with one shared norm (mesh-transformer-jax's f_psum ahead of it),
        f = 2 with a norm per branch (GPT-NeoX: each column-parallel layer's
        copy_to_model_parallel_region).
        """
        if not self.parallel_residual:
            return 2, 2
        return (1, 1) if self.norms_per_layer == 1 else (2, 1)

    # --- parameter counts (elements), formulas in docs/model.md -------------------
    def projection_params(self, proj: Projection) -> int:
        """One attention projection: weights n_in * n_out plus n_out biases when it has them (``projection_bias``)."""
        return proj.params(self.projection_bias(proj))

    def attention_params(self) -> int:
        """Attention projections (MHA/GQA: h*(a+2k)*d + a*d*h), biases when used, MLA's two norms."""
        projections = self.attention.projections(self.hidden)
        return sum(self.projection_params(p) for p in projections) + self.attention.latent_norm_params()

    def ffn_params(self, ffn: int) -> int:
        """One feed-forward block of size f. GELU: 2*h*f (+ f + h biases); SwiGLU: 3*h*f (+ 2f + h)."""
        h = self.hidden
        if self.mlp.gated:
            return 3 * h * ffn + (2 * ffn + h if self.mlp_biased else 0)
        return 2 * h * ffn + (ffn + h if self.mlp_biased else 0)

    def mlp_params(self) -> int:
        """The dense MLP of a non-MoE layer."""
        return self.ffn_params(self.mlp.ffn)

    def moe_params(self, active: bool = False) -> int:
        """One MoE block: router h*E + E (or top_k when active) routed experts + shared experts."""
        moe = self.moe
        routed = moe.top_k if active else moe.experts
        shared = self.ffn_params(moe.shared_ffn) if moe.shared_ffn else 0
        return self.hidden * moe.experts + routed * self.ffn_params(moe.ffn) + shared

    def norm_params(self) -> int:
        """One norm layer: 2h for LayerNorm (scale, bias), h for RMSNorm."""
        return (2 if self.norm is Norm.LAYERNORM else 1) * self.hidden

    def layer_norm_params(self) -> int:
        """The norms of one layer: norms_per_layer x ``norm_params``."""
        return self.norms_per_layer * self.norm_params()

    @property
    def moe_layers(self) -> int:
        """Layers with a MoE block (0 for a dense model)."""
        return self.layers - self.moe.dense_layers if self.moe else 0

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def layer_params(self) -> int:
        """One dense transformer layer: attention + MLP + its norms."""
        return self.attention_params() + self.mlp_params() + self.layer_norm_params()

    def moe_layer_params(self, active: bool = False) -> int:
        """One MoE transformer layer: attention + MoE block + its norms."""
        return self.attention_params() + self.moe_params(active) + self.layer_norm_params()

    def embedding_params(self) -> int:
        """Token table V*h, plus a learned position table s*h when used."""
        pos = self.seq_len * self.hidden if self.position is PositionEmbedding.LEARNED else 0
        return self.vocab * self.hidden + pos

    def head_params(self) -> int:
        """Final norm plus the LM head V*h when embeddings are untied."""
        return self.norm_params() + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def total_params(self) -> int:
        """All parameters: dense and MoE layers + embeddings + final norm / head."""
        moe = self.moe_layers * self.moe_layer_params() if self.moe else 0
        return self.dense_layers * self.layer_params() + moe + self.embedding_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters a token passes through: MoE layers count top_k routed experts (equal to total when dense)."""
        moe = self.moe_layers * self.moe_layer_params(active=True) if self.moe else 0
        return self.dense_layers * self.layer_params() + moe + self.embedding_params() + self.head_params()

    @property
    def kind(self) -> str:
        """Its kind of model for error bands and training efficiencies: "MoE" or "dense"."""
        return "MoE" if self.moe else "dense"

    def with_seq_len(self, seq_len: int) -> "Transformer":
        """Copy with another sequence length (--seq-len)."""
        from dataclasses import replace

        return replace(self, seq_len=seq_len)


def _require_positive(field_name: str, value: object) -> None:
    """A count of the model: an int in bounds.BOUNDS (``seq_len``'s row for the sequence length, the
    ``integer`` row for the others), whichever reader or API call built the model."""
    row = BOUNDS["seq_len" if field_name.endswith(".seq_len") else "integer"]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(field_name, f"must be {row.integer_text()}, got {shown(value)}")
    row.check_integer(field_name, value)
