"""Install what conccl's two commands need, with Python alone: ``python3 scripts/setup_env.py``.

- numpy, matplotlib, pytest, pytest-timeout: whichever is missing (nothing is upgraded).
- PyTorch only where none is installed. An installed PyTorch is used and never replaced (the GPU
  machines ship their own build, and a bare ``pip install torch`` would swap it). With an NVIDIA
  GPU, PyPI's build. Without one, the CPU build from PyTorch's CPU wheel index where that index
  answers within a few seconds (a bare ``torch`` from PyPI pulls gigabytes of CUDA libraries that
  a CPU machine cannot use); where it does not (PyPI alone), PyPI's build, saying so.
- cuda-python (the copy-engine executor's driver calls) where a GPU is present and it is missing.

One line says where PyTorch comes from and why. ``--dry-run`` prints the pip commands instead of
running them; ``--cpu-index URL`` names another CPU wheel index.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 3.0
PACKAGES = {"numpy": "numpy", "matplotlib": "matplotlib", "pytest": "pytest", "pytest_timeout": "pytest-timeout"}


def installed(module: str) -> bool:
    """``module`` (dotted names too) can be imported; nothing is imported but its parents."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing
        return False


def gpu_present() -> bool:
    """An NVIDIA GPU: the driver's device node, or one that ``nvidia-smi -L`` lists; imports nothing."""
    if os.path.exists("/dev/nvidia0"):
        return True
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GPU " in out


def index_answers(url: str = CPU_INDEX, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """(whether the wheel index at ``url`` answers an HTTP request within ``timeout`` seconds,
    what happened). The request runs in a thread given up on at the deadline: a socket timeout
    does not bound the name lookup."""
    result = [False, f"no answer within {timeout:g} s"]

    def ask():
        try:
            req = urllib.request.Request(url.rstrip("/") + "/torch/", method="HEAD")
            with urllib.request.urlopen(req, timeout=timeout) as r:
                result[:] = [r.status < 400, f"HTTP {r.status}"]
        except Exception as e:  # URLError, HTTPError, socket errors: the index cannot be used
            reason = getattr(e, "reason", None) or e
            result[:] = [False, " ".join(str(reason).split())[:120]]

    t0 = time.monotonic()
    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(timeout)
    ok, why = result if not worker.is_alive() else (False, f"no answer within {timeout:g} s")
    return ok, f"{why}, {time.monotonic() - t0:.1f} s"


def commands(cpu_index: str = CPU_INDEX) -> tuple[list[list[str]], list[str]]:
    """(pip commands to run, what was decided and why). Runs nothing but the probes
    (:func:`gpu_present`, and :func:`index_answers` only where PyTorch must be installed on a
    machine with no GPU)."""
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    cmds, notes = [], []
    missing = [pkg for mod, pkg in PACKAGES.items() if not installed(mod)]
    gpu = gpu_present()
    if gpu and not installed("cuda.bindings"):
        missing.append("cuda-python")
    if missing:
        cmds.append(pip + missing)
    notes.append(f"packages missing: {', '.join(missing) or 'none'}")
    if installed("torch"):
        notes.append("PyTorch is installed: kept as it is (never replaced)")
    elif gpu:
        cmds.append(pip + ["torch"])
        notes.append("no PyTorch, an NVIDIA GPU present: PyTorch from PyPI (its CUDA build)")
    else:
        ok, why = index_answers(cpu_index)
        if ok:
            cmds.append(pip + ["torch", "--index-url", cpu_index])
            notes.append(f"no PyTorch, no GPU: PyTorch's CPU build from {cpu_index} (it answered: {why})")
        else:
            cmds.append(pip + ["torch"])
            notes.append(f"no PyTorch, no GPU, PyTorch's CPU index {cpu_index} unreachable ({why}): "
                         "PyTorch from PyPI, whose build pulls CUDA libraries (several GB) this machine "
                         "cannot use; where that index can be reached, it is taken instead")
    return cmds, notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the pip commands, run nothing")
    ap.add_argument("--cpu-index", default=CPU_INDEX, metavar="URL",
                    help=f"PyTorch's CPU wheel index, asked first where there is no GPU (default {CPU_INDEX})")
    args = ap.parse_args(argv)
    cmds, notes = commands(args.cpu_index)
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
