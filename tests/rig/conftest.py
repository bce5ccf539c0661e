"""The shared-GPU rig tier (tests/rig/test_shared_gpu.py): opt-in, one test per part and world.

It runs only when asked for: a path at or under tests/rig on the command line, or
CONCCL_RIG=1. Otherwise it is one skipped test whose reason is COMMAND, so the default
``pytest -q`` stays short on GPU machines and never touches CUDA for it. Asked for with no GPU
visible, every test skips saying so. The parts of one world run together, in one rig run
(spawned ranks sharing cuda:0), the first time a test of that world needs them; ``-k`` picks
which (``-k w2``, ``-k "hier-w4"``). CONCCL_RIG_TIMEOUT (seconds, default 600) bounds a run,
CONCCL_RIG_JSON=DIR keeps each run's JSON (as scripts/shared_gpu_smoke.py --json writes it).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from cmdline import names
from rig.harness import BY_NAME, PARTS, fits, run

HERE = pathlib.Path(__file__).resolve().parent
COMMAND = "PYTHONPATH=src CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q tests/rig"
WORLDS = (2, 3, 4)
TIMEOUT = float(os.environ.get("CONCCL_RIG_TIMEOUT", "600"))


def opted_in(args, cwd, env) -> bool:
    """Asked for: CONCCL_RIG=1, or a command-line path at or under tests/rig."""
    return env.get("CONCCL_RIG") == "1" or names(args, cwd, HERE)


def tier_cases(worlds=WORLDS) -> list[tuple[str, int]]:
    """(part, world) for every part at every world of the tier it can run at."""
    return [(p.name, w) for w in worlds for p in PARTS if fits(p, w)]


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", "timeout(seconds): pytest-timeout's limit for one test")


def pytest_generate_tests(metafunc):
    if "rig_case" not in metafunc.fixturenames:
        return
    params = metafunc.config.invocation_params
    if not opted_in(params.args, params.dir, os.environ):
        metafunc.parametrize("rig_case", [pytest.param(None, id="opt-in", marks=pytest.mark.skip(
            reason=f"the shared-GPU rig tier runs only when asked for: {COMMAND}"))])
        return
    # the first test of a world waits for that world's whole run
    limit = pytest.mark.timeout(TIMEOUT + 120)
    metafunc.parametrize("rig_case", [pytest.param((part, world), id=f"{part}-w{world}", marks=limit)
                                      for part, world in tier_cases()])


def _visible_gpus() -> int:
    """CUDA devices, counted in a child process: this one must not initialise CUDA (tests that
    fork may run in the same session)."""
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                             capture_output=True, text=True, timeout=300)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return 0


@pytest.fixture(scope="session")
def rig_results(request):
    """``get(world, part)``: the result of the rig run holding that part at that world. The
    selected parts of a world share one run; a part that kills a rank gets a run of its own."""
    if _visible_gpus() == 0:
        pytest.skip("the shared-GPU rig needs a CUDA GPU; none is visible")
    cache: dict = {}
    selected = [item.callspec.params["rig_case"] for item in request.session.items
                if hasattr(item, "callspec") and item.callspec.params.get("rig_case")]

    def get(world: int, part: str) -> dict:
        key = (world, part) if BY_NAME[part].alone else (world, None)
        if key not in cache:
            parts = [part] if BY_NAME[part].alone else \
                [p for p, w in selected if w == world and not BY_NAME[p].alone]
            cache[key] = run(world, parts, timeout=TIMEOUT)
            if os.environ.get("CONCCL_RIG_JSON"):
                out = pathlib.Path(os.environ["CONCCL_RIG_JSON"])
                out.mkdir(parents=True, exist_ok=True)
                name = f"rig_w{world}" + (f"_{part}" if key[1] else "") + ".json"
                (out / name).write_text(json.dumps(cache[key], indent=1))
        return cache[key]

    return get
