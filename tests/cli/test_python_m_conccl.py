"""``python -m conccl`` in a subprocess, as a user runs it: help and a plan exit 0 with what
they print, an unknown command exits 2 (the in-process checks of the same parser:
tests/unit/test_validation_cli.py)."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["plan", "--gemm", "4096x4096x4096", "--size", "64M"]])
def test_python_m_conccl_runs(argv):
    r = subprocess.run([sys.executable, "-m", "conccl", *argv], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert ("usage: conccl" in r.stdout) if "--help" in argv else ("predicted together" in r.stdout)


def test_python_m_conccl_argument_error_exits_2():
    r = subprocess.run([sys.executable, "-m", "conccl", "frobnicate"], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "invalid choice" in r.stderr
