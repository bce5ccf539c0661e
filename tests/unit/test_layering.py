"""The layering ARCHITECTURE.md draws, where the repository's layer check does not look: the
executors sit below ``group/``, so what builds a group (the CPU reference harness) lives above.
Two modules of the group's are theirs too, leaves that import nothing else of the group's:
``group.work`` (the ``Work`` handle every executor returns) and ``group.board`` (the host board
in shared memory that the CPU reference executor's ranks also exchange on)."""
from __future__ import annotations

import ast
import pathlib

EXECUTORS = pathlib.Path(__file__).resolve().parents[2] / "src" / "conccl" / "executors"


def _imported(path: pathlib.Path) -> set[str]:
    """The conccl modules ``path`` imports, as dotted names relative to the package."""
    names = set()
    top = len(path.relative_to(EXECUTORS).parts) + 1  # the relative level that reaches conccl itself
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if 0 < node.level < top:  # executors' own modules
                continue
            if node.level == top:
                names.add(module)
                names.update(f"{module}.{a.name}".lstrip(".") for a in node.names)
            elif module.startswith("conccl"):
                names.add(module.removeprefix("conccl").lstrip("."))
        elif isinstance(node, ast.Import):
            names.update(a.name.removeprefix("conccl").lstrip(".") for a in node.names if a.name.startswith("conccl"))
    return names


def test_executors_import_neither_group_nor_launch():
    modules = sorted(EXECUTORS.rglob("*.py"))
    assert len(modules) >= 8  # base, reference, cuda/: executor, program, lowering, programs, capture, ...
    for path in modules:
        imported = _imported(path)
        assert path.name != "executor.py" or "group.work" in imported  # the check sees the executors' imports
        above = {n for n in imported if n.split(".")[0] in {"group", "launch", "api"}
                 and n.split(".")[:2] not in (["group", "work"], ["group", "board"])}
        assert not above, f"executors/{path.relative_to(EXECUTORS)} imports {sorted(above)}, which sit above the executors"


def test_the_group_modules_executors_may_use_are_leaves():
    group = EXECUTORS.parent / "group"
    for leaf in ("work.py", "board.py"):
        tree = ast.parse((group / leaf).read_text(encoding="utf-8"))
        inside = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1]
        assert not inside, f"group/{leaf} imports the group's own modules: {[n.module for n in inside]}"
