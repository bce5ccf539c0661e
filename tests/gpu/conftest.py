"""The GPU tier: every test here is marked ``gpu`` and is skipped without CUDA or with fewer
GPUs than it needs: ``@pytest.mark.gpus(n)`` on a test (or ``pytestmark`` of its module) says
``n``; unmarked, 2 (a test that starts one process per GPU and needs peers). The kernel tests
that run in one process on one GPU are marked ``gpus(1)`` and run on a machine of one GPU:
``PYTHONPATH=src python3 -m pytest -q tests/gpu`` there runs them and skips the rest.

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
    """Whether the command line names this tier or something in it (not only a folder above; not
    pyproject's testpaths, which a bare ``pytest -q`` runs)."""
    return names(config.invocation_params.args, config.invocation_params.dir, HERE)


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if HERE in pathlib.Path(str(item.fspath)).parents]
    if not mine:
        return
    found = gpus()
    short = not (config.getoption("--gpu-all") or named(config))
    not_short = pytest.mark.skip(reason=f"in the full GPU tier only: {GPU_ALL} (or add --gpu-all)")
    for item in mine:
        item.add_marker(pytest.mark.gpu)
        needs = needed(item)
        if found < needs:
            item.add_marker(pytest.mark.skip(reason=f"needs CUDA and at least {needs} GPU{'s' * (needs > 1)} "
                                                    f"({found} visible)"))
        elif short and item.nodeid.split("/")[-1] not in SHORT:
            item.add_marker(not_short)


def needed(item) -> int:
    """The GPUs a test needs: its ``gpus(n)`` marker's ``n`` (the closest: a test's own before
    its module's), else 2."""
    mark = item.get_closest_marker("gpus")
    return int(mark.args[0]) if mark is not None else 2
