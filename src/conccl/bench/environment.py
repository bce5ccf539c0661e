"""What a benchmark or study record says about where it ran: machine, versions, date, commit."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import os
import platform
import subprocess

import torch

from .. import env


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def _commit() -> str:
    # CONCCL_COMMIT first: a checkout copied to a GPU machine may carry no .git.
    commit = env.get("CONCCL_COMMIT")
    if commit:
        return commit
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except Exception:  # noqa: BLE001 - no git, not a checkout: the record says so
        return "unknown"


def environment(machine_kind: str, world: int) -> dict:
    """Machine, versions, date and commit for a benchmark record (the ``meta`` of its JSON)."""
    cuda = torch.cuda.is_available()
    return {
        "machine_kind": machine_kind, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(), "host": platform.node(), "world": world,
        "device": torch.cuda.get_device_name(0) if cuda else None,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "cuda_python": _version("cuda-python") or _version("cuda-bindings"), "conccl": _version("conccl") or "checkout",
        "python": platform.python_version(),
    }
