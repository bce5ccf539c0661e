"""The test tiers themselves (tests/conftest.py, tests/gpu/conftest.py, pyproject's pytest
settings): multiproc first, then unit, then the other CPU tiers, the GPU tier last, whatever
order the paths are given in (the multi-process tier forks, and a test elsewhere may initialise
CUDA in the pytest process); nothing asks the CUDA runtime while collecting; the CPU tiers see
no GPU; every process computes on one thread; a bare ``pytest -q`` collects the quick tiers only; a long case is skipped saying how
to run it, and ``--long`` runs only those; a run that only reaches tests/gpu runs its short part
and says how to run the rest; a run that names it, or --gpu-all, runs all of it; a GPU test
needs the GPUs its ``gpus(n)`` marker says (2 unmarked); a run that leaves a shared-memory
segment of its own fails."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import re
import sys
from types import SimpleNamespace

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def _pytest(*args, files: dict | None = None, tmp: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    """pytest in a subprocess from the repository root (``files``: test files to write first
    under ``tmp``, a copy of tests/conftest.py beside them)."""
    if files:
        (tmp / "conftest.py").write_text((TESTS / "conftest.py").read_text())
        (tmp / "pytest.ini").write_text("[pytest]\nmarkers =\n    long: a long case\n")
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, cwd=tmp if files else ROOT, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))


def test_cpu_tiers_run_first_see_no_gpu_compute_on_one_thread_and_torch_counts_gpus_by_nvml_here():
    import torch

    assert os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"  # torch.cuda.is_available() asks NVML
    assert not torch.cuda.is_available() and torch.cuda.device_count() == 0
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])  # 1 unless set: ranks share the cores
    paths = ["tests/gpu/test_gpu_fsdp.py", "tests/cli/test_python_m_conccl.py", "tests/multiproc/test_fsdp_fallback.py",
             "tests/unit/test_lazy_import.py"]
    done = _pytest("--collect-only", *paths)
    tiers = [line.split("/")[1] for line in done.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    assert tiers and tiers == sorted(tiers, key=["multiproc", "unit", "cli", "gpu"].index), done.stdout + done.stderr
    assert set(tiers) == {"unit", "multiproc", "cli", "gpu"}


def test_a_bare_pytest_collects_the_quick_tiers():
    text = (ROOT / "pyproject.toml").read_text()
    testpaths = re.search(r"^testpaths = \[(.*)\]$", text, re.M).group(1)
    assert set(re.findall(r'"([^"]+)"', testpaths)) == {"tests/multiproc", "tests/unit", "tests/rig", "tests/gpu"}
    # tests/cli and the long cases have their own commands; a new tier is placed in one of the two
    assert {t.name for t in TESTS.iterdir() if t.is_dir() and any(t.glob("test_*.py"))} == \
        {"multiproc", "unit", "rig", "gpu", "cli"}
    assert re.search(r'^  "long: ', text, re.M) and re.search(r'^  "gpus\(n\): ', text, re.M)


LONG_CASES = '''
import pytest

def test_quick():
    pass

@pytest.mark.long
def test_long():
    pass

@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.long)])
def test_cases(n):
    pass
'''


def test_a_long_case_is_skipped_saying_how_to_run_it_and_long_runs_only_those(tmp_path):
    quick = _pytest("-rs", "test_x.py", files={"test_x.py": LONG_CASES}, tmp=tmp_path)
    assert quick.returncode == 0 and "2 passed, 2 skipped" in quick.stdout, quick.stdout
    assert "in the long tier only: PYTHONPATH=src python3 -m pytest -q --long tests" in quick.stdout
    long = _pytest("--long", "-rA", "test_x.py", files={"test_x.py": LONG_CASES}, tmp=tmp_path)
    assert long.returncode == 0 and "2 passed, 2 deselected" in long.stdout, long.stdout
    assert "PASSED test_x.py::test_long" in long.stdout and "PASSED test_x.py::test_cases[2]" in long.stdout


LEAKS = '''
import os
from conccl.device import shm

def test_leaks():
    shm.create(f"conccl_tierstest_{os.getpid()}_left", 8).close()

def test_unlinks():
    seg = shm.create(f"conccl_tierstest_{os.getpid()}_gone", 8)
    seg.close()
    shm.unlink(seg)

def test_after():
    pass
'''


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="segments are files under /dev/shm on Linux only")
def test_a_run_that_leaves_a_segment_of_its_own_fails_naming_it_and_its_test(tmp_path):
    from conccl.device import shm

    done = _pytest("test_leak.py", files={"test_leak.py": LEAKS}, tmp=tmp_path)
    assert done.returncode == 1 and "3 passed" in done.stdout, done.stdout
    named = [ln.split() for ln in done.stdout.splitlines() if "conccl_tierstest_" in ln]
    assert len(named) == 1 and named[0][0].endswith("_left"), done.stdout  # the unlinked one is not named
    assert " ".join(named[0][1:]) == "(there since test_leak.py::test_leaks)", done.stdout
    seg = shm.attach(named[0][0])  # reported, not removed: unlinking is the launch's work
    seg.close()
    shm.unlink(seg)


@pytest.fixture
def gpu_conftest(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_tier_conftest", TESTS / "gpu" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ONE_GPU = "test_spin_wait.py::test_the_abort_word_releases_it"


def _tier(gpu_conftest, found: int, args=(), gpu_all=False) -> dict:
    """What tests/gpu/conftest.py marks to skip on a machine of ``found`` GPUs, the command line
    ``args`` (a bare ``pytest -q``: none; pyproject's testpaths then in config.args): {test: reason}."""
    import pytest as _pytest_module

    gpu_conftest.gpus = lambda: found
    config = SimpleNamespace(args=list(args) or ["tests/multiproc", "tests/unit", "tests/rig", "tests/gpu"],
                             invocation_params=SimpleNamespace(dir=ROOT, args=tuple(args)),
                             getoption=lambda name: gpu_all if name == "--gpu-all" else None)
    names = sorted(gpu_conftest.SHORT) + ["test_gpu_study.py::test_quick_study", "test_gpu_fsdp.py::test_fsdp",
                                          ONE_GPU]
    items = [SimpleNamespace(fspath=TESTS / "gpu" / name.split("::")[0], nodeid=f"tests/gpu/{name}", marks=[])
             for name in names]
    items.append(SimpleNamespace(fspath=TESTS / "unit" / "test_plans.py", nodeid="tests/unit/test_plans.py::t", marks=[]))
    for item in items:
        item.add_marker = item.marks.append
        item.get_closest_marker = lambda name, item=item: next((m for m in item.marks if m.name == name), None)
    items[names.index(ONE_GPU)].marks.append(_pytest_module.mark.gpus(1).mark)
    gpu_conftest.pytest_collection_modifyitems(config, items)
    assert not items[-1].marks  # another tier's test is left alone
    assert all(any(m.name == "gpu" for m in item.marks) for item in items[:-1])
    return {item.nodeid: m.kwargs["reason"] for item in items for m in item.marks if m.name == "skip"}


def test_a_run_that_reaches_the_gpu_tier_runs_its_short_part_and_says_how_to_run_the_rest(gpu_conftest):
    for args in ((), ("tests",), ("-q", "-k", "gpu")):
        skipped = _tier(gpu_conftest, 2, args=args)
        assert sorted(skipped) == ["tests/gpu/test_gpu_fsdp.py::test_fsdp", "tests/gpu/test_gpu_study.py::test_quick_study",
                                   f"tests/gpu/{ONE_GPU}"], args
        assert all("python3 -m pytest -q tests/gpu" in why and "--gpu-all" in why for why in skipped.values())


def test_a_run_that_names_the_gpu_tier_or_asks_for_all_of_it_runs_all_of_it(gpu_conftest):
    assert _tier(gpu_conftest, 2, args=["tests/gpu"]) == {}
    assert _tier(gpu_conftest, 2, args=["tests/gpu/test_gpu_study.py::test_quick_study"]) == {}
    assert _tier(gpu_conftest, 2, gpu_all=True) == {}


def test_a_gpu_test_needs_the_gpus_its_marker_says_and_two_unmarked(gpu_conftest):
    for found, args in ((0, ["tests"]), (0, ["tests/gpu"]), (1, ["tests/gpu"])):
        skipped = _tier(gpu_conftest, found, args=args)
        want = {f"tests/gpu/{name}" for name in gpu_conftest.SHORT} | {"tests/gpu/test_gpu_study.py::test_quick_study",
                                                                        "tests/gpu/test_gpu_fsdp.py::test_fsdp"}
        if found == 0:
            want.add(f"tests/gpu/{ONE_GPU}")
            assert skipped[f"tests/gpu/{ONE_GPU}"] == "needs CUDA and at least 1 GPU (0 visible)"
        assert set(skipped) == want, (found, args)
        assert {why for test, why in skipped.items() if not test.endswith(ONE_GPU)} == \
            {f"needs CUDA and at least 2 GPUs ({found} visible)"}
