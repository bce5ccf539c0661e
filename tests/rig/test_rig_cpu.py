"""The rig tier without a GPU: its parts parse, every part is a test at some world, the tier is
opt-in, and the CLI over it (scripts/shared_gpu_smoke.py) still finds it and keeps the interface
scripts/launch_path_bench.py imports."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from rig import conftest
from rig.harness import BY_NAME, PARTS, default_parts, parse_parts

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "shared_gpu_smoke.py"


def test_parts_parse_in_run_order():
    assert parse_parts("hier_faults, eager,graph,eager") == ("eager", "graph", "hier_faults")
    assert PARTS[-1].alone  # a part that kills a rank runs last
    with pytest.raises(ValueError, match="'graphs'.*expected some of eager, persistent, graph"):
        parse_parts("graphs")  # the old rig ran nothing for a misspelt part
    with pytest.raises(ValueError, match="no rig part"):
        parse_parts(" , ")


def test_defaults_and_every_part_a_test():
    assert default_parts(2) == ("eager", "persistent", "graph", "tp", "tp_layers", "bench_tp", "ep")
    assert default_parts(4) == default_parts(2) + ("hier", "fsdp_hosts")
    assert {part for part, _ in conftest.tier_cases()} == set(BY_NAME)
    assert ("hier", 2) not in conftest.tier_cases() and ("fsdp", 3) in conftest.tier_cases()


def test_tier_is_opt_in():
    rig = str(conftest.HERE)
    assert not conftest.opted_in([], ROOT, {})
    assert not conftest.opted_in(["-q", "tests"], ROOT, {})
    assert not conftest.opted_in(["tests/unit", "-k", "rig"], ROOT, {})
    assert conftest.opted_in(["-q", "tests/rig"], ROOT, {})
    assert conftest.opted_in(["tests/rig/test_shared_gpu.py::test_part"], ROOT, {})
    assert conftest.opted_in([rig], "/", {})
    assert conftest.opted_in([], ROOT, {"CONCCL_RIG": "1"})


def test_cli_finds_the_rig_and_keeps_its_interface():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, str(SCRIPT), "--only", "graphs"], capture_output=True, text=True,
                         env=env, cwd="/", timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "argument --only: unknown rig part 'graphs'" in out.stderr
    spec = importlib.util.spec_from_file_location("shared_gpu_smoke", SCRIPT)
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    assert callable(smoke.IpcPeerMemory().empty) and smoke.free_port_any() > 0
