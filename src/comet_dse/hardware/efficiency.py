"""The training efficiency measured on public runs: the fraction of its benchmark tensor rate a device holds
in a real training step, per family (accelerator, precision class, dense or mixture-of-experts model).

What it is. The cost model times every tensor kernel at the benchmark rate of a short burst (peak x
matmul_efficiency or attention_efficiency) times ``tensor_sustained``, the fraction a device holds for
minutes at its power limit (a burn test: 0.962 on Hopper, 0.874 on Blackwell, docs/hardware.md). That is
the *physical reading*. On the published runs of today's GPUs it reads 14-20 % too fast
(docs/validation.md), by a steady fraction. The *training efficiency* is that fraction measured: one
value of ``tensor_sustained`` per family, fitted by least squares to the family's published step times
(``python -m comet_dse.answers.efficiency_fit``), cross-validated, and written with its provenance into an
efficiency file (the shipped one: data/training_efficiency.yaml). It stands in for everything a training
step loses beyond what the model costs (clocks under a whole node's power, host gaps, kernels not
modelled); every mechanism added to the model moves it toward the physical value.

Where it applies. A cluster file that says ``training_efficiency: public-runs`` (every preset) takes the
shipped file's families for its accelerator; ``physical`` (or ``--physical`` on the command line) keeps
the burn-test value. A family without runs takes the nearest measured family of the same accelerator,
marked assumed: the same precision with the other kind of model, then the same kind in the other
precision, then any family of the accelerator; an accelerator without any takes its same-silicon
sibling's (``SAME_SILICON``), also assumed; otherwise the physical reading stays.

An efficiency file is refused with one line when a value lies outside (0, 1], when a runs file it names is
missing or differs from the one it was fitted on (sha256), or when it was edited after its fit (its
checksum over everything else differs).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from comet_dse.base.errors import InputError
from comet_dse.base.fingerprint import fingerprint
from comet_dse.base.written import sha256_hex

SHIPPED = "public-runs"        # a cluster file's `training_efficiency:` for the shipped efficiency file
PHYSICAL = "physical"          # ... for the burn-test reading (no fitted efficiency)
SHIPPED_FILE = "training_efficiency.yaml"
PRECISIONS = ("16-bit", "fp8")
KINDS = ("dense", "MoE")
MEASURED, ASSUMED = "measured", "assumed"

# Parts cut from the same die whose training steps run the same kernels at the same clocks: the H800 is an
# H100 SXM5 with fewer NVLink links (NVIDIA H800 product brief: same GH100, 989.4 TFLOP/s dense bf16); the
# MI300X carries the MI325X's CDNA 3 compute dies (304 CUs at 2.1 GHz, 1307.4 TFLOP/s dense bf16 on both AMD
# datasheets) with less and slower HBM (192 GB HBM3 at 5.3 TB/s against 256 GB HBM3E at 6 TB/s).
SAME_SILICON = {"NVIDIA H800 SXM5 80GB": "NVIDIA H100 SXM5 80GB", "AMD Instinct MI300X": "AMD Instinct MI325X"}
# Parts of one architecture whose tensor rates and software stack are the same: the B300 is Blackwell Ultra, the
# Blackwell architecture with more HBM and faster NVFP4 (NVIDIA technical blog "Inside NVIDIA Blackwell Ultra",
# Aug 2025), at the B200's dense bf16 and fp8 rates (HGX B300 and HGX B200 tables: 2.25 and 4.5 PFLOP/s per GPU).
# A family with no measured family of its kind on its own accelerator takes the sibling's of that kind before its
# own of the other kind: a MoE family's efficiency folds in losses dense layers do not have (docs/hardware.md,
# "Training efficiency"; B300's two dense runs read 27 % slow at its MoE family's value).
SAME_GENERATION = {"NVIDIA B300 270GB": "NVIDIA B200 180GB"}


def precision_class(dtype: str) -> str:
    """'16-bit' for fp16 and bf16 (the model costs them alike, but for fp16's loss scaling), else the dtype."""
    return "16-bit" if dtype in ("fp16", "bf16") else dtype


def kind_of(moe) -> str:
    """The model family: "MoE" for a mixture-of-experts model (a truthy ``moe``), else "dense"."""
    return "MoE" if moe else "dense"


@dataclass(frozen=True)
class Applied:
    """The training efficiency one family of a cluster runs at, and where it comes from.

    value: the fraction of the benchmark tensor rate (replaces tensor_sustained for this family) [-].
    status: MEASURED (fitted on this family's runs) or ASSUMED (taken from ``family``, the nearest measured).
    family: the measured family it comes from, {accelerator, precision, kind, runs, ...} as in the file.
    source: the efficiency file it was read from (for messages).
    """

    value: float
    status: str
    family: dict
    source: str

    def text(self, physical: float) -> str:
        """'0.83 of the benchmark tensor rate, measured on 25 public NVIDIA H100 ... 16-bit dense runs
        (leave-one-out mean |error| 5.1 %); physical reading 0.962 (--physical)'."""
        fam = self.family
        held = fam.get("error_cross_validated") or {}
        how = fam.get("cross_validation", "cross-validated")
        where = (f"measured on {fam['runs']} public {fam['precision']} {fam['kind']} runs"
                 if self.status == MEASURED else
                 f"assumed: the nearest measured family's ({fam['accelerator']} {fam['precision']} "
                 f"{fam['kind']}, {fam['runs']} runs)")
        error = (f"; {how} mean |error| {held['mean_abs_error'] * 100:.1f} %"
                 if held.get("mean_abs_error") is not None else "")
        return (f"{self.value:.3f} of the benchmark tensor rate, {where}{error}; "
                f"physical reading {physical:.3f} (--physical)")

    def to_dict(self, physical: float) -> dict:
        fam = self.family
        return {"value": self.value, "status": self.status, "physical": physical, "source": self.source,
                "family": {k: fam[k] for k in ("accelerator", "precision", "kind", "runs") if k in fam},
                "cross_validation": fam.get("cross_validation"),
                "error_cross_validated": fam.get("error_cross_validated"),
                "error_physical": fam.get("error_physical"), "text": self.text(physical)}


# --- the efficiency file ------------------------------------------------------------------------------


def checksum(data: dict) -> str:
    """sha256 of the file's content without its ``checksum`` key, as canonical JSON (base/fingerprint.py)."""
    return fingerprint(data, ("checksum",))


def check_table(data, folder: Path, where: str) -> tuple:
    """The families of an efficiency file's content ``data`` (read from ``folder``), after every check; an
    InputError naming ``where`` and the field otherwise."""
    if not isinstance(data, dict) or not isinstance(data.get("families"), list) or not data["families"]:
        raise InputError(where, "is not an efficiency file (a mapping with a non-empty `families:` list, "
                                "written by python -m comet_dse.answers.efficiency_fit)")
    runs_files = data.get("runs_files")
    if not isinstance(runs_files, list) or not runs_files:
        raise InputError(f"{where}: runs_files", "must list the runs the efficiency was fitted on")
    for i, entry in enumerate(runs_files):
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            raise InputError(f"{where}: runs_files[{i}]", "must be {file: ..., sha256: ...}")
        path = folder / entry["file"]
        if not path.is_file():
            raise InputError(f"{where}: runs_files[{i}]", f"the source runs {entry['file']} are missing "
                                                          f"(looked in {folder})")
        if sha256_hex(path) != entry.get("sha256"):
            raise InputError(f"{where}: runs_files[{i}]", f"{entry['file']} differs from the runs the efficiency "
                                                          "was fitted on (sha256); refit it")
    for i, fam in enumerate(data["families"]):
        value = fam.get("efficiency") if isinstance(fam, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= 1):
            raise InputError(f"{where}: families[{i}].efficiency", f"must be a fraction in (0, 1], got {value!r}")
        missing = [k for k in ("accelerator", "precision", "kind", "runs") if k not in fam]
        if missing:
            raise InputError(f"{where}: families[{i}]", f"lacks {', '.join(missing)}")
        if fam["precision"] not in PRECISIONS or fam["kind"] not in KINDS:
            raise InputError(f"{where}: families[{i}]", f"precision must be one of {', '.join(PRECISIONS)} and "
                                                        f"kind one of {', '.join(KINDS)}")
    if data.get("checksum") != checksum(data):
        raise InputError(f"{where}: checksum", "the file was edited after its fit (its checksum differs); "
                                               "refit it with python -m comet_dse.answers.efficiency_fit")
    return tuple(data["families"])


def read_table(path: Path) -> tuple:
    """The checked families of the efficiency file at ``path``."""
    from comet_dse.base.loading import read_yaml

    return check_table(read_yaml(path, "training_efficiency"), path.parent, str(path))


@lru_cache(maxsize=1)
def shipped_table() -> tuple:
    """The families of the shipped efficiency file (data/training_efficiency.yaml), checked once."""
    return read_table(shipped_path())


def shipped_path() -> Path:
    return Path(str(resources.files("comet_dse").joinpath("data", SHIPPED_FILE)))


# --- which family a cluster runs at -------------------------------------------------------------------


def resolve(families, accelerator: str, source: str) -> dict:
    """(precision, kind) -> Applied for every family of ``accelerator``: measured where the file has it (and
    its value generalises: ``applies``, efficiency_fit), else the nearest measured family of the accelerator
    (then of its same-silicon sibling), assumed (where that would be the other kind of model, a same-generation
    sibling's family of the same kind first);
    families with nothing to take from are left out (they keep the physical reading), as are those whose own
    runs were fitted at or above it (``at_physical``: taking another family's lower value would read them slower
    still)."""
    out = {}
    kept_physical = _kept_at_physical(families, accelerator)
    for name in (accelerator, SAME_SILICON.get(accelerator)):
        own = [f for f in families if f["accelerator"] == name and f.get("applies", True)]
        for precision in PRECISIONS:
            for kind in KINDS:
                if (precision, kind) in out or (precision, kind) in kept_physical or not own:
                    continue
                exact = [f for f in own if f["precision"] == precision and f["kind"] == kind]
                if exact and name == accelerator:
                    out[precision, kind] = Applied(float(exact[0]["efficiency"]), MEASURED, exact[0], source)
                    continue
                near = _nearest(own, precision, kind)
                if near["kind"] != kind and name == accelerator:
                    near = _same_kind_of_generation(families, accelerator, precision, kind) or near
                out[precision, kind] = Applied(float(near["efficiency"]), ASSUMED, near, source)
    return out


def _same_kind_of_generation(families, accelerator: str, precision: str, kind: str) -> dict | None:
    """The nearest shipped family of ``kind`` on ``accelerator``'s same-generation sibling (SAME_GENERATION), or
    None."""
    sibling = SAME_GENERATION.get(accelerator)
    same = [f for f in families if f["accelerator"] == sibling and f["kind"] == kind and f.get("applies", True)]
    return _nearest(same, precision, kind) if same else None


def _nearest(own: list, precision: str, kind: str) -> dict:
    """The measured family of one accelerator nearest to (precision, kind): the same precision with the
    other kind, then the same kind in the other precision, then any; the one with most runs."""
    for test in (lambda f: f["precision"] == precision and f["kind"] == kind, lambda f: f["precision"] == precision,
                 lambda f: f["kind"] == kind, lambda f: True):
        found = [f for f in own if test(f)]
        if found:
            return max(found, key=lambda f: f["runs"])
    raise AssertionError("no family")                  # resolve calls this only with families present


def efficiency_of(setting, accelerator: str) -> dict:
    """What a cluster file's ``training_efficiency:`` setting gives ``accelerator``: SHIPPED -> the shipped
    file's families, PHYSICAL or None -> none, anything else: a path to an efficiency file."""
    if setting in (None, PHYSICAL):
        return {}
    if setting == SHIPPED:
        return resolve(shipped_table(), accelerator, f"{SHIPPED} ({SHIPPED_FILE})")
    if not isinstance(setting, str) or not setting.strip():
        raise InputError("training_efficiency", f"must be {SHIPPED}, {PHYSICAL} or the path of an efficiency "
                                                f"file, got {setting!r}")
    path = Path(setting)
    if not path.is_file():
        raise InputError("training_efficiency", f"no efficiency file {setting!r}; give {SHIPPED}, {PHYSICAL} or "
                                                "a file written by python -m comet_dse.answers.efficiency_fit")
    return resolve(read_table(path), accelerator, str(path))


def _kept_at_physical(families, accelerator: str) -> dict:
    """(precision, kind) -> family of ``accelerator`` whose own runs were fitted at or above the physical reading
    (``at_physical``, efficiency_fit): such a family keeps the physical reading."""
    return {(f["precision"], f["kind"]): f for f in families
            if f["accelerator"] == accelerator and f.get("at_physical")}


def _fitted_at_physical(setting, accelerator: str, precision: str, kind: str) -> dict | None:
    """``_kept_at_physical``'s family for (precision, kind) in the efficiency file ``setting`` names, or None."""
    if setting in (None, PHYSICAL):
        return None
    families = shipped_table() if setting == SHIPPED else read_table(Path(setting))
    return _kept_at_physical(families, accelerator).get((precision, kind))


def efficiency_summary(accelerator, setting: str, dtype: str, moe, kind: str | None = None) -> dict:
    """What tensor rate an estimate on ``accelerator`` (spec.Accelerator) in ``dtype`` of a dense or MoE model
    (or of the ``kind`` given: "recommendation") runs at, for output: {value, status (measured / assumed /
    physical), physical, family, text, ...}."""
    physical = accelerator.physical_sustained(dtype)
    kind = kind or kind_of(moe)
    applied = accelerator.training_efficiency.get((precision_class(dtype), kind))
    if applied is not None:
        return applied.to_dict(physical)
    at_physical = _fitted_at_physical(setting, accelerator.name, precision_class(dtype), kind)
    if setting == PHYSICAL:
        why = "--physical or the cluster file's `training_efficiency: physical`"
    elif at_physical is not None:
        error = 100.0 * at_physical["error_physical"]["mean_abs_error"]
        why = (f"its {at_physical['runs']} public {precision_class(dtype)} {kind} runs fit best at it, mean |error| "
               f"{error:.1f} %: no efficiency below it explains them")
    else:
        why = f"no public {precision_class(dtype)} {kind} runs of {accelerator.name} in the efficiency file"
    return {"value": physical, "status": PHYSICAL, "physical": physical, "source": setting, "family": None,
            "cross_validation": None, "error_cross_validated": None, "error_physical": None,
            "text": f"{physical:.3f} of the benchmark tensor rate: the physical reading ({why})"}
