"""The test tiers themselves (tests/conftest.py, tests/gpu/conftest.py): multiproc first, then
unit, the GPU tier last, whatever order the paths are given in (the multi-process tier forks,
and a test elsewhere may initialise CUDA in the pytest process); nothing asks the CUDA runtime
while collecting; the CPU tiers see no GPU; a run that only reaches tests/gpu runs its short
part and says how to run the rest; a run that names it, or --gpu-all, runs all of it."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def test_cpu_tiers_run_first_see_no_gpu_and_torch_counts_gpus_by_nvml_here():
    import torch

    assert os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"  # torch.cuda.is_available() asks NVML
    assert not torch.cuda.is_available() and torch.cuda.device_count() == 0
    paths = ["tests/gpu/test_gpu_fsdp.py", "tests/multiproc/test_fsdp_fallback.py", "tests/unit/test_short_names.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    tiers = [line.split("/")[1] for line in done.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    assert tiers and tiers == sorted(tiers, key=["multiproc", "unit", "gpu"].index), done.stdout + done.stderr
    assert set(tiers) == {"unit", "multiproc", "gpu"}


@pytest.fixture
def gpu_conftest(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_tier_conftest", TESTS / "gpu" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tier(gpu_conftest, found: int, args=("tests",), gpu_all=False) -> dict:
    """What tests/gpu/conftest.py marks to skip on a machine of ``found`` GPUs: {test: reason}."""
    gpu_conftest.gpus = lambda: found
    config = SimpleNamespace(args=list(args), invocation_params=SimpleNamespace(dir=ROOT),
                             getoption=lambda name: gpu_all if name == "--gpu-all" else None)
    names = sorted(gpu_conftest.SHORT) + ["test_gpu_study.py::test_quick_study", "test_gpu_fsdp.py::test_fsdp"]
    items = [SimpleNamespace(fspath=TESTS / "gpu" / name.split("::")[0], nodeid=f"tests/gpu/{name}", marks=[])
             for name in names]
    items.append(SimpleNamespace(fspath=TESTS / "unit" / "test_plans.py", nodeid="tests/unit/test_plans.py::t", marks=[]))
    for item in items:
        item.add_marker = item.marks.append
    gpu_conftest.pytest_collection_modifyitems(config, items)
    assert not items[-1].marks  # another tier's test is left alone
    assert all(any(m.name == "gpu" for m in item.marks) for item in items[:-1])
    return {item.nodeid: m.kwargs["reason"] for item in items for m in item.marks if m.name == "skip"}


def test_a_run_that_reaches_the_gpu_tier_runs_its_short_part_and_says_how_to_run_the_rest(gpu_conftest):
    skipped = _tier(gpu_conftest, 2)
    assert sorted(skipped) == ["tests/gpu/test_gpu_fsdp.py::test_fsdp", "tests/gpu/test_gpu_study.py::test_quick_study"]
    assert all("python3 -m pytest -q tests/gpu" in why and "--gpu-all" in why for why in skipped.values())


def test_a_run_that_names_the_gpu_tier_or_asks_for_all_of_it_runs_all_of_it(gpu_conftest):
    assert _tier(gpu_conftest, 2, args=["tests/gpu"]) == {}
    assert _tier(gpu_conftest, 2, args=["tests/gpu/test_gpu_study.py::test_quick_study"]) == {}
    assert _tier(gpu_conftest, 2, gpu_all=True) == {}


def test_without_two_gpus_every_gpu_test_is_skipped_saying_so(gpu_conftest):
    for found, args in ((0, ["tests"]), (1, ["tests/gpu"])):
        skipped = _tier(gpu_conftest, found, args=args)
        assert len(skipped) == len(gpu_conftest.SHORT) + 2
        assert set(skipped.values()) == {f"needs CUDA and at least 2 GPUs ({found} visible)"}
