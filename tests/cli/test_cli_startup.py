"""What the command line loads before it runs anything, each case in a fresh interpreter:
``conccl --version`` and ``conccl --help`` (and ``import conccl``) load no torch, NumPy,
matplotlib or sympy, and no command's module; a command's own ``--help`` loads its module
alone. Without PyTorch (hidden by a ``torch`` module that cannot be imported, first on the
path), a command that needs it says in one line what to install and exits 2, while
``--version`` and ``--help`` still work.

The checks are on the modules loaded, not on wall time (flaky on shared CI machines):
``-X importtime`` lists every module an interpreter imports, the ``python -m conccl`` run's
included."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from conccl._version import __version__
from conccl.cli.common import COMMAND_HELP, EXIT_USAGE

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
HEAVY = ("torch", "numpy", "matplotlib", "sympy")  # top-level packages none of these may import
COMMAND_MODULES = tuple(f"conccl.cli.{name.replace('-', '_')}" for name in COMMAND_HELP)


def _run(args, *, path=(), env=None):
    """``python -X importtime ARGS`` with src (after ``path``) on PYTHONPATH: (the run, the
    modules it imported)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CONCCL_")}
    environ.update(PYTHONPATH=os.pathsep.join([*map(str, path), str(SRC)]), **(env or {}))
    done = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True,
                          env=environ, timeout=120)
    imported, err = set(), []
    for line in done.stderr.splitlines():
        if line.startswith("import time:"):
            imported.add(line.rpartition("|")[2].strip())
        else:
            err.append(line)
    done.stderr = "\n".join(err)
    return done, imported


def _heavy(imported) -> list:
    return sorted(m for m in imported if m.partition(".")[0] in HEAVY)


@pytest.fixture
def no_torch(tmp_path):
    """A folder whose ``torch`` module fails as a missing PyTorch does; put first on the path."""
    (tmp_path / "torch.py").write_text('raise ModuleNotFoundError("No module named \'torch\'", name="torch")\n')
    return tmp_path


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["--debug", "--help"], []])
def test_version_and_help_load_no_torch_and_no_command(argv):
    done, imported = _run(["-m", "conccl", *argv])
    assert done.returncode == (EXIT_USAGE if not argv else 0), done.stderr  # no command: argparse's usage error
    assert not _heavy(imported), _heavy(imported)
    assert not imported & set(COMMAND_MODULES), sorted(imported & set(COMMAND_MODULES))
    if argv == ["--version"]:
        assert done.stdout == f"conccl {__version__}\n"
    if "--help" in argv:
        for name, help_line in COMMAND_HELP.items():  # every command listed, with its line
            assert name in done.stdout and help_line.split()[0] in done.stdout


def test_import_conccl_loads_no_torch_nor_numpy():
    done, imported = _run(["-c", "import conccl, conccl.errors; conccl.InvalidArgument; conccl.PersistentCollective"])
    assert done.returncode == 0, done.stderr
    assert not _heavy(imported), _heavy(imported)


def test_a_commands_help_loads_its_module_alone():
    done, imported = _run(["-m", "conccl", "plan", "--help"])
    assert done.returncode == 0 and "usage: conccl plan" in done.stdout, done.stderr
    assert imported & set(COMMAND_MODULES) <= {"conccl.cli.plan", "conccl.cli.plan_multinode"}


def test_the_collective_errors_are_torchs_once_asked_for():
    torch = pytest.importorskip("torch")
    import conccl
    from conccl.errors import CollectiveError, CollectiveTimeout, GroupBroken, InvalidArgument, UnsupportedGroup

    assert issubclass(CollectiveError, torch.distributed.DistError) and issubclass(InvalidArgument, ValueError)
    assert all(issubclass(c, CollectiveError) for c in (CollectiveTimeout, GroupBroken, UnsupportedGroup))
    assert conccl.CollectiveTimeout is CollectiveTimeout and conccl.GroupBroken is GroupBroken
    assert CollectiveTimeout.__module__ == "conccl.errors" and CollectiveTimeout.__qualname__ == "CollectiveTimeout"


@pytest.mark.parametrize("argv, name", [(["study"], "study"), (["study", "--predict", "--quick", "--out", "o"], "study"),
                                        (["bench", "fsdp"], "bench fsdp"), (["bench-tp", "--help"], "bench tp")])
def test_without_torch_a_command_says_what_to_install_in_one_line(no_torch, argv, name):
    done, _ = _run(["-m", "conccl", *argv], path=[no_torch])
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert done.stderr.splitlines() == [f"conccl {name} needs PyTorch: pip install torch (see README: set-up)"]


def test_without_torch_debug_shows_the_traceback(no_torch):
    done, _ = _run(["-m", "conccl", "--debug", "bench"], path=[no_torch])
    assert done.returncode == EXIT_USAGE and done.stderr.splitlines()[0] == "Traceback (most recent call last):"
    assert done.stderr.splitlines()[-1] == "ModuleNotFoundError: No module named 'torch'"


def test_without_torch_version_help_and_import_conccl_still_work(no_torch):
    done, _ = _run(["-m", "conccl", "--version"], path=[no_torch])
    assert done.returncode == 0 and done.stdout == f"conccl {__version__}\n", done.stderr
    done, _ = _run(["-m", "conccl", "--help"], path=[no_torch])
    assert done.returncode == 0 and "usage: conccl" in done.stdout, done.stderr
    done, _ = _run(["-c", "import conccl; from conccl.errors import CollectiveError; "
                          "assert CollectiveError.__mro__[1] is RuntimeError"], path=[no_torch])
    assert done.returncode == 0, done.stderr


def test_a_torch_that_fails_to_import_is_named_in_one_line(tmp_path):
    (tmp_path / "torch.py").write_text('raise ImportError("libcudart.so.12: cannot open shared object file", '
                                       'name="torch._C")\n')
    done, _ = _run(["-m", "conccl", "study"], path=[tmp_path])
    assert done.returncode == EXIT_USAGE and done.stderr.splitlines() == [
        "conccl study needs PyTorch, whose import failed: libcudart.so.12: cannot open shared object file "
        "(see README: set-up)"], done.stderr


def test_a_conccl_debug_that_is_not_a_flag_is_refused_in_one_line():
    done, _ = _run(["-m", "conccl", "plan", "--gemm", "64x64x64", "--size", "1M"], env={"CONCCL_DEBUG": "maybe"})
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert done.stderr.splitlines() == ["conccl plan: CONCCL_DEBUG must be one of 1, true, on, yes, 0, false, off, "
                                        "no, got 'maybe'"], done.stderr
