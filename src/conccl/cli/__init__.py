"""The ``conccl`` command: ``conccl bench``, ``conccl study``, ``conccl plan``.

One module per subcommand, each with ``add_parser(subparsers)`` (its flags) and
``run(args) -> int`` (its exit code: :data:`~conccl.cli.common.EXIT_OK`,
:data:`~conccl.cli.common.EXIT_FAILED` when the run finished with wrong results or errors,
:data:`~conccl.cli.common.EXIT_USAGE` when it could not run as asked,
:data:`~conccl.cli.common.EXIT_INTERRUPTED` on Ctrl-C). ``python -m conccl`` and the
``conccl`` entry point both call :func:`main`.
"""
from __future__ import annotations

import argparse
import os
import sys

from .._version import __version__
from ..planner.plan import PlanError
from ..planner.profile import ProfileError
from ..study.config import StudyError
from ..study.results import ResultsError
from ..study.scenarios import SuiteError
from . import bench, bench_fsdp, bench_graphs, bench_moe, bench_tp, plan, plan_tp, study, study_tp
from .common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Parser, UsageError, debug_wanted, fail

COMMANDS = {"bench": bench, "bench-fsdp": bench_fsdp, "bench-graphs": bench_graphs, "bench-moe": bench_moe, "bench-tp": bench_tp, "study": study,
            "study-tp": study_tp, "plan": plan, "plan-tp": plan_tp}  # in --help's order
# `conccl bench NAME` runs the command bench-NAME.
BENCH_MODES = ("fsdp", "graphs", "moe", "tp")
# `conccl study NAME` runs the command study-NAME.
STUDY_MODES = ("tp",)
# `conccl plan tp` runs the command plan-tp.
PLAN_MODES = ("tp",)
# Errors that mean "this input cannot be used": one line and EXIT_USAGE. OSError: a file that
# cannot be read or written (a full disk, a folder removed under a running study).
BAD_INPUT = (UsageError, SuiteError, ProfileError, ResultsError, PlanError, StudyError, OSError)

__all__ = ["main", "build_parser", "COMMANDS", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_INTERRUPTED"]

DEBUG_HELP = "on an error, show its Python traceback (also: CONCCL_DEBUG=1)"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="conccl", description="Copy-engine collectives for concurrent computation and communication.")
    p.add_argument("--version", action="version", version=f"conccl {__version__}")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, command in COMMANDS.items():
        command.add_parser(sub)
        # Accepted after the command too; SUPPRESS keeps `conccl --debug study` from being reset.
        sub.choices[name].add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the global flags before the command (`conccl --debug plan tp ...`)
    lead = 0
    while lead < len(argv) and argv[lead] in ("--debug",):
        lead += 1
    head, cmd, mode = argv[:lead], argv[lead:lead + 1], argv[lead + 1:lead + 2]
    for word, modes in (("bench", BENCH_MODES), ("study", STUDY_MODES), ("plan", PLAN_MODES)):
        # `conccl bench fsdp` reads as the issue and the docs say it; bench's own flags are
        # nccl-tests', which a positional argument there would clash with.
        if cmd == [word] and mode and mode[0] in modes:
            argv = [*head, f"{word}-{mode[0]}", *argv[lead + 2:]]
            break
    args = build_parser().parse_args(argv)
    name = args.command.replace("-", " ")
    try:
        return COMMANDS[args.command].run(args)
    except BrokenPipeError:  # the reader went away (`| head`): not bad input, nothing to say
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        except OSError:
            pass
        return EXIT_OK
    except KeyboardInterrupt:
        if debug_wanted(args):
            raise
        print(f"conccl {name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BAD_INPUT as e:
        if debug_wanted(args):
            raise
        if isinstance(e, OSError) and e.filename:
            return fail(name, f"{e.filename}: {e.strerror or e}")
        return fail(name, str(e))
    except Exception as e:  # a bug, not bad input: still one line, the traceback on request
        if debug_wanted(args):
            raise
        print(f"conccl {name}: internal error: {type(e).__name__}: {' '.join(str(e).split())[:300]} "
              "(rerun with --debug for the traceback, and report it)", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
