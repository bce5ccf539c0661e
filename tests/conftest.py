"""The tiers in one pytest process: tests/multiproc (CPU, several processes), tests/unit (no
device), every other tier (tests/cli, tests/rig), then tests/gpu (one process per GPU) last,
whatever order the paths are given in.

Why that order: the multi-process tier forks its ranks (:func:`conccl.testing.spawn`), and a
process that has initialised CUDA cannot fork safely (the child inherits a CUDA runtime it
cannot use: it fails or hangs; conccl.testing refuses it). So it runs first, before anything
else has run in this process; the GPU tier, which may initialise CUDA here, runs last. For the
same reason nothing in collection asks the CUDA runtime: ``PYTORCH_NVML_BASED_CUDA_CHECK=1``
makes ``torch.cuda.is_available()`` count the GPUs by NVML (its default, ``cudaGetDeviceCount``,
initialises the driver and marks every later fork bad), and tests/gpu/conftest.py counts them
in a subprocess.

The CPU tiers (multiproc, unit, cli) run as on a machine without GPUs whatever this one has:
``torch.cuda.is_available()`` is False and ``torch.cuda.device_count()`` 0 in their tests (a
test that wants GPUs pretends them with monkeypatch, as several do), so that they test on a GPU
machine what CI tests.

Every process of the run (this one, the ranks, the subprocesses) computes on one thread
(``OMP_NUM_THREADS=1`` unless set): the ranks of a test share the machine's cores.

The long tier is a marker, not a folder: a test or a parametrized case marked ``long`` (a long
fuzz or soak) is skipped, saying how to run it, unless ``--long`` is given; with ``--long``
only the long ones run (``python3 -m pytest -q --long tests``). A marker keeps a long case
beside the quick cases of its test, with their helpers and fixtures, where a folder would split
those files in two.

Shared memory: every segment conccl makes is named ``conccl_...``; those of this run's launches
(:func:`conccl.testing.spawn` and ``spawn_hosts`` name them ``conccl_<this pid>_...``, and the
tests that make a board themselves put this pid in its name) must be gone when the run ends,
killed ranks' included: a run that leaves one fails, naming it and the test after which it
first was there.

``--gpu-all`` runs the whole GPU tier where it is not named (tests/gpu/conftest.py: a run that
reaches it from a folder above, as ``pytest -q tests`` does, runs a short part of it).
"""
from __future__ import annotations

import os
import pathlib
import re
import sys

import pytest

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
# One intra-op thread per process (before torch is imported here; every rank and subprocess
# inherits it): the ranks of a test share the machine's cores, and with torch's default (a
# thread per core in every rank) 4 ranks on 2 cores trained ~3x slower, spinning on each other.
os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = pathlib.Path(__file__).parent
ORDER = {"multiproc": 0, "unit": 1, "gpu": 3}  # any other tier: 2
CPU_TIERS = ("multiproc", "unit", "cli")
LONG_COMMAND = "PYTHONPATH=src python3 -m pytest -q --long tests"
SHM_DIR = pathlib.Path("/dev/shm")  # where Linux keeps POSIX shared memory segments (conccl.device.shm)


def pytest_addoption(parser):
    parser.addoption("--gpu-all", action="store_true",
                     help="run every test of tests/gpu, also where the command line does not name it (then by "
                          "default a short part runs; the rest are skipped)")
    parser.addoption("--long", action="store_true",
                     help="run the long tier: only the tests marked long (long fuzz and soak cases; skipped "
                          "otherwise)")


def tier(item) -> str:
    """The tier (first folder under tests/) of a collected test; '' for one outside them."""
    try:
        parts = pathlib.Path(str(item.fspath)).relative_to(HERE).parts
    except ValueError:
        return ""
    return parts[0] if len(parts) > 1 else ""


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: ORDER.get(tier(item), 2))  # stable: each tier keeps its order
    if config.getoption("--long"):
        keep = [item for item in items if item.get_closest_marker("long")]
        if len(keep) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if not item.get_closest_marker("long")])
            items[:] = keep
        return
    skip = pytest.mark.skip(reason=f"in the long tier only: {LONG_COMMAND}")
    for item in items:
        if item.get_closest_marker("long"):
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def _cpu_tiers_see_no_gpu(request):
    # module-wide, before the module's own fixtures, and apart from the tests' monkeypatch
    # (a test's monkeypatch.undo() leaves it in place)
    torch = sys.modules.get("torch")
    if torch is None or tier(request.node) not in CPU_TIERS:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        patch.setattr(torch.cuda, "device_count", lambda: 0)
        yield


_first_cuda: list = []  # the test after which this process first had CUDA initialised
_MINE = re.compile(rf"^conccl.*_{os.getpid()}(_|$)")  # a conccl segment named after this process
_left: dict = {}  # segment of this run still there -> the test after which it first was
_LEFT = pytest.StashKey[dict]()  # what the run left, for the summary


def segments_of_this_run() -> set:
    """The conccl shared-memory segments named after this process, now; empty where segments
    are no files under /dev/shm."""
    try:
        return {name for name in os.listdir(SHM_DIR) if _MINE.match(name)}
    except OSError:
        return set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    torch = sys.modules.get("torch")  # never imported here for this
    if not _first_cuda and torch is not None and torch.cuda.is_initialized():
        _first_cuda.append((item.nodeid, tier(item)))
    now = segments_of_this_run()
    for name in set(_left) - now:
        del _left[name]
    for name in now - set(_left):
        _left[name] = item.nodeid


def pytest_sessionfinish(session):
    left = {name: _left.get(name, "the collection") for name in sorted(segments_of_this_run())}
    if left:
        session.config.stash[_LEFT] = left
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _first_cuda and _first_cuda[0][1] in CPU_TIERS:
        terminalreporter.write_line(f"warning: {_first_cuda[0][0]} initialised CUDA in the pytest process; a test "
                                    "of the CPU tiers must not", yellow=True)
    left = terminalreporter.config.stash.get(_LEFT, {})
    if left:
        terminalreporter.write_line(f"FAILED: {len(left)} shared-memory segment(s) of this run left in {SHM_DIR} "
                                    "(a launch that does not unlink what its ranks made):", red=True)
        for name, after in left.items():
            terminalreporter.write_line(f"  {name}  (there since {after})", red=True)
