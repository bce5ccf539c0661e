"""A GPU node's measured hardware profile: what the planner and the no-GPU study read.

Written by a measured study (``conccl study`` writes ``profile.json`` into its report folder);
an H200 x4 profile measured on the GPU machines ships with the package
(``conccl/data/h200x4_profile.json``) and is the default where no GPU is visible.
"""
from __future__ import annotations

import json
import pathlib
import statistics
from dataclasses import asdict, dataclass, field, replace

FORMAT = "conccl-profile/1"
EMBEDDED = pathlib.Path(__file__).with_name("data") / "h200x4_profile.json"


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
    # pairing ("ce", "sm", "base", "rp") -> GEMM class -> {"gemm", "comm"}: slowdowns while both
    # run beyond lost SMs and shared HBM, fitted on the reference GEMMs' scenarios (planner.fit)
    interference: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    format: str = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict, origin: str = "profile") -> "HardwareProfile":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ProfileError(f"{origin}: not a {FORMAT} hardware profile (format {found!r}); "
                               "re-create it with a measured `conccl study`")
        names = set(cls.__dataclass_fields__)
        missing = [k for k in ("device", "world", "sm_count", "bf16_flops", "hbm_bytes_per_s") if k not in data]
        if missing:
            raise ProfileError(f"{origin}: missing field(s) {', '.join(missing)}")
        obj = cls(**{k: v for k, v in data.items() if k in names})
        # JSON turns integer keys into strings; give the tables their numbers back.
        object.__setattr__(obj, "gemm_sm_loss", {c: {int(k): v for k, v in t.items()} for c, t in obj.gemm_sm_loss.items()})
        object.__setattr__(obj, "coll_cta_loss", {c: {b: {int(k): v for k, v in t.items()} for b, t in bs.items()}
                                                  for c, bs in obj.coll_cta_loss.items()})
        return obj

    def check_device(self, device_name: str) -> None:
        """Refuse a profile measured on another GPU model (never a silent fallback)."""
        if device_name and self.device != device_name:
            raise ProfileError(f"the profile was measured on {self.device!r}, this GPU is {device_name!r}; "
                               "run a measured `conccl study` here to make one")


def load_profile(path=None) -> HardwareProfile:
    path = pathlib.Path(path) if path else EMBEDDED
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ProfileError(f"cannot read profile {str(path)!r}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return HardwareProfile.from_dict(data, str(path))


# The suite's reference GEMMs: one compute-bound, one memory-bound on H200 (as the paper built
# its lookup tables from one GEMM of each kind). The profile's GEMM tables and the planner's
# interference fit come from them and their scenarios only; the planner is judged on the rest.
REFERENCE_GEMMS = ("mb1", "dec1")


def profile_from_study(doc: dict) -> HardwareProfile:
    """Condense a measured, derived study document into a profile."""
    from .planner.fit import fit_interference

    if doc.get("kind") != "measured":
        raise ProfileError("a profile must come from a measured study, not a prediction")
    peaks, world = doc["peaks"], doc["machine"]["world"]
    tags = {s["gemm"]["tag"] for s in doc["scenarios"]}
    refs = [t for t in REFERENCE_GEMMS if t in tags] or sorted(tags)
    ref_scenarios = [s for s in doc["scenarios"] if s["gemm"]["tag"] in refs]
    eff: dict = {}
    for s in ref_scenarios:
        cls = s.get("gemm_class")
        if cls == "compute-bound":
            eff.setdefault(cls, []).append(s["gemm_flops_per_s"] / peaks["bf16_flops"])
        elif cls == "memory-bound":
            eff.setdefault(cls, []).append(s["gemm_hbm_bytes_per_s"] / peaks["hbm_bytes_per_s"])
    colls = {impl: {c: {"latency_s": f["latency_s"], "bus_bytes_per_s": f["bytes_per_s"] * (world - 1) / world}
                    for c, f in per.items()} for impl, per in peaks.get("collective_fits", {}).items()}
    # torch_lc has no size sweep: its bandwidth from the scenarios' isolated times.
    lc = [s["size"] * (world - 1) / world / (s["t_comm"]["torch_lc"]["median"] / 1e3)
          for s in doc["scenarios"] if "torch_lc" in s["t_comm"]]
    if lc:
        colls["torch_lc"] = {"all_gather": {"latency_s": 0.0, "bus_bytes_per_s": statistics.median(lc)}}
    sweep: dict = {}
    for r in sorted(doc["coll_sizes"], key=lambda r: r["size"]):
        sweep.setdefault(r["impl"], {}).setdefault(r["collective"], []).append([r["size"], r["time_ms"]["median"] / 1e3])
    gemm_cls = {s["gemm"]["tag"]: s.get("gemm_class") for s in ref_scenarios}
    loss: dict = {}
    for r in doc["gemm_sm_loss"]:
        cls = gemm_cls.get(r["gemm"])
        if cls and r.get("slowdown"):
            loss.setdefault(cls, {}).setdefault(r["sms_taken"], []).append(r["slowdown"])
    cta: dict = {}
    for r in doc["coll_ctas"]:
        if r["impl"] == "nccl" and r["ctas"] is not None and r.get("slowdown"):
            band = "latency-bound" if r["size"] <= 32 << 20 else "bandwidth-bound"
            cta.setdefault(r["collective"], {}).setdefault(band, {})[r["ctas"]] = r["slowdown"]
    overlap: dict = {}
    for s in doc["scenarios"]:
        for name, st in s.get("strategies", {}).items():
            o = overlap.setdefault(name, {}).setdefault(s["collective"], {})
            o.setdefault(s["taxonomy"], []).append(st["pct_ideal"])
            o.setdefault("all", []).append(st["pct_ideal"])
    m = doc["meta"]
    prof = HardwareProfile(
        device=doc["machine"]["device"], world=world, sm_count=doc["machine"]["sm_count"],
        memory_bytes=doc["machine"]["memory_bytes"], bf16_flops=peaks["bf16_flops"],
        hbm_bytes_per_s=peaks["hbm_bytes_per_s"], nvlink_bytes_per_s=peaks.get("nvlink_bytes_per_s", 0.0),
        gemm_efficiency={c: statistics.median(v) for c, v in eff.items()}, collectives=colls,
        gemm_sm_loss={c: {k: statistics.median(v) for k, v in sorted(t.items())} for c, t in loss.items()},
        coll_cta_loss=cta,
        overlap={n: {c: {t: statistics.fmean(v) for t, v in per.items()} for c, per in cs.items()}
                 for n, cs in overlap.items()},
        comm_sweep=sweep,
        source={"date": m.get("date"), "commit": m.get("commit"), "machine_kind": m.get("machine_kind"),
                "torch": m.get("torch"), "nccl": m.get("nccl"), "scenarios": len(doc["scenarios"]),
                "reference_gemms": refs, "fit_scenarios": [s["id"] for s in ref_scenarios]},
    )
    return replace(prof, interference=fit_interference(prof, ref_scenarios))
