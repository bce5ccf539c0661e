"""Which hardware profile a GPU plans with when the user names none.

conccl ships measured profiles (``conccl/data/*_profile.json``: an H200 x4 and an H100 x2 node)
and chooses among them by the GPU's name, the group's size and the GPU's active NVLinks, so
that ``overlap(plan="auto")``, ``set_eager_path("auto")`` and ``conccl.tp``'s ``auto`` work on
the GPUs users have with no study first. The rules (:func:`choose`), in order:

1. A profile named by path (the ``profile=`` argument, else ``$CONCCL_PROFILE``) is used, and
   refused (ProfileError) if it was measured on another GPU model: never a silent mix-up.
2. No GPU (``device_name`` None: the CPU prediction, ``conccl plan``): the H200 x4 profile,
   labelled a prediction wherever it is shown.
3. Shipped profiles of this GPU model (the exact CUDA device name: an H100 SXM, PCIe and NVL
   differ) whose NVLink count matches where both are known: the one measured at the world
   nearest this group's (ties: the larger).
4. None matches: the fallback, documented and logged with one warning per process: the H100
   x2 profile (else the first shipped) relabelled for this GPU, so every rule of the planner
   still holds (all its strategies are correct anywhere; only their speed was measured
   elsewhere). The warning says how to make a measured profile here.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import warnings

from .. import env
from .profile import EMBEDDED, HardwareProfile, load_profile

DATA = EMBEDDED.parent
ENV = "CONCCL_PROFILE"
FALLBACK_DEVICE = "NVIDIA H100 80GB HBM3"  # the GPU most users have: the least surprising borrow

_log = logging.getLogger("conccl")


class ProfileFallbackWarning(UserWarning):
    """No shipped hardware profile matches this GPU: the planner borrows another GPU's."""


@dataclasses.dataclass(frozen=True)
class Choice:
    profile: HardwareProfile
    path: str  # the file the numbers come from
    how: str  # "given" (a path), "default" (no GPU), "shipped" (matched) or "fallback" (borrowed)
    note: str  # one line: what was chosen, and why

    def identity(self) -> str:
        """What every rank of a group must agree on: how it was chosen and the profile's content
        (the same file at another path, or a copy per node, is the same profile)."""
        digest = hashlib.sha256(self.profile.to_json().encode()).hexdigest()[:16]
        return f"{self.how} {self.profile.device} x{self.profile.world} {digest}"


@functools.lru_cache(maxsize=1)
def shipped() -> tuple[tuple[str, HardwareProfile], ...]:
    """(file name, profile) of every profile shipped with conccl."""
    return tuple((p.name, load_profile(p)) for p in sorted(DATA.glob("*_profile.json")))


def _links_match(prof: HardwareProfile, nvlinks: int | None) -> bool:
    return not (prof.nvlinks and nvlinks) or prof.nvlinks == nvlinks


def choose(device_name: str | None, world: int | None, path=None, nvlinks: int | None = None) -> Choice:
    """The profile to plan with (rules in the module's docstring); ``world`` None: any."""
    path = path or env.get(ENV) or None
    if path:
        return _given(str(path), device_name)
    return _chosen(device_name, world, nvlinks)


@functools.lru_cache(maxsize=64)
def _given(path: str, device_name: str | None) -> Choice:
    prof = load_profile(path)
    if device_name:
        prof.check_device(device_name)
    return Choice(prof, path, "given", f"hardware profile {path} ({prof.device} x{prof.world}), as given")


@functools.lru_cache(maxsize=64)
def _chosen(device_name: str | None, world: int | None, nvlinks: int | None) -> Choice:
    if not device_name:
        prof = dict(shipped()).get(EMBEDDED.name) or load_profile(EMBEDDED)
        return Choice(prof, EMBEDDED.name, "default",
                      f"no GPU: the shipped {prof.device} x{prof.world} profile ({EMBEDDED.name})")
    same = [(n, p) for n, p in shipped() if p.device == device_name and _links_match(p, nvlinks)]
    if same:
        name, prof = min(same, key=lambda np_: (abs(np_[1].world - world) if world else 0, -np_[1].world))
        at = "" if not world or prof.world == world else f"; measured at {prof.world} GPUs, this group has {world}"
        choice = Choice(prof, name, "shipped", f"hardware profile: shipped {name} ({prof.device} x{prof.world}{at})")
        _log.info("conccl: %s", choice.note)
        return choice
    pool = dict(shipped())
    name = next((n for n, p in pool.items() if p.device == FALLBACK_DEVICE), next(iter(pool)))
    borrowed = pool[name]
    prof = dataclasses.replace(borrowed, device=device_name, nvlinks=0,
                               source={**borrowed.source, "borrowed_from": borrowed.device})
    links = f" with {nvlinks} NVLinks" if nvlinks else ""
    note = (f"no shipped hardware profile matches {device_name!r}{links} at {world or '?'} GPUs; planning with "
            f"the shipped {borrowed.device} x{borrowed.world} profile ({name}), whose speeds may not hold here. "
            "For a measured one: `conccl study --out DIR` on this node, then pass profile='DIR/profile.json' "
            f"(or set {ENV}=DIR/profile.json)")
    warnings.warn(note, ProfileFallbackWarning, stacklevel=3)  # once: the choice is memoised
    _log.info("conccl: %s", note)
    return Choice(prof, name, "fallback", note)


def forget() -> None:
    """Drop the memoised choices and files (a test that edits them, ``runtime.clear_plan_cache``)."""
    for f in (shipped, _given, _chosen):
        f.cache_clear()


@functools.lru_cache(maxsize=16)
def local_nvlinks(device_index: int = 0) -> int | None:
    """Active NVLinks of CUDA device ``device_index`` by NVML (nvidia-ml-py, found by its PCI bus
    id), None where NVML cannot say (no NVML, a CPU machine, a virtual GPU)."""
    try:
        import pynvml  # noqa: PLC0415 - optional: present on the GPU machines, not on CPU CI
        import torch  # noqa: PLC0415 - the planner itself needs no torch

        props = torch.cuda.get_device_properties(device_index)
        bus = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
            active = 0
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    active += pynvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED
                except pynvml.NVMLError:
                    break
            return active
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML, no such call, no such field: unknown
        return None
