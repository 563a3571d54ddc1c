"""Recommendation models (DLRM and DLRM-DCNv2): embedding tables, bottom and top MLPs and the feature
interaction, read from a model file with ``family: recommendation`` (docs/model.md, "Recommendation models").

Sizes are counts (rows, elements per row, lookups per sample); bytes come from each table's element type.
A sample plays the part a token plays for a transformer: throughput is samples per second, a training budget
counts samples.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from comet_dse.base.errors import InputError
from comet_dse.base.loading import Fields

ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}   # bytes of one embedding element
MAX_SKEW = 3.0                # a Zipf exponent above this puts nearly every lookup on a handful of rows
MAX_TABLES = 100_000          # a model file listing more tables than this is refused (each is enumerated)


class Interaction(str, Enum):
    """How the dense and the pooled sparse features are combined."""

    DOT = "dot"
    """DLRM's pairwise dot products of the F = tables + 1 feature vectors (Naumov et al. 2019,
    arXiv:1906.00091, Sec. 2.2): F(F-1)/2 products, concatenated with the dense vector."""
    DCN = "dcn"
    """DCN-v2 cross layers on the concatenated features x0 (Wang et al. 2021, arXiv:2008.13535):
    x_{l+1} = x0 * (U (V^T x_l) + b) + x_l, with a low-rank U V^T of rank ``cross_rank``."""


class EmbeddingOptimizer(str, Enum):
    """The optimizer of the embedding rows, which decides the state each row keeps and updates."""

    ROWWISE_ADAGRAD = "rowwise-adagrad"
    """One fp32 accumulator per row (FBGEMM's EXACT_ROWWISE_ADAGRAD, TorchRec's default)."""
    ADAGRAD = "adagrad"
    """One fp32 accumulator per element."""
    ADAM = "adam"
    """Two fp32 moments per element."""
    SGD = "sgd"
    """No state."""


STATE_BYTES_PER_ROW = {  # fp32 state per row of d elements: (bytes per row, bytes per element)
    EmbeddingOptimizer.ROWWISE_ADAGRAD: (4, 0), EmbeddingOptimizer.ADAGRAD: (0, 4),
    EmbeddingOptimizer.ADAM: (0, 8), EmbeddingOptimizer.SGD: (0, 0)}


@dataclass(frozen=True)
class EmbeddingTable:
    """One embedding table: ``rows`` x ``dim`` elements of ``element`` (a key of ELEMENT_BYTES), looked up
    ``pooling`` times per sample on average (1 for one-hot features) and sum-pooled."""

    rows: int
    dim: int
    pooling: float
    element: str = "fp32"

    @property
    def bytes_per_element(self) -> int:
        return ELEMENT_BYTES[self.element]

    @property
    def row_bytes(self) -> int:
        """Bytes of one row [B]."""
        return self.dim * self.bytes_per_element

    @property
    def table_bytes(self) -> int:
        """Bytes of the whole table [B]."""
        return self.rows * self.row_bytes


@dataclass(frozen=True)
class Recommendation:
    """A DLRM-style model: ``tables`` (EmbeddingTable, one per sparse feature), ``dense_features`` inputs
    through the ``bottom_mlp`` (output sizes, the last equal to every table's dim), the ``interaction`` and
    the ``top_mlp`` (output sizes, ending in 1: the click logit). Dense weights are fp32, as the MLPerf
    reference trains them. ``access_skew``: the exponent s of a Zipf law the rows of every table are looked up
    by (the k-th most frequent row taken in proportion to k^-s; 0: every row alike), which decides how many
    lookups the rows kept in HBM serve when the rest lives in a slower tier (cost/recommendation.py:
    hot_share)."""

    name: str
    tables: tuple
    dense_features: int
    bottom_mlp: tuple
    top_mlp: tuple
    interaction: Interaction = Interaction.DOT
    cross_layers: int = 0
    cross_rank: int = 0
    embedding_optimizer: EmbeddingOptimizer = EmbeddingOptimizer.ROWWISE_ADAGRAD
    access_skew: float = 0.0
    source: str = ""
    description: str = ""
    unmodelled: tuple = field(default=(), compare=False, hash=False)

    # what the tool's generic parts read from any model spec: a sample is one "token", no experts, no tie
    seq_len = 1
    moe = None
    tied_embeddings = False
    kind = "recommendation"      # its kind of model for error bands and training efficiencies

    @property
    def dim(self) -> int:
        """The embedding dim every table and the bottom MLP's output share."""
        return self.tables[0].dim

    @property
    def features(self) -> int:
        """F: the vectors the interaction combines (the tables' pooled embeddings and the dense vector)."""
        return len(self.tables) + 1

    @property
    def interaction_width(self) -> int:
        """Elements per sample the interaction hands the top MLP: dot, d + F(F-1)/2; dcn, F d."""
        f = self.features
        if self.interaction is Interaction.DOT:
            return self.dim + f * (f - 1) // 2
        return f * self.dim

    def mlp_shapes(self) -> list:
        """(inputs, outputs) of every dense linear layer, bottom MLP first, then the top MLP."""
        shapes, width = [], self.dense_features
        for out in self.bottom_mlp:
            shapes.append((width, out))
            width = out
        width = self.interaction_width
        for out in self.top_mlp:
            shapes.append((width, out))
            width = out
        return shapes

    def cross_params(self) -> int:
        """Parameters of the DCN-v2 cross layers: each U (n x r), V (n x r) and a bias n, n = F d."""
        if self.interaction is not Interaction.DCN:
            return 0
        n = self.features * self.dim
        return self.cross_layers * (2 * n * self.cross_rank + n)

    def dense_params(self) -> int:
        """Parameters of the MLPs (weights and biases) and the cross layers."""
        return sum(i * o + o for i, o in self.mlp_shapes()) + self.cross_params()

    def embedding_params(self) -> int:
        return sum(t.rows * t.dim for t in self.tables)

    def embedding_bytes(self) -> int:
        return sum(t.table_bytes for t in self.tables)

    def embedding_state_bytes(self) -> int:
        """Bytes of the embedding optimizer's state over every table (STATE_BYTES_PER_ROW)."""
        per_row, per_element = STATE_BYTES_PER_ROW[self.embedding_optimizer]
        return sum(t.rows * (per_row + per_element * t.dim) for t in self.tables)

    def total_params(self) -> int:
        return self.embedding_params() + self.dense_params()

    def with_seq_len(self, seq_len: int) -> "Recommendation":
        if seq_len in (None, 1):
            return self
        raise InputError("seq_len", "applies to transformers only; a recommendation model's unit is one sample")


def recommendation_from(data: dict, prefix: str = "model") -> Recommendation:
    """Build a Recommendation from a mapping shaped like presets/models/dlrm-*.yaml (``family: recommendation``).

    ``tables`` is a list of {rows, dim, pooling, element, count}: ``count`` repeats one entry (default 1)."""
    f = Fields(data, prefix)
    raw_tables = f.raw("tables")
    if not isinstance(raw_tables, list) or not raw_tables:
        raise InputError(f.name("tables"), "must be a non-empty list of tables ({rows, dim, pooling})")
    tables = []
    for i, item in enumerate(raw_tables):
        t = Fields(item, f"{f.name('tables')}[{i}]")
        element = t.text("element", "fp32")
        if element not in ELEMENT_BYTES:
            raise InputError(t.name("element"), f"must be one of {', '.join(ELEMENT_BYTES)}, got {element!r}")
        pooling = t.raw("pooling", 1)
        if isinstance(pooling, bool) or not isinstance(pooling, (int, float)) or not 0 < pooling <= 100_000:
            raise InputError(t.name("pooling"), f"must be a number of lookups per sample in (0, 100000], "
                             f"got {pooling!r}")
        table = EmbeddingTable(rows=t.integer("rows", maximum=10**12, bound="table_rows"), dim=t.integer("dim"),
                               pooling=float(pooling), element=element)
        count = t.integer("count", 1, maximum=MAX_TABLES)
        t.reject_unknown()
        tables.extend([table] * count)
        if len(tables) > MAX_TABLES:
            raise InputError(f.name("tables"), f"lists more than {MAX_TABLES:,} tables")
    dims = {t.dim for t in tables}
    if len(dims) > 1:
        raise InputError(f.name("tables"), f"every table must have the same dim (the interaction combines them), "
                         f"got {sorted(dims)}")
    bottom = _layers(f, "bottom_mlp")
    top = _layers(f, "top_mlp")
    if bottom[-1] != tables[0].dim:
        raise InputError(f.name("bottom_mlp"), f"must end in the embedding dim {tables[0].dim}, got {bottom[-1]}")
    if top[-1] != 1:
        raise InputError(f.name("top_mlp"), f"must end in 1 (the click logit), got {top[-1]}")
    interaction = f.choice("interaction", Interaction, Interaction.DOT)
    cross_layers = f.integer("cross_layers", 0, minimum=0) if interaction is Interaction.DCN else 0
    cross_rank = f.integer("cross_rank", 1) if interaction is Interaction.DCN else 0
    if interaction is Interaction.DCN and cross_layers < 1:
        raise InputError(f.name("cross_layers"), "must be at least 1 with interaction dcn")
    model = Recommendation(
        name=f.name_text("name"), tables=tuple(tables), dense_features=f.integer("dense_features"),
        bottom_mlp=bottom, top_mlp=top, interaction=interaction, cross_layers=cross_layers, cross_rank=cross_rank,
        embedding_optimizer=f.choice("embedding_optimizer", EmbeddingOptimizer, EmbeddingOptimizer.ROWWISE_ADAGRAD),
        access_skew=_skew(f), source=f.text("source", ""), description=f.text("description", ""))
    f.reject_unknown(("family",))
    return model


def _skew(f: Fields) -> float:
    """``access_skew``: a Zipf exponent in [0, MAX_SKEW] (0, every row alike, when absent)."""
    raw = f.raw("access_skew", 0.0)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0.0 <= raw <= MAX_SKEW:
        raise InputError(f.name("access_skew"), f"must be a Zipf exponent in [0, {MAX_SKEW:g}] (0: every row "
                         f"looked up alike), got {raw!r}")
    return float(raw)


def _layers(f: Fields, key: str) -> tuple:
    """A list of positive layer output sizes."""
    raw = f.raw(key)
    if (not isinstance(raw, list) or not raw
            or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= 10_000_000 for x in raw)):
        raise InputError(f.name(key), f"must be a non-empty list of layer sizes (integers 1 to 10,000,000), "
                         f"got {raw!r}")
    return tuple(raw)
