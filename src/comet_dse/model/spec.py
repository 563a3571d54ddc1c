"""The workload: a decoder-only transformer, as a frozen, validated spec.

The spec is split into parts (attention, MLP) so that later variants —
mixture-of-experts MLPs, latent attention — are new part types rather than a
reshaped spec.

Symbols used across the cost model (see docs/model.md):
    L layers, h hidden size, a attention heads, k KV heads, d = h/a head dim,
    f FFN size, V vocabulary, s sequence length.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from comet_dse.errors import InputError


class MLPKind(str, Enum):
    """Feed-forward block type."""

    GELU = "gelu"
    """Two GEMMs, h -> f -> h, with a GELU between (GPT, Megatron)."""
    SWIGLU = "swiglu"
    """Gated: three GEMMs (gate and up h -> f, down f -> h), SiLU(gate) * up (Llama)."""


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
        return self.kind is MLPKind.SWIGLU


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
    """A decoder-only transformer (pre-LayerNorm), sizes in elements."""

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

    # --- parameter counts (elements), formulas in docs/model.md -------------------
    def attention_params(self) -> int:
        """Attention projections (MHA/GQA: h*(a+2k)*d + a*d*h), biases when used, MLA's two norms."""
        projections = self.attention.projections(self.hidden)
        return sum(p.params(self.bias) for p in projections) + self.attention.latent_norm_params()

    def ffn_params(self, ffn: int) -> int:
        """One feed-forward block of size f. GELU: 2*h*f (+ f + h biases); SwiGLU: 3*h*f (+ 2f + h)."""
        h = self.hidden
        if self.mlp.gated:
            return 3 * h * ffn + (2 * ffn + h if self.bias else 0)
        return 2 * h * ffn + (ffn + h if self.bias else 0)

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

    @property
    def moe_layers(self) -> int:
        """Layers with a MoE block (0 for a dense model)."""
        return self.layers - self.moe.dense_layers if self.moe else 0

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def layer_params(self) -> int:
        """One dense transformer layer: attention + MLP + two norms."""
        return self.attention_params() + self.mlp_params() + 2 * self.norm_params()

    def moe_layer_params(self, active: bool = False) -> int:
        """One MoE transformer layer: attention + MoE block + two norms."""
        return self.attention_params() + self.moe_params(active) + 2 * self.norm_params()

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

    def with_seq_len(self, seq_len: int) -> "Transformer":
        """Copy with another sequence length (--seq-len)."""
        from dataclasses import replace

        return replace(self, seq_len=seq_len)


def _require_positive(field_name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(field_name, f"must be a positive integer, got {value!r}")
