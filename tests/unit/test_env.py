"""conccl.env without a device: the one parser, the docs' table, and that conccl reads its
environment variables only through it and only the ones it declares."""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

from conccl import env

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "conccl"
USAGE = ROOT / "docs" / "usage.md"
NAME = re.compile(r"\bCONCCL_[A-Z0-9_]*[A-Z0-9]\b")


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for var in env.VARS:
        monkeypatch.delenv(var.name, raising=False)


# ---------------------------------------------------------------------------- docs
def test_the_usage_table_is_markdown_table():
    text = USAGE.read_text()
    start, end = text.index(env.MARKERS[0]) + len(env.MARKERS[0]), text.index(env.MARKERS[1])
    assert text[start:end] == env.markdown_table(), "regenerate: PYTHONPATH=src python3 -m conccl.env --write docs/usage.md"
    assert text.count("## Environment variables") == 1 and text.count(env.MARKERS[0]) == 1
    for var in env.VARS:
        assert f"`{var.name}`" in env.markdown_table()
    for name in env.FAST_PATHS:
        assert f"| `{name}` |" in env.markdown_table()


def test_the_table_is_rewritten_between_its_markers_only(tmp_path):
    page = tmp_path / "usage.md"
    page.write_text(f"# before\n\n{env.MARKERS[0]}stale\n{env.MARKERS[1]}\n\nafter\n")
    env._write_table(str(page))
    assert page.read_text() == f"# before\n\n{env.MARKERS[0]}{env.markdown_table()}{env.MARKERS[1]}\n\nafter\n"


# ---------------------------------------------------------------------------- the parser
def test_defaults_where_unset_or_empty(monkeypatch):
    assert [env.get(v.name) for v in env.VARS] == [v.default for v in env.VARS]
    assert env.get("CONCCL_DISABLE") == () and env.get("CONCCL_MACHINE_KIND") == "unknown"
    assert env.get("CONCCL_ONE_SHOT_BELOW") == 0 and env.get("CONCCL_DEBUG") is False
    monkeypatch.setenv("CONCCL_ONE_SHOT_BELOW", "  ")
    assert env.get("CONCCL_ONE_SHOT_BELOW") == 0
    assert not any(env.disabled(name) for name in env.FAST_PATHS)


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("ON", True), (" yes ", True),
                                       ("0", False), ("false", False), ("Off", False), ("no", False)])
def test_a_flag_on_and_off(monkeypatch, raw, value):
    monkeypatch.setenv("CONCCL_OWN_CHUNK_VIA_PEER", raw)
    assert env.get("CONCCL_OWN_CHUNK_VIA_PEER") is value


@pytest.mark.parametrize("raw", ["2", "y", "enabled", "tru"])
def test_a_flag_refuses_anything_else_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("CONCCL_DEBUG", raw)
    with pytest.raises(env.EnvError, match="CONCCL_DEBUG") as e:
        env.get("CONCCL_DEBUG")
    assert isinstance(e.value, ValueError) and repr(raw) in str(e.value)


@pytest.mark.parametrize("raw,value", [("0", 0), ("4096", 4096), ("256K", 256 << 10), ("1M", 1 << 20),
                                       ("1m", 1 << 20), ("2G", 2 << 30), ("1MB", 1 << 20), ("0.5M", 1 << 19)])
def test_sizes(monkeypatch, raw, value):
    monkeypatch.setenv("CONCCL_ONE_SHOT_BELOW", raw)
    assert env.get("CONCCL_ONE_SHOT_BELOW") == value


@pytest.mark.parametrize("raw", ["-1", "1X", "lots", "1.5", "K", "1KK"])
def test_a_bad_size_is_refused(monkeypatch, raw):
    monkeypatch.setenv("CONCCL_ONE_SHOT_BELOW", raw)
    with pytest.raises(env.EnvError, match="CONCCL_ONE_SHOT_BELOW must be a size"):
        env.get("CONCCL_ONE_SHOT_BELOW")


def test_seconds(monkeypatch):
    monkeypatch.setenv("CONCCL_DUMP_AFTER_S", "2.5")
    assert env.get("CONCCL_DUMP_AFTER_S") == 2.5
    for raw in ("-1", "nan", "1e9", "soon"):
        monkeypatch.setenv("CONCCL_DUMP_AFTER_S", raw)
        with pytest.raises(env.EnvError, match="CONCCL_DUMP_AFTER_S"):
            env.get("CONCCL_DUMP_AFTER_S")


def test_a_list_of_fast_paths_and_a_bad_name_refused(monkeypatch):
    monkeypatch.setenv("CONCCL_DISABLE", "post_settled, spin_waits,")
    assert env.get("CONCCL_DISABLE") == ("post_settled", "spin_waits")
    assert env.disabled("post_settled") and env.disabled("spin_waits")
    assert not env.disabled("settled_graphs") and not env.disabled("graph_mark_edges")
    monkeypatch.setenv("CONCCL_DISABLE", "post_settled,spin_wait")  # a typo: refused, never ignored
    with pytest.raises(env.EnvError, match="CONCCL_DISABLE: spin_wait not one of"):
        env.disabled("post_settled")
    with pytest.raises(KeyError):
        env.disabled("spin_wait")  # a fast path the code asks for must be declared


def test_text_and_undeclared_names(monkeypatch):
    monkeypatch.setenv("CONCCL_MACHINE_KIND", " nvidia-h100-x2 ")
    assert env.get("CONCCL_MACHINE_KIND") == "nvidia-h100-x2"
    monkeypatch.setenv("CONCCL_SPIN_TIMEOUT_S", "1")
    with pytest.raises(KeyError):
        env.get("CONCCL_SPIN_TIMEOUT_S")  # deleted: no code may read it


def test_the_declarations_are_well_formed():
    names = [v.name for v in env.VARS]
    assert len(names) == len(set(names)) and all(NAME.fullmatch(n) for n in names)
    assert {v.kind for v in env.VARS} <= {"flag", "size", "seconds", "text", "list"}
    assert {v.group for v in env.VARS} <= {"user", "debug", "bench"}
    assert all(v.choices for v in env.VARS if v.kind == "list")


# ---------------------------------------------------------------------------- the code
def _sources():
    return [p for p in SRC.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]


def _conccl_constants() -> set[str]:
    """Names bound anywhere in src/conccl to a "CONCCL_..." string (``ENV = "CONCCL_PROFILE"``)."""
    names = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str) and NAME.fullmatch(node.value.value):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _environ(node) -> bool:
    """``os.environ`` / ``environ`` or ``os.getenv`` / ``getenv``."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return name in ("environ", "getenv")


def test_no_conccl_variable_is_read_outside_conccl_env():
    constants = _conccl_constants()

    def names_conccl(arg) -> bool:
        if isinstance(arg, ast.Constant):
            return isinstance(arg.value, str) and arg.value.startswith("CONCCL_")
        return (isinstance(arg, ast.Name) and arg.id in constants) or \
            (isinstance(arg, ast.Attribute) and arg.attr in constants)

    found = []
    for path in SRC.rglob("*.py"):
        if path == SRC / "env.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            args = []
            if isinstance(node, ast.Call):  # os.environ.get(X), os.getenv(X), os.environ.pop(X, ...)
                f = node.func
                if _environ(f) or (isinstance(f, ast.Attribute) and _environ(f.value)):
                    args = node.args[:1]
            elif isinstance(node, ast.Subscript) and _environ(node.value):  # os.environ[X]
                args = [node.slice]
            elif isinstance(node, ast.Compare) and any(_environ(c) for c in node.comparators):  # X in os.environ
                args = [node.left]
            if any(names_conccl(a) for a in args):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"read these through conccl.env.get / env.disabled: {found}"


def test_every_conccl_name_in_src_is_declared():
    declared = {v.name for v in env.VARS} | set(env.REMOVED)  # a removed one is named only to warn of it
    used = {}
    for path in _sources():
        for name in NAME.findall(path.read_text(errors="replace")):
            used.setdefault(name, str(path.relative_to(ROOT)))
    assert {n: p for n, p in used.items() if n not in declared} == {}


def test_the_scan_finds_what_it_looks_for(tmp_path, monkeypatch):
    """The two scans above on a planted module: they would see a read and an undeclared name."""
    planted = SRC / "_planted_env_read.py"
    monkeypatch.setattr(pathlib.Path, "rglob", lambda self, pattern: iter([planted]) if self == SRC else iter(()))
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *a, **k: (
        'import os\nKEY = "CONCCL_OLD_KNOB"\nos.environ.get(KEY)\nos.environ["CONCCL_X_Y"]\n"CONCCL_Z" in os.environ\n'
        if self == planted else ""))
    monkeypatch.setattr(pathlib.Path, "is_file", lambda self: True)
    with pytest.raises(AssertionError, match=r"_planted_env_read.py:3.*:4.*:5"):
        test_no_conccl_variable_is_read_outside_conccl_env()
    with pytest.raises(AssertionError, match="CONCCL_OLD_KNOB"):
        test_every_conccl_name_in_src_is_declared()


def test_a_variable_no_longer_read_is_warned_of_once_naming_what_replaced_it(monkeypatch):
    env._warn_removed.cache_clear()
    monkeypatch.setenv("CONCCL_POST_SETTLED", "0")
    with pytest.warns(UserWarning, match="CONCCL_POST_SETTLED; instead: CONCCL_DISABLE=post_settled"):
        assert env.get("CONCCL_DISABLE") == ()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.get("CONCCL_DISABLE")  # once per process: no second warning
    env._warn_removed.cache_clear()
    assert set(env.REMOVED).isdisjoint(v.name for v in env.VARS)
