"""The tools kept runnable in scripts/ name only what conccl still has: a refactor that renames a
function a tool imports fails here, not on the next GPU machine. (Its first run caught a probe
importing the removed conccl.study.config.arena_bytes.) The probes filed beside their runs
under benchmarks/ are records, not read by the tests.)"""
from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROBES = sorted(ROOT.glob("scripts/*.py"))


def _conccl_names(path: pathlib.Path):
    """(module, name) for every ``from conccl... import name`` in the file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "conccl":
            for alias in node.names:
                yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "conccl":
                    yield alias.name, None


@pytest.mark.parametrize("path", PROBES, ids=lambda p: str(p.relative_to(ROOT)))
def test_probe_imports_resolve(path):
    missing = []
    for module, name in _conccl_names(path):
        mod = importlib.import_module(module)
        if name is not None and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{path.relative_to(ROOT)} imports what conccl no longer has: {missing}"
