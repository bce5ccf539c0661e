"""Study scenarios: a GEMM beside a collective, read from a suite file users can copy and edit.

A scenario's ``size`` is the bytes of the collective's output on each rank (all-gather: the
gathered tensor; all-to-all: the received tensor, which equals the sent one), in powers of
1024. The same meaning holds in the suite file, on the command line, in the report and in
``conccl bench``. A GEMM is C[M x N] = A[M x K] @ B[K x N] in the suite's dtype (bf16).
"""
from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

from ..collectives import REGISTRY, STUDIED as COLLECTIVES
from ..jsonfile import read_json
from ..units import format_size, parse_size

DEFAULT_SUITE = pathlib.Path(__file__).with_name("suite.json")
SUITE_FORMAT = "conccl-suite/1"
DTYPE_BYTES = {"bfloat16": 2, "float16": 2}
ALIGN = 4096  # every rank's chunk is a whole number of 4 KiB pages
# The fields a suite may hold: a misspelt one ("colectives") would otherwise be ignored silently.
SUITE_FIELDS = {"format", "about", "size_unit", "dtype", "gemms", "scenarios"}
GEMM_FIELDS = {"mnk", "source", "paper_class"}
SCENARIO_FIELDS = {"gemm", "size", "tag", "collectives", "source", "paper_taxonomy", "quick"}


class SuiteError(ValueError):
    """A malformed suite file, scenario or command-line scenario."""


@dataclass(frozen=True)
class Gemm:
    tag: str
    m: int
    n: int
    k: int
    source: str = ""
    paper_class: str | None = None

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def bytes(self, esize: int = 2) -> int:
        """Compulsory HBM traffic: read A and B once, write C once."""
        return esize * (self.m * self.k + self.k * self.n + self.m * self.n)

    @property
    def mnk(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


@dataclass(frozen=True)
class Scenario:
    tag: str
    gemm: Gemm
    collective: str
    size: int  # bytes of the collective's output per rank, before rounding to the world
    source: str = ""
    paper_taxonomy: str | None = None
    quick: bool = False
    dtype: str = "bfloat16"

    @property
    def id(self) -> str:
        return f"{self.tag}/{self.collective}"

    def size_for(self, world: int) -> int:
        """The bytes actually moved: rounded down to world x 4 KiB (at least one unit)."""
        unit = world * ALIGN
        return max(unit, self.size // unit * unit)

    def memory_bytes(self, world: int) -> int:
        """GPU memory one rank needs for this scenario (GEMM operands + collective buffers)."""
        esize = DTYPE_BYTES[self.dtype]
        return self.gemm.bytes(esize) + REGISTRY[self.collective].buffer_bytes(self.size_for(world), world)


def parse_gemm(text: str, tag: str | None = None) -> Gemm:
    """'8192x8192x8192' (M x N x K) -> Gemm; every dimension a positive integer."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\d+)\s*[xX*]\s*(\d+)\s*", str(text))
    if not m:
        raise SuiteError(f"malformed GEMM shape {text!r}: expected MxNxK, e.g. 8192x8192x8192")
    dims = [int(g) for g in m.groups()]
    if min(dims) < 1:
        raise SuiteError(f"GEMM shape {text!r} has a zero dimension")
    return Gemm(tag or f"gemm_{dims[0]}x{dims[1]}x{dims[2]}", *dims)


def _check_collective(name: str, where: str) -> str:
    """A registered collective. Those not ``studied`` by default (reduce-scatter, all-reduce) run
    where a suite or ``--collective`` names them."""
    if name not in REGISTRY:
        raise SuiteError(f"{where}: unknown collective {name!r}; known: {', '.join(REGISTRY)}")
    return name


def _size(text, where: str) -> int:
    try:
        return parse_size(text, whole=False)
    except Exception as e:  # argparse.ArgumentTypeError
        raise SuiteError(f"{where}: {e}") from None


def parse_suite(data: dict, origin: str = "suite") -> list[Scenario]:
    """Scenarios of a suite document (see ``suite.json``); one per (entry, collective)."""
    if not isinstance(data, dict) or data.get("format") != SUITE_FORMAT:
        raise SuiteError(f"{origin}: not a conccl suite (expected \"format\": \"{SUITE_FORMAT}\")")
    _known_fields(data, SUITE_FIELDS, origin)
    dtype = data.get("dtype", "bfloat16")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise SuiteError(f"{origin}: dtype {dtype!r} is not supported; use one of {', '.join(DTYPE_BYTES)}")
    gemms = {}
    if not isinstance(data.get("gemms", {}), dict):
        raise SuiteError(f"{origin}: \"gemms\" must be an object of tag: {{\"mnk\": \"MxNxK\"}}")
    for tag, g in (data.get("gemms") or {}).items():
        if not isinstance(g, dict) or "mnk" not in g:
            raise SuiteError(f"{origin}: GEMM {tag!r} needs an \"mnk\" field")
        _known_fields(g, GEMM_FIELDS, f"{origin}: GEMM {tag!r}")
        base = parse_gemm(g["mnk"], tag)
        gemms[tag] = Gemm(tag, base.m, base.n, base.k, g.get("source", ""), g.get("paper_class"))
    entries = data.get("scenarios")
    if not isinstance(entries, list) or not entries:
        raise SuiteError(f"{origin}: \"scenarios\" must be a non-empty list")
    out, seen = [], set()
    for i, e in enumerate(entries):
        where = f"{origin}: scenario {i + 1}"
        if not isinstance(e, dict):
            raise SuiteError(f"{where}: expected an object")
        for key in ("gemm", "size"):
            if key not in e:
                raise SuiteError(f"{where}: missing field {key!r}")
        _known_fields(e, SCENARIO_FIELDS, where)
        if not isinstance(e.get("quick", False), bool):
            raise SuiteError(f"{where}: \"quick\" must be true or false, got {e['quick']!r}")
        if not isinstance(e["size"], (str, int, float)) or isinstance(e["size"], bool):
            raise SuiteError(f"{where}: \"size\" must be bytes as a number or a string like \"1G\", got {e['size']!r}")
        g = e["gemm"]
        gemm = gemms.get(g) if isinstance(g, str) and g in gemms else None
        if gemm is None:
            if isinstance(g, str) and re.search(r"\d\s*[xX*]\s*\d", g):
                gemm = parse_gemm(g)
            else:
                raise SuiteError(f"{where}: unknown GEMM {g!r}; define it under \"gemms\" or give MxNxK")
        size = _size(e["size"], where)
        tag = e.get("tag") or f"{gemm.tag}_{format_size(size)}"
        colls = e.get("collectives", list(COLLECTIVES))
        colls = colls if isinstance(colls, list) else [colls]
        if not colls or not all(isinstance(c, str) for c in colls):
            raise SuiteError(f"{where}: \"collectives\" must name one or more of {', '.join(REGISTRY)}")
        for c in colls:
            s = Scenario(tag, gemm, _check_collective(c, where), size, e.get("source", ""),
                         e.get("paper_taxonomy"), bool(e.get("quick", False)), dtype)
            if s.id in seen:
                raise SuiteError(f"{where}: scenario {s.id} appears twice")
            seen.add(s.id)
            out.append(s)
    return out


def _known_fields(obj: dict, known: set, where: str) -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        raise SuiteError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}")


def load_suite(path: str | pathlib.Path | None = None) -> list[Scenario]:
    path = pathlib.Path(path) if path else DEFAULT_SUITE
    return parse_suite(read_json(path, SuiteError, "suite file"), str(path))


def scenario_from_args(gemm: str, collective: str, size: str) -> list[Scenario]:
    """``--gemm MxNxK --collective NAME|all --size 1G`` -> scenarios (all: the studied ones)."""
    try:
        g = parse_gemm(gemm)
    except SuiteError as e:
        raise SuiteError(f"--gemm: {e}") from None
    nbytes = _size(size, "--size")
    colls = list(COLLECTIVES) if collective in (None, "all") else [collective]
    return [Scenario(f"{g.tag}_{format_size(nbytes)}", g, _check_collective(c, "--collective"), nbytes,
                     "command line") for c in colls]


def select(scenarios: list[Scenario], quick: bool = False, only: str | None = None) -> list[Scenario]:
    """The ``--quick`` subset and/or the ``--only`` tags or ids (comma-separated)."""
    if quick:
        scenarios = [s for s in scenarios if s.quick] or scenarios[:2]
    if only is not None:
        wanted = [w.strip() for w in only.split(",") if w.strip()]
        if not wanted:
            raise SuiteError(f"--only {only!r}: names no scenario; give comma-separated tags or ids, e.g. "
                             f"--only {scenarios[0].tag if scenarios else 'TAG'}")
        known = {s.tag for s in scenarios} | {s.id for s in scenarios}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise SuiteError(f"--only: unknown scenario(s) {', '.join(unknown)}; known tags: "
                             f"{', '.join(sorted({s.tag for s in scenarios}))}")
        scenarios = [s for s in scenarios if s.tag in wanted or s.id in wanted]
    return scenarios
