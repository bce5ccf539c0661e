"""The ``conccl`` command: ``conccl bench``, ``conccl study``, ``conccl plan``.

One module per subcommand, each with ``add_parser(subparsers)`` (its flags) and
``run(args) -> int`` (its exit code: :data:`~conccl.cli.common.EXIT_OK`,
:data:`~conccl.cli.common.EXIT_FAILED` when the run finished with wrong results or errors,
:data:`~conccl.cli.common.EXIT_USAGE` when it could not run as asked,
:data:`~conccl.cli.common.EXIT_INTERRUPTED` on Ctrl-C). ``python -m conccl`` and the
``conccl`` entry point both call :func:`main`.

Only the module of the command that runs is imported (the commands load torch, the benchmarks
torch's FSDP): ``conccl --version`` and ``conccl --help`` import none of them, and a command
whose module cannot import PyTorch (or NumPy, matplotlib) says in one line what to install.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Mapping

from .._version import __version__
from ..env import EnvError
from .common import (COMMAND_HELP, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Parser, UsageError, debug_wanted,
                     fail)


class _Commands(Mapping):
    """Command name -> its module, imported on first lookup; iterates in --help's order."""

    def __getitem__(self, name: str):
        if name not in COMMAND_HELP:
            raise KeyError(name)
        return importlib.import_module(f"{__name__}.{name.replace('-', '_')}")

    def __iter__(self):
        return iter(COMMAND_HELP)

    def __len__(self) -> int:
        return len(COMMAND_HELP)


COMMANDS = _Commands()
# `conccl bench NAME` runs the command bench-NAME.
BENCH_MODES = ("fsdp", "graphs", "moe", "tp")
# `conccl study NAME` runs the command study-NAME.
STUDY_MODES = ("tp",)
# `conccl plan tp` runs the command plan-tp.
PLAN_MODES = ("tp",)
# Errors that mean "this input cannot be used": one line and EXIT_USAGE. OSError: a file that
# cannot be read or written (a full disk, a folder removed under a running study). EnvError: a
# CONCCL_ variable holding a value it cannot take. The others, module -> name, are looked up only
# where their module is loaded: an error of a module never imported cannot have been raised.
BAD_INPUT = (UsageError, EnvError, OSError)
BAD_INPUT_OF_MODULES = {"conccl.study.scenarios": "SuiteError", "conccl.planner.profile": "ProfileError",
                        "conccl.study.results": "ResultsError", "conccl.planner.plan": "PlanError",
                        "conccl.study.config": "StudyError"}
# Packages a command may need that conccl does not depend on by default (torch) or that a bare
# environment may lack: import name -> (what it is called, how to install it).
DEPENDENCIES = {"torch": ("PyTorch", "pip install torch"), "numpy": ("NumPy", "pip install numpy"),
                "matplotlib": ("matplotlib", "pip install matplotlib")}

__all__ = ["main", "build_parser", "COMMANDS", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_INTERRUPTED"]

DEBUG_HELP = "on an error, show its Python traceback (also: CONCCL_DEBUG=1)"


def build_parser(loaded=None) -> argparse.ArgumentParser:
    """The parser of ``conccl``: every command by name, with the flags of those in ``loaded``
    (command names; None: all), whose modules this imports."""
    p = Parser(prog="conccl", description="Copy-engine collectives for concurrent computation and communication.")
    p.add_argument("--version", action="version", version=f"conccl {__version__}")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    # Not required here: a missing command is refused by main after the parse, so that an
    # unknown flag (`conccl --frobnicate`) is named first ("unrecognized arguments").
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    for name, help_line in COMMAND_HELP.items():
        if loaded is None or name in loaded:
            COMMANDS[name].add_parser(sub)
        else:  # listed in --help; never parses: main loads the module of the command given
            sub.add_parser(name, help=help_line)
        # Accepted after the command too; SUPPRESS keeps `conccl --debug study` from being reset.
        sub.choices[name].add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return p


def _joined_modes(argv: list) -> list:
    """``argv`` with a two-word command (``bench fsdp``) as its one-word name (``bench-fsdp``)."""
    # the global flags before the command (`conccl --debug plan tp ...`)
    lead = 0
    while lead < len(argv) and argv[lead] in ("--debug",):
        lead += 1
    head, cmd, mode = argv[:lead], argv[lead:lead + 1], argv[lead + 1:lead + 2]
    for word, modes in (("bench", BENCH_MODES), ("study", STUDY_MODES), ("plan", PLAN_MODES)):
        # `conccl bench fsdp` reads as the docs say it; bench's own flags are nccl-tests', which
        # a positional argument there would clash with.
        if cmd == [word] and mode and mode[0] in modes:
            return [*head, f"{word}-{mode[0]}", *argv[lead + 2:]]
    return argv


def _missing_dependency(e: BaseException) -> str | None:
    """The one line saying what to install, where ``e`` is the import of a package in
    :data:`DEPENDENCIES` failing; None for any other error."""
    if not isinstance(e, ImportError) or not e.name:
        return None
    top = e.name.partition(".")[0]
    if top not in DEPENDENCIES:
        return None
    what, install = DEPENDENCIES[top]
    if isinstance(e, ModuleNotFoundError) and e.name == top:  # not installed (or not on this path)
        return f"needs {what}: {install} (see README: set-up)"
    return f"needs {what}, whose import failed: {' '.join(str(e).split())[:200]} (see README: set-up)"


def _bad_input(e: BaseException) -> bool:
    loaded = tuple(getattr(sys.modules[m], n) for m, n in BAD_INPUT_OF_MODULES.items() if m in sys.modules)
    return isinstance(e, BAD_INPUT + loaded)


def _debug(args) -> bool:
    try:
        return debug_wanted(args)
    except EnvError:  # a CONCCL_DEBUG that is not a flag: reported as bad input, not obeyed
        return bool(getattr(args, "debug", False))


def main(argv=None) -> int:
    argv = _joined_modes(list(sys.argv[1:] if argv is None else argv))
    # The command: the first word that is not a flag (conccl's own flags take no value).
    command = next((a for a in argv if not a.startswith("-")), "")
    name = command.replace("-", " ")
    # Until the command's flags are parsed (its module may fail to import): --debug anywhere.
    args = argparse.Namespace(debug="--debug" in argv)
    try:
        parser = build_parser(loaded={command} & set(COMMANDS))
        args = parser.parse_args(argv)
        if args.command is None:
            parser.error(f"a command is required: one of {', '.join(COMMAND_HELP)}")
        debug_wanted(args)  # a CONCCL_DEBUG that is not a flag is refused before the command runs
        return COMMANDS[args.command].run(args)
    except BrokenPipeError:  # the reader went away (`| head`): not bad input, nothing to say
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        except OSError:
            pass
        return EXIT_OK
    except KeyboardInterrupt:
        if _debug(args):
            raise
        print(f"conccl {name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        if _debug(args):
            if _missing_dependency(e) is None and not _bad_input(e):
                raise  # a bug: its traceback, exit 1 (Python's)
            traceback.print_exc()  # bad input: its traceback, and still exit 2
            return EXIT_USAGE
        if (missing := _missing_dependency(e)) is not None:
            print(f"conccl {name} {missing}", file=sys.stderr)
            return EXIT_USAGE
        if _bad_input(e):
            if isinstance(e, OSError) and e.filename:
                return fail(name, f"{e.filename}: {e.strerror or e}")
            return fail(name, str(e))
        # a bug, not bad input: still one line, the traceback on request
        print(f"conccl {name}: internal error: {type(e).__name__}: {' '.join(str(e).split())[:300]} "
              "(rerun with --debug for the traceback, and report it)", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
