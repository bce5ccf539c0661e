"""The layering ARCHITECTURE.md draws, where the repository's layer check does not look: the
executors sit below ``group/``, so what builds a group (the CPU reference harness) lives above."""
from __future__ import annotations

import ast
import pathlib

EXECUTORS = pathlib.Path(__file__).resolve().parents[2] / "src" / "conccl" / "executors"


def _imported(path: pathlib.Path) -> set[str]:
    """The conccl modules ``path`` imports, as dotted names relative to the package."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1:  # executors' own modules
                continue
            if node.level == 2:
                names.add(module)
                names.update(f"{module}.{a.name}".lstrip(".") for a in node.names)
            elif module.startswith("conccl"):
                names.add(module.removeprefix("conccl").lstrip("."))
        elif isinstance(node, ast.Import):
            names.update(a.name.removeprefix("conccl").lstrip(".") for a in node.names if a.name.startswith("conccl"))
    return names


def test_executors_import_neither_group_nor_launch():
    modules = sorted(EXECUTORS.glob("*.py"))
    assert len(modules) >= 5  # base, cuda_ce, cuda_program, cuda_reduce, reference
    for path in modules:
        above = {n for n in _imported(path) if n.split(".")[0] in {"group", "launch", "api"}}
        assert not above, f"executors/{path.name} imports {sorted(above)}, which sit above the executors"
