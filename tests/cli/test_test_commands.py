"""The test commands end to end, each a pytest run of its own (tests/conftest.py): the tiers run
multiproc first, then unit, then the other CPU tiers, the GPU tier last, whatever order the
paths are given in (the multi-process tier forks, and a test elsewhere may initialise CUDA in
the pytest process); nothing asks the CUDA runtime while collecting; the CPU tiers see no GPU;
every process computes on one thread; a long case is skipped saying how to run it, and
``--long`` runs only those; a run that leaves a shared-memory segment of its own fails, naming
it and the test after which it appeared. The plumbing seen in-process: tests/unit/test_tiers.py."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

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
             "tests/unit/test_board_post.py"]
    done = _pytest("--collect-only", *paths)
    tiers = [line.split("/")[1] for line in done.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    assert tiers and tiers == sorted(tiers, key=["multiproc", "unit", "cli", "gpu"].index), done.stdout + done.stderr
    assert set(tiers) == {"unit", "multiproc", "cli", "gpu"}


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
