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
class Attention:
    """Multi-head attention with optional grouped KV heads (GQA/MQA)."""

    heads: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class MLP:
    """Dense feed-forward block."""

    ffn: int
    kind: MLPKind = MLPKind.GELU

    @property
    def gated(self) -> bool:
        return self.kind is MLPKind.SWIGLU


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

    # --- parameter counts (elements), formulas in docs/model.md -------------------
    def attention_params(self) -> int:
        """QKV and output projections: h*(a+2k)*d + a*d*h, plus biases (a+2k)*d + h when used."""
        a, k, d, h = self.attention.heads, self.attention.kv_heads, self.attention.head_dim, self.hidden
        biases = (a + 2 * k) * d + h if self.bias else 0
        return h * (a + 2 * k) * d + a * d * h + biases

    def mlp_params(self) -> int:
        """GELU: 2*h*f (+ f + h biases). SwiGLU: 3*h*f (+ 2f + h biases)."""
        h, f = self.hidden, self.mlp.ffn
        if self.mlp.gated:
            return 3 * h * f + (2 * f + h if self.bias else 0)
        return 2 * h * f + (f + h if self.bias else 0)

    def norm_params(self) -> int:
        """One norm layer: 2h for LayerNorm (scale, bias), h for RMSNorm."""
        return (2 if self.norm is Norm.LAYERNORM else 1) * self.hidden

    def layer_params(self) -> int:
        """One transformer layer: attention + MLP + two norms."""
        return self.attention_params() + self.mlp_params() + 2 * self.norm_params()

    def embedding_params(self) -> int:
        """Token table V*h, plus a learned position table s*h when used."""
        pos = self.seq_len * self.hidden if self.position is PositionEmbedding.LEARNED else 0
        return self.vocab * self.hidden + pos

    def head_params(self) -> int:
        """Final norm plus the LM head V*h when embeddings are untied."""
        return self.norm_params() + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def total_params(self) -> int:
        """All parameters: L layers + embeddings + final norm / head."""
        return self.layers * self.layer_params() + self.embedding_params() + self.head_params()

    def with_seq_len(self, seq_len: int) -> "Transformer":
        """Copy with another sequence length (--seq-len)."""
        from dataclasses import replace

        return replace(self, seq_len=seq_len)


def _require_positive(field_name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(field_name, f"must be a positive integer, got {value!r}")
