"""What the subcommands share: the table of commands, exit codes, error messages, argument
types, checked outputs.

Bad input ends in one line on stderr, ``conccl COMMAND: what`` (the argument, what was wrong,
what would be accepted), and exit code 2, never a traceback: ``--debug`` or
``CONCCL_DEBUG=1`` asks for the traceback instead.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import tempfile

from .. import env
from ..jsonfile import write_text

# The commands, in --help's order: name -> the line `conccl --help` shows for it. A command's
# flags live in its module, conccl.cli.<name with "_" for "-">, loaded only when that command
# runs or shows its own --help.
COMMAND_HELP = {
    "bench": "nccl-tests-style sweep of conccl against NCCL and PyTorch, with an overlap column",
    "bench-fsdp": "FSDP2 training step: no_comm, stock (NCCL), conccl (also: conccl bench fsdp)",
    "bench-graphs": "small collectives in a CUDA graph and eager: nccl, conccl, conccl_auto "
                    "(also: conccl bench graphs)",
    "bench-moe": "MoE dispatch and combine against the NCCL reference (also: conccl bench moe)",
    "bench-tp": "tensor-parallel ops against the GEMM alone, NCCL and async-TP (also: conccl bench tp)",
    "study": "the paper's C3 characterization on these GPUs: every strategy, a report with figures",
    "study-tp": "tensor parallelism's GEMM losses on one GPU (run as `conccl study tp`)",
    "plan": "the strategy and SM split for a GEMM beside a collective, predicted from a hardware profile",
    "plan-tp": "the pipeline auto picks for a tensor-parallel op (also: conccl plan tp)",
}

EXIT_OK = 0
EXIT_FAILED = 1  # the run finished, but some result was wrong or some case failed
EXIT_USAGE = 2  # it could not run as asked (arguments, inputs, machine); as argparse's own errors
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a SIGINT


class UsageError(ValueError):
    """Bad input found by a command: its message is the one line the user sees."""


def fail(command: str, msg: str) -> int:
    """Print ``conccl COMMAND: msg`` on one line of stderr; return :data:`EXIT_USAGE`."""
    print(f"conccl {command}: {' '.join(str(msg).split())}", file=sys.stderr)
    return EXIT_USAGE


def debug_wanted(args=None) -> bool:
    """True when ``--debug`` or ``CONCCL_DEBUG`` (a flag: 1, true, on, yes) asks for tracebacks.
    Raises :class:`~conccl.env.EnvError` for a CONCCL_DEBUG that is not a flag."""
    return bool(getattr(args, "debug", False)) or env.get("CONCCL_DEBUG")


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (argparse prints the whole usage block first)."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: {' '.join(message.split())} (see: {self.prog} --help)\n")


def int_range(lo: int, hi: int | None = None, what: str = "a whole number"):
    """An argparse type: an integer in [lo, hi], refused in words naming what is accepted."""
    accepted = f"{what} >= {lo}" if hi is None else f"{what} from {lo} to {hi}"

    def parse(text: str) -> int:
        try:
            v = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; expected {accepted}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is out of range; expected {accepted}")
        return v

    parse.__name__ = "int"
    return parse


def float_range(lo: float, hi: float, what: str = "a number"):
    """An argparse type: a finite number in (lo, hi], refused in words naming what is accepted."""
    accepted = f"{what} above {lo:g} and at most {hi:g}"

    def parse(text: str) -> float:
        try:
            v = float(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; expected {accepted}") from None
        if not lo < v <= hi:  # also refuses nan
            raise argparse.ArgumentTypeError(f"{text} is out of range; expected {accepted}")
        return v

    parse.__name__ = "float"
    return parse


@contextlib.contextmanager
def about(flag: str, value):
    """Name the argument in a reader's error: '--suite FILE: not valid JSON (...)'."""
    try:
        yield
    except ValueError as e:
        msg = str(e)
        shown = f"{flag} {value}"
        # Chained: --debug shows where the reader refused it.
        raise UsageError(msg if msg.startswith(flag) else f"{shown}: {msg.removeprefix(str(value) + ': ')}") from e


def add_machine_kind(parser, what: str) -> None:
    parser.add_argument("--machine-kind", default=env.get("CONCCL_MACHINE_KIND"),
                        help=f"label recorded in the {what} (e.g. nvidia-h200-x4)")


def check_out_file(path: str | None, flag: str) -> None:
    """Refuse, before anything runs, an output file that cannot be written (``-``: stdout): its
    folder must exist (a file is written in an existing folder, as for :func:`check_out_dir`)."""
    if not path or path == "-":
        return
    p = pathlib.Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a folder; give a file name")
    check_out_dir(p.parent, flag, shown=path, create=False)


def check_out_dir(path, flag: str, shown=None, create: bool = True) -> pathlib.Path:
    """The rule of every output path: its parent folder must exist and be writable; the last
    component (``create``: the folder itself) is made by the command. Refused, naming ``flag``:
    a path through a file ("X is a file, not a folder"), a missing parent, an unwritable folder.
    Nothing is created here: a run refused later leaves no empty folder behind."""
    p, shown = pathlib.Path(path), shown or path
    probe = p
    while not probe.exists() and probe != probe.parent:  # the nearest path that exists
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UsageError(f"{flag} {shown}: {probe} is a file, not a folder; give a path in a writable folder")
    # the folder written in: the path itself where it exists, else its parent, which must exist
    folder = p if p.is_dir() or not create else p.parent
    if probe != folder:
        hint = "create it first (only the last folder of a path is created)" if create else \
            "give a file in an existing folder"
        raise UsageError(f"{flag} {shown}: the folder {folder} does not exist; {hint}")
    try:  # the real test: permissions, read-only mounts, ACLs
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".conccl-probe-"):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {shown}: cannot write in {folder} ({e.strerror or e}); "
                         "give a path in a writable folder") from None
    return p


def gpu_world(gpus: int | None) -> tuple[int, str | None]:
    """(world, why not) of a command that starts one process per GPU (or joins torchrun):
    ``--gpus`` at most the visible GPUs, and at least 2 in all."""
    import torch

    from ..launch import under_torchrun

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and gpus > visible and not under_torchrun():
        return 0, f"--gpus {gpus}: only {visible} GPU(s) visible here; give at most {visible}"
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else (gpus or visible)
    if not visible or world < 2:
        return world, f"needs at least 2 CUDA GPUs linked by NVLink, found {visible}"
    return world, None


def print_and_write(text: str, markdown_path=None, json_path=None, doc=None) -> None:
    """Print ``text``; also write it to ``markdown_path`` and ``doc`` as JSON to ``json_path``
    where given (an evaluation's two forms). ``json_path`` "-": the JSON alone, on stdout."""
    if markdown_path:
        write_text(markdown_path, text)
    if json_path == "-":
        print(json.dumps(doc, indent=1))
        return
    print(text)
    if json_path:
        write_text(json_path, json.dumps(doc, indent=1) + "\n")


def comma_list(text: str, known, flag: str) -> tuple:
    """``text``'s comma-separated names, each one of ``known``; UsageError naming ``flag`` else."""
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in known]
    if not items or bad:
        raise UsageError(f"{flag}: {', '.join(bad) or 'nothing given'}; known: {', '.join(known)}")
    return items
