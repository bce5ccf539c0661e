"""The README's set-up line (scripts/setup_env.py): the CPU build of PyTorch from PyTorch's CPU
index only where there is no PyTorch and no GPU and that index answers (PyPI's build, said so,
where it does not, found out within seconds); cuda-python where a GPU is present; an installed
PyTorch never replaced. The pip commands are checked, never run. And the README's commands in the
order a newcomer runs them, the test command the first CI runs."""
from __future__ import annotations

import importlib.util
import pathlib
import re
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def setup_env():
    spec = importlib.util.spec_from_file_location("setup_env", ROOT / "scripts" / "setup_env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake(monkeypatch, mod, installed: set, gpu: bool, index_answers: bool = True):
    # a module "installed" here has a spec (any object), whether this machine has it or not
    monkeypatch.setattr(mod.importlib.util, "find_spec", lambda name, *a: (object() if name in installed else None))
    monkeypatch.setattr(mod, "gpu_present", lambda: gpu)
    asked = []

    def probe(url, timeout=mod.PROBE_TIMEOUT_S):
        asked.append(url)
        return index_answers, ("HTTP 200, 0.1 s" if index_answers else "Name or service not known, 0.0 s")

    monkeypatch.setattr(mod, "index_answers", probe)
    return asked


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
    everything = {"torch", "numpy", "matplotlib", "pytest", "pytest_timeout", "cuda.bindings"}
    for gpu in (True, False):
        for answers in (True, False):
            asked = _fake(monkeypatch, setup_env, everything, gpu=gpu, index_answers=answers)
            cmds, notes = setup_env.commands()
            assert cmds == [] and any("never replaced" in n for n in notes)
            assert asked == []  # nothing to fetch: the index is not even asked


def test_a_gpu_machine_without_torch_gets_pypis_build(setup_env, monkeypatch):
    asked = _fake(monkeypatch, setup_env, set(), gpu=True)
    (torch_cmd,) = _torch_cmds(setup_env.commands()[0])
    assert "--index-url" not in torch_cmd and asked == []


def test_an_unreachable_cpu_index_gives_pypis_build_said_in_one_line(setup_env, monkeypatch):
    asked = _fake(monkeypatch, setup_env, {"numpy", "matplotlib", "pytest", "pytest_timeout"}, gpu=False,
                  index_answers=False)
    cmds, notes = setup_env.commands()
    assert asked == [setup_env.CPU_INDEX]
    assert cmds == [cmds[0][:5] + ["torch"]]  # pip install -q torch, from PyPI, nothing else
    (why,) = [n for n in notes if "PyTorch" in n]
    assert "unreachable" in why and "PyPI" in why and "CUDA" in why and "\n" not in why


def test_a_gpu_machine_gets_cuda_python_where_it_is_missing(setup_env, monkeypatch):
    base = {"numpy", "matplotlib", "pytest", "pytest_timeout"}
    for torch in (set(), {"torch"}):
        _fake(monkeypatch, setup_env, base | torch, gpu=True)
        cmds, _ = setup_env.commands()
        assert cmds[0][5:] == ["cuda-python"]
        assert len(cmds) == (2 if not torch else 1)  # torch from PyPI where missing, kept where installed
        _fake(monkeypatch, setup_env, base | torch | {"cuda.bindings"}, gpu=True)
        assert not any("cuda-python" in c for c in setup_env.commands()[0])
    _fake(monkeypatch, setup_env, base | {"torch"}, gpu=False)  # no GPU: no cuda-python
    assert setup_env.commands()[0] == []


def test_the_probe_gives_up_on_an_index_that_does_not_answer_within_seconds(setup_env):
    t0 = time.monotonic()
    ok, why = setup_env.index_answers("http://127.0.0.1:9", timeout=3)  # nothing listens on port 9
    assert not ok and why and time.monotonic() - t0 < 4
    t0 = time.monotonic()
    ok, why = setup_env.index_answers("http://192.0.2.1:81", timeout=0.5)  # TEST-NET: never answers
    assert not ok and time.monotonic() - t0 < 1.5


def test_dry_run_with_the_index_unreachable_runs_no_pip(setup_env, monkeypatch, capsys):
    _fake(monkeypatch, setup_env, {"numpy", "matplotlib", "pytest", "pytest_timeout"}, gpu=False,
          index_answers=False)
    monkeypatch.setattr(setup_env.subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    assert setup_env.main(["--dry-run", "--cpu-index", "http://127.0.0.1:9"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "setup: $ pip install -q torch" and sum("unreachable" in ln for ln in out) == 1


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
