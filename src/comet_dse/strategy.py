"""How a training step is parallelised and executed: degrees and knobs.

A Strategy is one design point. Validity rules that depend on the model and
cluster (degrees must divide heads, batch, devices) live in
cost/feasibility.py, because an invalid point is a result with reasons, not
an exception.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from comet_dse.errors import InputError


class Recompute(str, Enum):
    """Activation recomputation (Korthikanti et al. 2022, arXiv:2205.05198)."""

    NONE = "none"
    """Store every activation needed by backward."""
    SELECTIVE = "selective"
    """Drop the attention score/softmax/dropout tensors (O(s^2)) and recompute them in backward."""
    FULL = "full"
    """Store only each layer's input; recompute the whole layer forward in backward."""


class GradAccumulation(str, Enum):
    """How weight gradients of successive micro-batches are summed in fp32."""

    FUSED = "fused"
    """The weight-gradient GEMM accumulates into the fp32 buffer (Megatron-LM >= 2022, --gradient-accumulation-fusion)."""
    SEPARATE = "separate"
    """A separate element-wise add per micro-batch: main_grad += grad (Megatron-LM 2021-2022 DDP hook)."""


RECOMPUTE_CODES = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}
DTYPE_CHOICES = ("bf16", "fp16", "fp8")
CP_ALGORITHMS = ("ring", "all-gather")  # how context-parallel ranks exchange K and V
# Orders of the parallel axes on the device numbering, innermost first.
PLACEMENTS = ("tp-pp-dp", "tp-dp-pp", "pp-tp-dp", "pp-dp-tp", "dp-tp-pp", "dp-pp-tp")


def check_choices(name, dtype: str, zeros=(0,), placements=("tp-pp-dp",), cp_algorithm: str = "ring",
                  ep_fp8_dispatch: bool = False, moe_imbalance: float = 1.0) -> None:
    """The rules of a strategy's choice fields, for one Strategy and for a search space alike.

    ``name(field)`` is the field's name in the error (e.g. "ep-fp8-dispatch" on
    the command line, "strategy.ep_fp8_dispatch" in a study file).
    """
    if dtype not in DTYPE_CHOICES:
        raise InputError(name("dtype"), f"must be one of {', '.join(DTYPE_CHOICES)}, got {dtype!r}")
    for zero in zeros:
        if zero not in (0, 1, 2, 3):
            raise InputError(name("zero"), f"must be 0, 1, 2 or 3, got {zero!r}")
    for placement in placements:
        if placement not in PLACEMENTS:
            raise InputError(name("placement"), f"must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if cp_algorithm not in CP_ALGORITHMS:
        raise InputError(name("cp_algorithm"), f"must be one of {', '.join(CP_ALGORITHMS)}, got {cp_algorithm!r}")
    if ep_fp8_dispatch and dtype != "fp8":
        raise InputError(name("ep_fp8_dispatch"), f"needs dtype fp8, got {dtype}")
    imb = moe_imbalance
    if isinstance(imb, bool) or not isinstance(imb, (int, float)) or not 1.0 <= imb <= 64.0:
        raise InputError(name("moe_imbalance"), f"must be a number in [1, 64] (1 = balanced), got {imb!r}")


@dataclass(frozen=True)
class Strategy:
    """One parallelisation and execution choice.

    tp, pp, dp: tensor, pipeline and data parallel degrees (tp*cp*pp*dp = devices).
    cp: context parallel degree: each sequence split over cp devices (ring attention).
    ep: expert parallel degree: the experts of a MoE layer sharded over ep of the
      dp ranks (ep divides dp and the number of experts).
    moe_imbalance: tokens the busiest expert device receives relative to a
      perfectly balanced router (1.0 = balanced).
    ep_overlap: hide the expert all-to-alls behind the compute of another
      micro-batch (DeepSeek-V3's DualPipe); only the excess stays exposed.
    ep_fp8_dispatch: in fp8 training, send the tokens to their experts as fp8
      (and the activation gradients before the down projection in backward;
      DeepSeek-V3 Sec. 3.3.4); the combines stay 16-bit.
    cp_algorithm: how CP ranks exchange K and V: "ring" (passed around a ring,
      overlapped with attention) or "all-gather" (gathered before attention,
      exposed; Llama 3).
    tp_overlap: split each TP collective into chunks pipelined with the GEMM
      next to it (Megatron-Core --tp-comm-overlap, Transformer Engine); only
      what the GEMMs cannot hide, and at least one chunk, stays exposed.
    global_batch, micro_batch: sequences per iteration and per micro-batch.
    interleave: virtual pipeline stages per device (Narayanan et al. 2021, Sec. 2.2.2).
    zero: ZeRO stage 0..3 over the data-parallel group (Rajbhandari et al. 2020).
    dp_overlap: overlap the data-parallel gradient reduction with backward compute.
    flash_attention: fused attention kernel that never materialises the s x s scores.
    placement: order of the parallel axes on the devices, innermost first
      (default tp-pp-dp: TP inside a node, then PP, then DP). CP sits right
      outside TP; EP takes consecutive DP ranks.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    global_batch: int = 1
    micro_batch: int = 1
    interleave: int = 1
    recompute: Recompute = Recompute.NONE
    sequence_parallel: bool = False
    zero: int = 0
    dtype: str = "bf16"
    dp_overlap: bool = True
    flash_attention: bool = False
    grad_accumulation: GradAccumulation = GradAccumulation.FUSED
    placement: str = "tp-pp-dp"
    cp: int = 1
    ep: int = 1
    moe_imbalance: float = 1.0
    ep_overlap: bool = False
    tp_overlap: bool = False
    cp_algorithm: str = "ring"
    ep_fp8_dispatch: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "global_batch", "micro_batch", "interleave", "cp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(name.replace("_", "-"), f"must be a positive integer, got {value!r}")
        check_choices(lambda field: field.replace("_", "-"), self.dtype, (self.zero,), (self.placement,),
                      self.cp_algorithm, self.ep_fp8_dispatch, self.moe_imbalance)

    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.pp * self.dp


@dataclass(frozen=True)
class StrategyArrays:
    """Many strategies as parallel numpy arrays: the input of the batched cost model."""

    tp: object
    pp: object
    dp: object
    global_batch: object
    micro_batch: object
    interleave: object
    recompute: object         # 0 none, 1 selective, 2 full (RECOMPUTE_CODES)
    sequence_parallel: object
    zero: object
    dtype: object             # index into DTYPE_CHOICES
    dp_overlap: object
    flash_attention: object
    grad_fused: object
    placement: object         # index into PLACEMENTS
    cp: object = None
    ep: object = None
    moe_imbalance: object = None
    ep_overlap: object = None
    tp_overlap: object = None
    cp_all_gather: object = None    # True where CP exchanges K/V by all-gather (cp_algorithm)
    ep_fp8_dispatch: object = None

    def __post_init__(self) -> None:
        import numpy as np

        ones = np.ones(np.shape(self.tp))
        for name in ("cp", "ep", "moe_imbalance"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, ones)
        for name in ("ep_overlap", "tp_overlap", "cp_all_gather", "ep_fp8_dispatch"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros(np.shape(self.tp), dtype=bool))

    @classmethod
    def of(cls, strategies: list) -> "StrategyArrays":
        """Stack a list of Strategy into arrays (a single strategy is a batch of one)."""
        import numpy as np

        def col(fn, dtype):
            return np.array([fn(x) for x in strategies], dtype=dtype)

        return cls(
            tp=col(lambda x: x.tp, float), pp=col(lambda x: x.pp, float), dp=col(lambda x: x.dp, float),
            global_batch=col(lambda x: x.global_batch, float), micro_batch=col(lambda x: x.micro_batch, float),
            interleave=col(lambda x: x.interleave, float),
            recompute=col(lambda x: RECOMPUTE_CODES[x.recompute], int),
            sequence_parallel=col(lambda x: x.sequence_parallel, bool), zero=col(lambda x: x.zero, int),
            dtype=col(lambda x: DTYPE_CHOICES.index(x.dtype), int), dp_overlap=col(lambda x: x.dp_overlap, bool),
            flash_attention=col(lambda x: x.flash_attention, bool),
            grad_fused=col(lambda x: x.grad_accumulation is GradAccumulation.FUSED, bool),
            placement=col(lambda x: PLACEMENTS.index(x.placement), int),
            cp=col(lambda x: x.cp, float), ep=col(lambda x: x.ep, float),
            moe_imbalance=col(lambda x: x.moe_imbalance, float), ep_overlap=col(lambda x: x.ep_overlap, bool),
            tp_overlap=col(lambda x: x.tp_overlap, bool),
            cp_all_gather=col(lambda x: x.cp_algorithm == "all-gather", bool),
            ep_fp8_dispatch=col(lambda x: x.ep_fp8_dispatch, bool),
        )

    def take(self, index) -> "StrategyArrays":
        """The points at ``index`` (an integer array), as a new StrategyArrays."""
        from dataclasses import fields

        return StrategyArrays(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def dtype_table(self, values: dict, missing: float = float("nan")):
        """Per point, ``values[dtype name]`` (``missing`` where absent), by table lookup."""
        import numpy as np

        table = np.array([values.get(name, missing) for name in DTYPE_CHOICES], dtype=float)
        return table[self.dtype]

    def strides(self) -> dict:
        """Device-number stride of each parallel group under each point's placement.

        The placement orders three blocks, innermost first: "tp" (TP, with CP
        just outside it), "pp" and "dp"; a block's stride is the product of the
        degrees of the blocks inside it. EP takes consecutive DP ranks (stride
        of DP); the expert-data-parallel group (dp/ep) steps over whole EP groups.
        """
        import numpy as np

        degree = {"tp": self.tp * self.cp, "pp": self.pp, "dp": self.dp}
        block = {axis: np.ones_like(self.tp, dtype=float) for axis in degree}
        for code, order in enumerate(PLACEMENTS):
            inner = np.ones_like(self.tp, dtype=float)
            for axis in order.split("-"):
                block[axis] = np.where(self.placement == code, inner, block[axis])
                inner = inner * degree[axis]
        return {"tp": block["tp"], "cp": block["tp"] * self.tp, "pp": block["pp"], "dp": block["dp"],
                "ep": block["dp"], "edp": block["dp"] * self.ep}

    def __len__(self) -> int:
        return len(self.tp)
