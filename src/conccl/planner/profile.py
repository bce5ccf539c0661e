"""A GPU node's measured hardware profile: what the planner and the no-GPU study read.

Written by a measured study (``conccl study`` condenses its results into ``profile.json`` in
its report folder: :func:`conccl.study.profile_fit.profile_from_study`); an H200 x4 profile
measured on the GPU machines ships with the package (``conccl/data/h200x4_profile.json``) and
is the default where no GPU is visible.

Which profile a GPU gets when none is named: :mod:`conccl.planner.shipped`.

One reader (:meth:`HardwareProfile.from_dict`, and :func:`load_profile` for a file) and one
writer (:meth:`HardwareProfile.to_json`). Formats (the ``format`` field); a reader reads its
own and every older one (fields added since take their defaults) and refuses a newer one,
naming both, so a later conccl that adds fields (latency, TP) bumps the number:

- ``conccl-profile/3`` (:data:`FORMAT`): adds ``eager_sweep``, the public functions' eager
  calls on ordinary tensors over sizes (empty: not measured; ``set_eager_path("auto")`` then
  plans from ``comm_sweep``).
- ``conccl-profile/2``: adds ``nvlinks``, the active NVLinks of the measured
  GPU (0: not recorded), one of the keys the shipped profiles are chosen by.
- ``conccl-profile/1``: the fields before; profiles from before ``comm_sweep`` and
  ``interference`` existed load with those tables empty.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import MISSING, asdict, dataclass, field, fields

from ..jsonfile import read_json
from . import profile_check

FORMAT = "conccl-profile/3"
OLDER_FORMATS = ("conccl-profile/2", "conccl-profile/1")
EMBEDDED = pathlib.Path(__file__).parents[1] / "data" / "h200x4_profile.json"


class ProfileError(ValueError):
    """A profile file that is unreadable, of another format, or for another GPU."""


@dataclass(frozen=True)
class HardwareProfile:
    device: str
    world: int
    sm_count: int
    memory_bytes: int
    bf16_flops: float  # best measured bf16 GEMM rate, flop/s
    hbm_bytes_per_s: float  # same-GPU copy, read + write
    nvlink_bytes_per_s: float  # best copy-engine bus bandwidth per GPU
    # Fraction of the peak a GEMM of each measured class reaches (flops for compute-bound,
    # bytes for memory-bound).
    gemm_efficiency: dict = field(default_factory=dict)
    # impl -> collective -> {"latency_s", "bus_bytes_per_s"}: t = latency + size*(w-1)/w / bus
    collectives: dict = field(default_factory=dict)
    # GEMM class -> {SMs taken: slowdown}
    gemm_sm_loss: dict = field(default_factory=dict)
    # collective -> "latency-bound" | "bandwidth-bound" -> {CTAs: slowdown}
    coll_cta_loss: dict = field(default_factory=dict)
    # strategy -> collective -> taxonomy | "all" -> mean percent of ideal measured
    overlap: dict = field(default_factory=dict)
    # impl -> collective -> [[size, seconds], ...]: the measured size sweep (world = ``world``)
    comm_sweep: dict = field(default_factory=dict)
    # impl ("conccl", "nccl") -> collective -> [[size, seconds per call], ...]: the public
    # functions called eagerly on ordinary tensors, back to back (host time included; the
    # study's eager sweep): what conccl.planner.eager chooses between (its verdict at the
    # largest size holds above it)
    eager_sweep: dict = field(default_factory=dict)
    # pairing ("ce", "sm", "base", "rp") -> GEMM class -> {"gemm", "comm"}: slowdowns while both
    # run beyond lost SMs and shared HBM, fitted on the reference GEMMs' scenarios (planner.fit)
    interference: dict = field(default_factory=dict)
    # the tensor-parallel characterization (``conccl study tp``, ``study.tp_measure.profile_table``):
    # {"dtype", "rows_ms": {"MxKxN": {rows: ms}}, "contention": {"MxKxN": {rows: slowdown}}, "source"};
    # empty: conccl.planner.tp uses the embedded one of the GPU
    tp: dict = field(default_factory=dict)
    nvlinks: int = 0  # active NVLinks of a measured GPU (NVML); 0: not recorded
    source: dict = field(default_factory=dict)
    format: str = FORMAT

    def __post_init__(self):
        if self.format != FORMAT:
            raise ProfileError(f"a hardware profile of format {self.format!r}; this conccl writes {FORMAT!r}")
        try:
            profile_check.check(self)
        except profile_check.Refused as e:
            raise ProfileError(str(e)) from None

    def to_json(self) -> str:
        """The one writer (JSON turns the tables' integer keys into strings; from_dict turns them back)."""
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict, origin: str = "profile") -> "HardwareProfile":
        """The one reader."""
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        if found in OLDER_FORMATS:  # the fields added since take their defaults
            data = dict(data, format=FORMAT)
        elif found != FORMAT:
            raise ProfileError(f"{origin}: not a {FORMAT} hardware profile (format {found!r} found, {FORMAT!r} "
                               f"expected, or an older {', '.join(OLDER_FORMATS)}); re-create it with a measured "
                               "`conccl study`")
        names = set(cls.__dataclass_fields__)
        missing = [f.name for f in fields(cls)
                   if f.default is MISSING and f.default_factory is MISSING and f.name not in data]
        if missing:
            raise ProfileError(f"{origin}: missing field(s) {', '.join(missing)}")
        unknown = sorted(set(data) - names)
        if unknown:
            raise ProfileError(f"{origin}: unknown field(s) {', '.join(unknown)} in a {FORMAT} hardware profile")
        try:
            obj = cls(**data)
        except ProfileError as e:
            raise ProfileError(f"{origin}: {e}") from None
        # JSON turns integer keys into strings; give the tables their numbers back.
        try:
            object.__setattr__(obj, "gemm_sm_loss", {c: {int(k): v for k, v in t.items()}
                                                     for c, t in obj.gemm_sm_loss.items()})
            object.__setattr__(obj, "coll_cta_loss", {c: {b: {int(k): v for k, v in t.items()} for b, t in bs.items()}
                                                      for c, bs in obj.coll_cta_loss.items()})
        except (ValueError, AttributeError):
            raise ProfileError(f"{origin}: the tables gemm_sm_loss and coll_cta_loss must map whole numbers "
                               "(SMs, CTAs) to slowdowns") from None
        return obj

    def check_device(self, device_name: str) -> None:
        """Refuse a profile measured on another GPU model (never a silent fallback)."""
        if device_name and self.device != device_name:
            raise ProfileError(f"the profile was measured on {self.device!r}, this GPU is {device_name!r}; "
                               "run a measured `conccl study` here to make one")


def load_profile(path=None) -> HardwareProfile:
    path = pathlib.Path(path) if path else EMBEDDED
    return HardwareProfile.from_dict(read_json(path, ProfileError, "profile"), str(path))
