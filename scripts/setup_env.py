"""Install what conccl's two commands need, with Python alone: ``python3 scripts/setup_env.py``.

- numpy, matplotlib, pytest, pytest-timeout: whichever is missing (nothing is upgraded).
- PyTorch only where none is installed. An installed PyTorch is used and never replaced (the GPU
  machines ship their own build, and a bare ``pip install torch`` would swap it). Where no
  NVIDIA GPU is present, the CPU build from PyTorch's CPU wheel index: a bare ``torch`` from PyPI
  pulls gigabytes of CUDA libraries that a CPU machine cannot use. With a GPU, PyPI's build.

``--dry-run`` prints the pip commands instead of running them.
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PACKAGES = {"numpy": "numpy", "matplotlib": "matplotlib", "pytest": "pytest", "pytest_timeout": "pytest-timeout"}


def gpu_present() -> bool:
    """An NVIDIA GPU the driver lists (``nvidia-smi -L``), without importing anything."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GPU " in out


def commands() -> tuple[list[list[str]], list[str]]:
    """(pip commands to run, what was decided and why)."""
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    cmds, notes = [], []
    missing = [pkg for mod, pkg in PACKAGES.items() if importlib.util.find_spec(mod) is None]
    if missing:
        cmds.append(pip + missing)
    notes.append(f"packages missing: {', '.join(missing) or 'none'}")
    if importlib.util.find_spec("torch") is not None:
        notes.append("PyTorch is installed: kept as it is (never replaced)")
    elif gpu_present():
        cmds.append(pip + ["torch"])
        notes.append("no PyTorch, an NVIDIA GPU present: PyTorch from PyPI (its CUDA build)")
    else:
        cmds.append(pip + ["torch", "--index-url", CPU_INDEX])
        notes.append(f"no PyTorch, no GPU: PyTorch's CPU build from {CPU_INDEX}")
    return cmds, notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the pip commands, run nothing")
    args = ap.parse_args(argv)
    cmds, notes = commands()
    for n in notes:
        print(f"setup: {n}")
    for c in cmds:
        print("setup: $ " + " ".join(c[2:] if c[0] == sys.executable else c), flush=True)
        if not args.dry_run and subprocess.run(c).returncode != 0:
            print("setup: pip failed; see its message above", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
