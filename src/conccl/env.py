"""Every environment variable conccl reads, declared once: name, kind, default, meaning.

One parser reads them all: a flag is on for ``1, true, on, yes`` and off for ``0, false, off,
no`` or unset (anything else is refused, naming the variable); a size takes ``256K``, ``1M``
(powers of 1024) or plain bytes; a list is comma-separated names, each one of the variable's
choices. A bad value raises :class:`EnvError` (a ``ValueError``) where the value is first
needed, never at import.

docs/usage.md's "Environment variables" table is :func:`markdown_table`'s output, between the
marker comments ``<!-- env-table -->`` and ``<!-- /env-table -->`` (tests/unit/test_env.py keeps
the two equal). After a change here, regenerate it from the repository root with
``PYTHONPATH=src python3 -m conccl.env --write docs/usage.md``; without ``--write`` the table is
printed.

Variables are read when asked for (:func:`get`), not cached: tests and the benchmarks set them
per process, and groups made later see the value then.
"""
from __future__ import annotations

import functools
import os
import sys
import warnings
from dataclasses import dataclass

__all__ = ["Var", "VARS", "FAST_PATHS", "EnvError", "get", "disabled", "markdown_table"]

_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class EnvError(ValueError):
    """An environment variable conccl reads holds a value it cannot take."""


@dataclass(frozen=True)
class Var:
    """One environment variable: ``kind`` is one of ``flag``, ``size``, ``seconds``, ``text``,
    ``list`` (``choices`` the names a list may hold); ``group`` says who it is for: ``user``
    (what a user sets), ``debug`` (finding a fault), ``bench`` (labels in benchmark records)."""

    name: str
    kind: str
    default: object
    meaning: str
    group: str = "user"
    choices: tuple = ()


# The fast paths CONCCL_DISABLE may turn off, each a choice measured faster and kept on by
# default; off, the call takes the general path with the same results.
FAST_PATHS = {
    "post_settled": "a call repeating a settled one posts its board row and goes on; peers' rows checked next call",
    "settled_graphs": "a settled eager call's driver calls launched as one CUDA graph",
    "graph_mark_edges": "a captured or settled `conccl.tp` pipeline's marks as graph edges, not stream memory operations",
    "spin_waits": "a captured reduction's signal waits run by a one-warp kernel",
}

VARS = (
    Var("CONCCL_PROFILE", "text", "",
        "path of the hardware profile the planner reads (`conccl study` writes one); default: the shipped one for "
        "this GPU"),
    Var("CONCCL_ONE_SHOT_BELOW", "size", 0,
        "calls of the public functions below this output size per rank run as one small SM kernel (0: never)"),
    Var("CONCCL_OWN_CHUNK_VIA_PEER", "flag", False,
        "a push all-gather reads its own chunk back from a peer on a copy engine instead of an SM copy"),
    Var("CONCCL_DISABLE", "list", (),
        "fast paths to turn off, comma-separated: " + ", ".join(FAST_PATHS), choices=tuple(FAST_PATHS)),
    Var("CONCCL_SIMULATED_HOSTS", "text", "",
        "ranks assigned to pretend hosts on one machine (`2x4` or `0,0,1,1`), for tests of multi-host groups"),
    Var("CONCCL_DEBUG", "flag", False, "the command line shows an error's Python traceback", group="debug"),
    Var("CONCCL_DUMP_AFTER_S", "seconds", 0.0,
        "a GPU rank prints every thread's stack and exits after this many seconds (0: never), for finding a hang",
        group="debug"),
    Var("CONCCL_MACHINE_KIND", "text", "unknown", "the machine's label in benchmark records (e.g. nvidia-h100-x2)",
        group="bench"),
    Var("CONCCL_COMMIT", "text", "",
        "the commit in benchmark records, where the checkout has no .git (default: git's HEAD)", group="bench"),
)
_BY_NAME = {v.name: v for v in VARS}

# Variables conccl read before and reads no more, with what takes their place: one set is warned
# of once per process, so that a job script's switch does not silently stop switching.
REMOVED = {
    "CONCCL_POST_SETTLED": "CONCCL_DISABLE=post_settled",
    "CONCCL_SETTLED_GRAPHS": "CONCCL_DISABLE=settled_graphs",
    "CONCCL_GRAPH_MARK_EDGES": "CONCCL_DISABLE=graph_mark_edges",
    "CONCCL_SPIN_WAITS": "CONCCL_DISABLE=spin_waits (eager calls never spin)",
    "CONCCL_SPIN_TIMEOUT_S": "nothing: spinning kernels wait until the watchdog releases them",
    "CONCCL_REDUCE_CTAS": "nothing: the reduction takes half the SMs",
}


@functools.lru_cache(maxsize=None)
def _warn_removed(names: tuple) -> None:
    for name in names:
        warnings.warn(f"conccl no longer reads {name}; instead: {REMOVED[name]}", UserWarning, stacklevel=4)


def _parse(var: Var, raw: str):
    raw = raw.strip()
    if raw == "":
        return var.default
    if var.kind == "flag":
        low = raw.lower()
        if low in _ON:
            return True
        if low in _OFF:
            return False
        raise EnvError(f"{var.name} must be one of {', '.join(_ON + _OFF)}, got {raw!r}")
    if var.kind == "size":
        num, unit = raw.rstrip("KMGTkmgtBb"), raw[len(raw.rstrip("KMGTkmgtBb")):].upper().rstrip("B")
        try:
            value = float(num) * _UNITS[unit]
        except (ValueError, KeyError):
            value = -1.0
        if value < 0 or value != int(value):
            raise EnvError(f"{var.name} must be a size such as 256K, 1M or 0, got {raw!r}")
        return int(value)
    if var.kind == "seconds":
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 <= value <= 86400:  # NaN fails too
            raise EnvError(f"{var.name} must be a number of seconds from 0 to 86400, got {raw!r}")
        return value
    if var.kind == "list":
        names = tuple(n.strip() for n in raw.split(",") if n.strip())
        bad = [n for n in names if n not in var.choices]
        if bad:
            raise EnvError(f"{var.name}: {', '.join(bad)} not one of {', '.join(var.choices)}")
        return names
    return raw


def get(name: str):
    """The value of conccl's environment variable ``name`` now (its default where unset or
    empty). Raises :class:`EnvError` for a value it cannot take, KeyError for a name not
    declared in :data:`VARS`."""
    var = _BY_NAME[name]
    removed = tuple(n for n in REMOVED if n in os.environ)
    if removed:
        _warn_removed(removed)
    return _parse(var, os.environ.get(name, ""))


def disabled(fast_path: str) -> bool:
    """Whether ``CONCCL_DISABLE`` turns ``fast_path`` (one of :data:`FAST_PATHS`) off."""
    if fast_path not in FAST_PATHS:
        raise KeyError(fast_path)
    return fast_path in get("CONCCL_DISABLE")


def markdown_table() -> str:
    """The table of :data:`VARS`, then one of :data:`FAST_PATHS`, as docs/usage.md carries them."""
    rows = ["| variable | for | kind | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for v in VARS:
        default = ",".join(v.default) if isinstance(v.default, tuple) else v.default
        default = "unset" if default in ("", ()) else str(default).lower() if isinstance(default, bool) else default
        rows.append(f"| `{v.name}` | {v.group} | {v.kind} | {default} | {v.meaning} |")
    rows += ["", "| `CONCCL_DISABLE` name | the fast path it turns off (off: the general path, the same results) |",
             "| --- | --- |"]
    rows += [f"| `{name}` | {meaning} |" for name, meaning in FAST_PATHS.items()]
    return "\n".join(rows) + "\n"


MARKERS = ("<!-- env-table -->\n", "<!-- /env-table -->")


def _write_table(path: str) -> None:
    """Replace what lies between :data:`MARKERS` in ``path`` with :func:`markdown_table`."""
    with open(path) as f:
        text = f.read()
    start, end = text.index(MARKERS[0]) + len(MARKERS[0]), text.index(MARKERS[1])
    with open(path, "w") as f:
        f.write(text[:start] + markdown_table() + text[end:])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        _write_table(sys.argv[2])
    elif len(sys.argv) == 1:
        print(markdown_table(), end="")
    else:
        sys.exit("usage: python -m conccl.env [--write docs/usage.md]")
