"""What the pytest command line names: shared by the tiers that run only when named
(tests/gpu's whole tier, tests/rig)."""
from __future__ import annotations

import pathlib


def names(args, cwd, folder: pathlib.Path) -> bool:
    """Whether a path on the command line (``args``, relative to ``cwd``) is ``folder`` or lies
    in it (a node id's file counts; a folder above it does not)."""
    for arg in args:
        if arg.startswith("-"):
            continue
        path = pathlib.Path(cwd, arg.split("::")[0]).resolve()
        if path == folder or folder in path.parents:
            return True
    return False
