"""The README's set-up line (scripts/setup_env.py): the CPU build of PyTorch from PyTorch's CPU
index only where there is no PyTorch and no GPU; an installed PyTorch never replaced. And the
README's commands in the order a newcomer runs them, the test command the first CI runs."""
from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def setup_env():
    spec = importlib.util.spec_from_file_location("setup_env", ROOT / "scripts" / "setup_env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake(monkeypatch, mod, installed: set, gpu: bool):
    real = importlib.util.find_spec
    monkeypatch.setattr(mod.importlib.util, "find_spec",
                        lambda name, *a: (real(name, *a) if name in installed else None))
    monkeypatch.setattr(mod, "gpu_present", lambda: gpu)


def _torch_cmds(cmds):
    return [c for c in cmds if "torch" in c]


def test_no_torch_no_gpu_gets_the_cpu_build_from_the_cpu_index(setup_env, monkeypatch):
    _fake(monkeypatch, setup_env, {"numpy"}, gpu=False)
    cmds, notes = setup_env.commands()
    (torch_cmd,) = _torch_cmds(cmds)
    assert torch_cmd[-2:] == ["--index-url", "https://download.pytorch.org/whl/cpu"]
    assert ["matplotlib", "pytest", "pytest-timeout"] == [c for c in cmds[0] if c in setup_env.PACKAGES.values()]
    assert not any("-U" in c or "--upgrade" in c for c in cmds)


def test_an_installed_torch_is_never_replaced(setup_env, monkeypatch):
    for gpu in (True, False):
        _fake(monkeypatch, setup_env, {"torch", "numpy", "matplotlib", "pytest", "pytest_timeout"}, gpu=gpu)
        cmds, notes = setup_env.commands()
        assert cmds == [] and any("never replaced" in n for n in notes)


def test_a_gpu_machine_without_torch_gets_pypis_build(setup_env, monkeypatch):
    _fake(monkeypatch, setup_env, set(), gpu=True)
    (torch_cmd,) = _torch_cmds(setup_env.commands()[0])
    assert "--index-url" not in torch_cmd


def test_the_readme_commands_in_order_and_ci_runs_the_test_line():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Set-up on a fresh machine")[1].split("```bash")[1].split("```")[0]
    cmds = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    assert cmds[0] == "python3 scripts/setup_env.py"
    assert cmds[1].endswith("-m conccl study --out study")
    test_line = cmds[2]
    # CI runs the README's test line, then tests/cli's and the long tier's (tests/README.md)
    ci = [ln.split("#")[0].strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    runs = [ln.removesuffix("|| failed=1").strip() for ln in ci if ln.endswith("|| failed=1")]
    assert runs == [test_line, test_line + " tests/cli", test_line + " --long tests"], runs
    assert "../shared" not in readme  # a user's clone has no such folder
    assert re.search(r'"Optimizing ML Concurrent Computation and Communication with GPU DMA Engines"', readme)
