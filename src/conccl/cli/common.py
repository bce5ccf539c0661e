"""What the subcommands share: exit codes, error messages, the machine label."""
from __future__ import annotations

import os
import sys

EXIT_OK = 0
EXIT_FAILED = 1  # the run finished, but some result was wrong or some case failed
EXIT_USAGE = 2  # it could not run as asked (arguments, inputs, machine); as argparse's own errors


def fail(command: str, msg: str) -> int:
    """Print ``conccl COMMAND: msg`` on stderr; return :data:`EXIT_USAGE`."""
    print(f"conccl {command}: {msg}", file=sys.stderr)
    return EXIT_USAGE


def add_machine_kind(parser, what: str) -> None:
    parser.add_argument("--machine-kind", default=os.environ.get("CONCCL_MACHINE_KIND", "unknown"),
                        help=f"label recorded in the {what} (e.g. nvidia-h200-x4)")
