"""The GPU tier: every test here is marked ``gpu``, starts one process per GPU and is skipped
without CUDA or with fewer than 2 GPUs.

In a run that reaches this tier without naming it (``pytest -q``, the README's test command)
only :data:`SHORT` runs: the copy-engine collectives against NCCL bit for bit, the profiler
showing that they launch no kernel, and the all-reduce running only its reduction kernel
(about a minute on 2 GPUs); the rest is skipped with a reason that says how to run it. A run
that names tests/gpu or a file in it runs everything it names; ``--gpu-all`` (an option of
tests/conftest.py) runs the whole tier in any run.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from cmdline import names

HERE = pathlib.Path(__file__).parent
GPU_ALL = "PYTHONPATH=src python3 -m pytest -q tests/gpu"
SHORT = {
    "test_cuda_collectives.py::test_bitwise_equal_to_nccl",
    "test_cuda_collectives.py::test_profiler_shows_no_kernel",
    "test_gpu_all_reduce.py::test_all_reduce_equals_nccl_and_runs_only_the_reduction_kernel",
}


def gpus() -> int:
    """GPUs visible, counted in a subprocess: this process forks the CPU tiers' ranks later and
    must not have asked the CUDA runtime anything (tests/conftest.py)."""
    try:
        import torch
    except ImportError:
        return 0
    if torch.version.cuda is None:  # a CPU build: no GPU to count
        return 0
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        return int(done.stdout.split()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return 0


def named(config) -> bool:
    """Whether the command line names this tier or something in it (not only a folder above)."""
    return names(config.args, config.invocation_params.dir, HERE)


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if HERE in pathlib.Path(str(item.fspath)).parents]
    if not mine:
        return
    found = gpus()
    no_gpus = pytest.mark.skip(reason=f"needs CUDA and at least 2 GPUs ({found} visible)") if found < 2 else None
    short = not (config.getoption("--gpu-all") or named(config))
    not_short = pytest.mark.skip(reason=f"in the full GPU tier only: {GPU_ALL} (or add --gpu-all)")
    for item in mine:
        item.add_marker(pytest.mark.gpu)
        if no_gpus:
            item.add_marker(no_gpus)
        elif short and item.nodeid.split("/")[-1] not in SHORT:
            item.add_marker(not_short)
