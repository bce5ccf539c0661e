"""The test tiers' plumbing seen in-process (pyproject's pytest settings, tests/gpu/conftest.py):
a bare ``pytest -q`` collects the quick tiers only, and every test folder is one of the tiers; a
run that only reaches tests/gpu runs its short part and says how to run the rest; a run that
names it, or --gpu-all, runs all of it; a GPU test needs the GPUs its ``gpus(n)`` marker says (2
unmarked). The same plumbing in pytest runs of their own (order, the long tier, shared memory
left behind): tests/cli/test_test_commands.py."""
from __future__ import annotations

import importlib.util
import pathlib
import re
from types import SimpleNamespace

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def test_a_bare_pytest_collects_the_quick_tiers():
    text = (ROOT / "pyproject.toml").read_text()
    testpaths = re.search(r"^testpaths = \[(.*)\]$", text, re.M).group(1)
    assert set(re.findall(r'"([^"]+)"', testpaths)) == {"tests/multiproc", "tests/unit", "tests/rig", "tests/gpu"}
    # tests/cli and the long cases have their own commands; a new tier is placed in one of the two
    assert {t.name for t in TESTS.iterdir() if t.is_dir() and any(t.glob("test_*.py"))} == \
        {"multiproc", "unit", "rig", "gpu", "cli"}
    assert re.search(r'^  "long: ', text, re.M) and re.search(r'^  "gpus\(n\): ', text, re.M)


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
