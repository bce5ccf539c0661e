"""``conccl bench graphs``: small collectives in a CUDA graph and eager, against NCCL.

What it measures and its output (``graphs.json``, ``graphs.md``); the run on the GPUs is
:mod:`conccl.bench.graphs_run`. Nothing here needs a GPU.

For each collective, size (output bytes per rank, bf16) and implementation (``nccl``, ``conccl``
as the config's :class:`~conccl.bench.variant.Variant` asks, ``conccl_auto``, ``conccl_one_shot``
if asked for: :mod:`conccl.bench.impls`), in one process per GPU, in the modes asked for:

- ``graph``: ``calls`` calls of the collective captured into one CUDA graph, ``warmup``
  replays, then ``runs`` timed runs of ``replays`` replays each between two CUDA events;
- ``eager``: the same ``calls`` calls queued back to back, ``replays`` times per timed run;
- ``beside`` (asked for with ``--modes``): one eager call queued while a bf16 8192^3 GEMM
  holds the SMs (four queued on another stream of normal priority; the call is queued once
  the first runs), ``runs`` times: ``us_per_call`` is the time from the call's queueing (an
  event on its idle stream) to its completion, ``alone_us`` the same without the GEMMs, and
  ``gemm_slowdown`` the four GEMMs' time beside the call over their time alone (a call that needs an SM waits for the running GEMM to end; copy engines do not).
  The three kinds of try take turns, run by run. Both times include the eager call's host
  time and what skew is left after the ranks' hosts meet right before it: tens of
  microseconds of noise, against the milliseconds a call that needs an SM loses.

``us_per_call`` is a run's time over ``calls * replays``: the median over runs of the slowest
rank (each run's time is the largest of any rank's), with the fastest and slowest run beside
it. Every case is checked once before it is timed: the output of one graph replay (or of the
``calls`` eager calls) against what NCCL produces from the same inputs, bit for bit, counting
wrong elements. The inputs are small whole numbers (:func:`conccl.bench.run.make_case`), so
the expected bytes are exact; an in-place all-reduce repeated ``calls`` times is compared with
NCCL's eager result of the same ``calls`` calls.

A conccl call captured into a graph holds graph workspace of its own (``docs/api.md``, CUDA
graphs) for good: every conccl case that captures reserves what its calls need, and its conccl
group is destroyed after it. Where ``calls`` calls would need more than ``graph_workspace_bytes``,
fewer are captured (at least one) and the eager mode of that size queues as many.
"""
from __future__ import annotations

import json
import math
import pathlib
import statistics
from dataclasses import asdict, dataclass, fields

from ..collectives import REGISTRY as COLLECTIVES
from ..jsonfile import write_text
from ..planner.eager import ALWAYS
from ..units import format_size
from .variant import Variant

FORMAT = "conccl-bench-graphs/1"
MODES = ("graph", "eager", "beside")
DEFAULT_MODES = ("graph", "eager")
BESIDE_GEMMS = 4  # bf16 8192^3 GEMMs queued on another stream in the beside mode
BESIDE_GEMM_N = 8192
IMPLS = ("nccl", "conccl", "conccl_auto")  # what this benchmark runs; NCCL first: every ratio is to it
KNOWN_IMPLS = IMPLS + ("conccl_one_shot",)  # --impls may add the one-shot calls (conccl.bench.impls)
BASELINE = "nccl"
# Whether an implementation's calls are conccl's: those reserve graph workspace before a capture
# and have their conccl group destroyed after it (and their conccl.empty arenas with it).
USES_CONCCL_GROUP = {"nccl": False, **{name: True for name in KNOWN_IMPLS if name.startswith("conccl")}}
DEFAULT_SIZES = tuple(4096 << (2 * i) for i in range(9))  # 4K, 16K, ... 256M
MAX_SIZE = 32 << 30  # more per rank than any GPU of a node holds with its input beside it
CAPTURE_ALIGN = 256  # a captured call's workspace region rounds up to this (CudaCopyEngineExecutor.capture_call)
BYTES_MEANING = "output bytes per rank (nccl-tests' size)"
# The goals checked in the table: (mode, implementation, collectives (None: every one),
# size (None: every size), largest ratio to NCCL allowed).
GOALS = (
    ("graph", "conccl", ("all_gather", "all_to_all"), 1 << 20, 1.0),
    ("graph", "conccl", ("all_gather", "all_to_all"), 64 << 10, 0.8),
    ("eager", "conccl_auto", None, None, 1.05),
)


@dataclass(frozen=True)
class GraphsConfig:
    """One run of the benchmark; ValueError (naming the flag) for values it cannot run."""

    sizes: tuple[int, ...] = DEFAULT_SIZES
    collectives: tuple[str, ...] = tuple(COLLECTIVES)
    impls: tuple[str, ...] = IMPLS
    modes: tuple[str, ...] = DEFAULT_MODES
    variant: Variant = Variant()  # how the conccl implementation calls (--tensors, --algorithm, --stream-mode)
    calls: int = 20
    replays: int = 10
    runs: int = 5
    warmup: int = 3
    graph_workspace_bytes: int = 4 << 30

    def __post_init__(self):
        bad = [s for s in self.sizes if not _whole(s) or not 1 <= s <= MAX_SIZE]
        if bad or not self.sizes:
            shown = (format_size(bad[0]) if _whole(bad[0]) and bad[0] > 0 else repr(bad[0])) if bad else "none"
            raise ValueError(f"--sizes: {shown} given; expected sizes from 1 byte to {format_size(MAX_SIZE)} per rank")
        for flag, given, known in (("--collectives", self.collectives, tuple(COLLECTIVES)),
                                   ("--impls", self.impls, KNOWN_IMPLS), ("--modes", self.modes, MODES)):
            unknown = [g for g in given if g not in known]
            if unknown or not given or len(set(given)) != len(given):
                what = f"unknown {', '.join(map(repr, unknown))}" if unknown else "none given" if not given else \
                    "one given twice"
                raise ValueError(f"{flag}: {what}; choose from {', '.join(known)}")
        for flag, value, lo in (("--calls", self.calls, 1), ("--replays", self.replays, 1), ("--runs", self.runs, 1),
                                ("--warmup", self.warmup, 0), ("--graph-workspace", self.graph_workspace_bytes, 0)):
            if not _whole(value) or value < lo:
                raise ValueError(f"{flag} must be a whole number >= {lo}, got {value!r}")


@dataclass(frozen=True)
class GraphsRecord:
    """One (collective, size, implementation, mode) of ``graphs.json``'s ``results``.

    ``bytes``: output bytes per rank. ``us_per_call``: median over the timed runs of the slowest
    rank; ``us_min`` / ``us_max``: the fastest and slowest run; ``us_runs``: every run.
    ``calls_per_graph``: calls per graph (eager: per group of calls), ``replays``: graphs (or
    groups) per run. ``wrong``: elements that differ from NCCL's result. ``path``: where a
    ``conccl_auto`` or ``conccl_one_shot`` call went (``Work.path``: ``copy_engines``, ``nccl`` or
    ``one_shot``); ``nccl_below``: the output size below which ``set_eager_path("auto")`` sends
    this collective to NCCL.
    ``error``: why the case has no figures. The ``beside`` mode's: ``alone_us`` (median of one
    call's time with no GEMM) and ``gemm_slowdown`` (the GEMMs' median time beside the call
    over their median alone)."""

    collective: str
    bytes: int
    impl: str
    mode: str
    us_per_call: float | None = None
    us_min: float | None = None
    us_max: float | None = None
    us_runs: tuple[float, ...] = ()
    calls_per_graph: int = 1
    replays: int = 1
    wrong: int | None = None
    path: str | None = None
    nccl_below: int | None = None
    error: str | None = None
    alone_us: float | None = None
    gemm_slowdown: float | None = None

    def __post_init__(self):
        for name in ("collective", "impl"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"record {name}: expected a name, got {getattr(self, name)!r}")
        if self.mode not in MODES:
            raise ValueError(f"record mode: expected one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("bytes", "calls_per_graph", "replays"):
            if not _whole(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"record {name}: expected a whole number >= 1, got {getattr(self, name)!r}")
        for name in ("wrong", "nccl_below"):
            v = getattr(self, name)
            if v is not None and (not _whole(v) or v < 0):
                raise ValueError(f"record {name}: expected a whole number >= 0 or null, got {v!r}")
        for name in ("path", "error"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"record {name}: expected text or null, got {getattr(self, name)!r}")
        if not isinstance(self.us_runs, tuple) or not all(_time(t) for t in self.us_runs):
            raise ValueError(f"record us_runs: expected times > 0 in us, got {self.us_runs!r}")
        for name in ("alone_us", "gemm_slowdown"):
            v = getattr(self, name)
            if v is not None and not _time(v):
                raise ValueError(f"record {name}: expected a number > 0 or null, got {v!r}")
        times = (self.us_per_call, self.us_min, self.us_max)
        if self.error is None:
            if not all(_time(t) for t in times) or not self.us_min <= self.us_per_call <= self.us_max:
                raise ValueError(f"record {self.collective} {self.bytes} {self.impl} {self.mode}: expected "
                                 f"0 < us_min <= us_per_call <= us_max, got {times}")
            if self.wrong is None:
                raise ValueError(f"record {self.collective} {self.bytes} {self.impl} {self.mode}: not checked (wrong)")
        elif any(t is not None and not _time(t) for t in times):
            raise ValueError(f"record times: expected times > 0 in us or null, got {times}")

    @classmethod
    def from_dict(cls, d: dict) -> "GraphsRecord":
        """The record a ``graphs.json`` result holds; ValueError naming what is wrong with it."""
        if not isinstance(d, dict):
            raise ValueError(f"a result must be an object, got {type(d).__name__}")
        if unknown := sorted(set(d) - {f.name for f in fields(cls)}):
            raise ValueError(f"result has unknown fields {unknown}")
        if missing := [k for k in ("collective", "bytes", "impl", "mode") if k not in d]:
            raise ValueError(f"result lacks {missing}")
        if not isinstance(runs := d.get("us_runs", ()), (list, tuple)):
            raise ValueError(f"record us_runs: expected a list, got {runs!r}")
        return cls(**{**d, "us_runs": tuple(runs)})

    def to_dict(self) -> dict:
        return {**asdict(self), "us_runs": list(self.us_runs)}


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _time(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


# ---------------------------------------------------------------------- pure helpers
def parse_list(text: str, flag: str, parse=str) -> tuple:
    """'a,b' -> (parse('a'), parse('b')); blanks dropped; ValueError naming ``flag``."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise ValueError(f"{flag}: none given in {text!r}")
    try:
        return tuple(parse(t) for t in items)
    except (ValueError, TypeError) as e:  # argparse.ArgumentTypeError is neither: see parse_sizes
        raise ValueError(f"{flag}: {e}") from None


def graph_workspace_per_call(coll, size: int, world: int, staged_push: bool = False) -> int:
    """Graph workspace one captured conccl call of ``coll`` may take at ``size`` output bytes
    per rank, by default or as a ``staged_push`` (:meth:`Collective.graph_workspace_bytes`)."""
    return coll.graph_workspace_bytes(size, world, staged_push) + CAPTURE_ALIGN


def calls_per_graph(calls: int, per_call_bytes: int, budget_bytes: int) -> int:
    """``calls``, or fewer (at least 1) where ``calls`` captured calls would need more graph
    workspace than ``budget_bytes``."""
    if per_call_bytes <= 0:
        return calls
    return max(1, min(calls, budget_bytes // per_call_bytes))


def per_call_us(elapsed_ms: float, calls: int, replays: int) -> float:
    """A timed run's CUDA-event time (ms) per call (us): ``replays`` units of ``calls`` calls."""
    return elapsed_ms * 1e3 / (calls * replays)


def summarize(us_runs) -> dict:
    """Median, fastest and slowest of the runs' us per call (the record's time fields)."""
    us = [float(t) for t in us_runs]
    return {"us_per_call": statistics.median(us), "us_min": min(us), "us_max": max(us), "us_runs": tuple(us)}


# ---------------------------------------------------------------------- the output
def _below_text(nbytes: int) -> str:
    """A ``nccl_below`` size in words: conccl.planner.eager.ALWAYS (conccl lost at every
    measured size) is "every size", not a number of terabytes."""
    return "every size" if nbytes >= ALWAYS else format_size(nbytes)


def document(meta: dict, cfg: GraphsConfig, records, eager_path=None) -> dict:
    """``graphs.json``: where it ran (machine_kind, commit, versions, world), what it ran, results."""
    return {"format": FORMAT, **meta, "bytes": BYTES_MEANING, "dtype": "bfloat16",
            "config": {**asdict(cfg), "sizes": list(cfg.sizes)}, "eager_path": eager_path,
            "results": [r.to_dict() if isinstance(r, GraphsRecord) else GraphsRecord.from_dict(r).to_dict()
                        for r in records]}


def write(out_dir, doc: dict) -> None:
    """``graphs.json`` and ``graphs.md`` in ``out_dir`` (each whole or not at all)."""
    out = pathlib.Path(out_dir)
    write_text(out / "graphs.json", json.dumps(doc, indent=1, default=str) + "\n")
    write_text(out / "graphs.md", markdown(doc))


def records_of(doc: dict) -> list[GraphsRecord]:
    """The results of a ``graphs.json`` document, checked; ValueError naming a bad one."""
    if doc.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} document (format {doc.get('format')!r})")
    if not isinstance(results := doc.get("results"), list):
        raise ValueError("results: expected a list")
    out = []
    for i, r in enumerate(results):
        try:
            out.append(GraphsRecord.from_dict(r))
        except (TypeError, ValueError) as e:
            raise ValueError(f"results[{i}]: {e}") from None
    return out


def _ratio(rec: GraphsRecord | None, base: GraphsRecord | None) -> float | None:
    if rec is None or base is None or rec.us_per_call is None or base.us_per_call is None:
        return None
    return rec.us_per_call / base.us_per_call


def _cell(rec: GraphsRecord | None) -> str:
    return "" if rec is None else "err" if rec.error is not None else f"{rec.us_per_call:.1f}"


def _goal_rows(by: dict, collectives, sizes) -> list[str]:
    rows = []
    for mode, impl, colls, size, limit in GOALS:
        what = (f"{'in a graph' if mode == 'graph' else 'eager'}, "
                f"{format_size(size) if size else 'every size'}: {impl} <= {limit:.2f}x NCCL")
        for coll in collectives:
            if colls is not None and coll not in colls:
                continue
            ratios = [(s, _ratio(by.get((coll, s, impl, mode)), by.get((coll, s, BASELINE, mode))))
                      for s in sizes if size is None or s == size]
            ratios = [(s, r) for s, r in ratios if r is not None]
            if not ratios:
                rows.append(f"| {what} | {coll} | not measured | |")
                continue
            s, worst = max(ratios, key=lambda x: x[1])
            shown = f"{worst:.2f}x" + ("" if size else f" (worst, at {format_size(s)})")
            rows.append(f"| {what} | {coll} | {shown} | {'yes' if worst <= limit else 'no'} |")
    return rows


def _profile_text(p: dict) -> str:
    """Which profile ``set_eager_path('auto')`` chose (conccl.planner.shipped), in words."""
    how = {"shipped": "shipped for this GPU", "fallback": "BORROWED (no shipped profile matches this GPU)",
           "given": "given"}.get(p.get("chosen"), p.get("chosen", "?"))
    eager = p.get("eager_sweep") if isinstance(p.get("eager_sweep"), dict) else None
    return (f"{p.get('file', '?')} ({how}; {p.get('device')} x{p.get('world')}, measured on "
            f"{p.get('machine_kind', '?')} {p.get('date', '?')}"
            + (f"; its eager sweep on {eager.get('machine_kind', '?')} {eager.get('date', '?')}" if eager else "") + ")")


def markdown(doc: dict) -> str:
    """``graphs.md``: per collective and mode, us per call of each implementation by size and
    its ratio to NCCL's in the same mode; the goals (:data:`GOALS`) checked at the top."""
    recs = records_of(doc)
    cfg = doc.get("config", {})
    by = {(r.collective, r.bytes, r.impl, r.mode): r for r in recs}
    collectives = list(dict.fromkeys(r.collective for r in recs))
    impls = sorted(dict.fromkeys(r.impl for r in recs), key=lambda i: (i != BASELINE, KNOWN_IMPLS.index(i) if i in KNOWN_IMPLS else 99))
    others = [i for i in impls if i != BASELINE]
    sizes = sorted({r.bytes for r in recs})
    calls = sorted({r.calls_per_graph for r in recs if r.error is None}) or [cfg.get("calls", "?")]
    below = {r.collective: r.nccl_below for r in recs if r.nccl_below is not None}
    lines = [
        f"# Small collectives in a CUDA graph and eager ({doc.get('machine_kind')}, {doc.get('date')})", "",
        f"commit {doc.get('commit')}, {doc.get('world')} x {doc.get('device')}, torch {doc.get('torch')}, "
        f"NCCL {doc.get('nccl')}, cuda-python {doc.get('cuda_python')}; {doc.get('dtype', 'bfloat16')}; "
        f"size: {doc.get('bytes', BYTES_MEANING)}.", "",
        f"us per call: the median of {cfg.get('runs', '?')} timed runs, each run's time that of the slowest rank; "
        f"a run is {cfg.get('replays', '?')} replays of one graph of {_calls_text(calls)} captured calls (graph), or "
        f"the same calls queued back to back as many times (eager), after {cfg.get('warmup', '?')} untimed. "
        "x NCCL: the time over NCCL's in the same mode (below 1: faster). #wrong: elements differing from NCCL's "
        "result, summed over the row's implementations (each case is checked once). path: where a conccl_auto or "
        "conccl_one_shot call went (Work.path). The JSON has every run and the fastest and slowest.",
        *(["", f"conccl calls: {Variant(**cfg['variant']).describe()}."] if "conccl" in impls and cfg.get("variant") else []),
        *(["", "conccl_auto (`set_eager_path('auto')`) sends an eager call to NCCL below: "
           + ", ".join(f"{c} {_below_text(b)}" for c, b in below.items()) + "."] if below else []),
        *(["", f"conccl_auto planned with the hardware profile {_profile_text(doc['eager_path']['profile'])}."]
          if (doc.get("eager_path") or {}).get("profile") else []),
        "", "## Goals", "", "| goal | collective | measured | met |", "| --- | --- | --- | --- |",
        *_goal_rows(by, collectives, sizes),
    ]
    for coll in collectives:
        for mode in MODES:
            rows = [s for s in sizes if any((coll, s, i, mode) in by for i in impls)]
            if not rows:
                continue
            if mode == "beside":
                lines += _beside_table(coll, rows, impls, by)
                continue
            pathed = [i for i in others if any(by.get((coll, s, i, mode)) and by[(coll, s, i, mode)].path for s in rows)]
            head = ["size"] + ([f"{BASELINE} (us)"] if BASELINE in impls else [])
            for i in others:
                head += [f"{i} (us)", "x NCCL"]
            head += [f"{i} path" for i in pathed] + ["#wrong"]
            lines += ["", f"## {coll}, {'in a graph' if mode == 'graph' else 'eager'}", "",
                      "| " + " | ".join(head) + " |", "| " + " | ".join("---:" for _ in head) + " |"]
            for s in rows:
                base = by.get((coll, s, BASELINE, mode))
                cells = [format_size(s)] + ([_cell(base)] if BASELINE in impls else [])
                for i in others:
                    r = by.get((coll, s, i, mode))
                    ratio = _ratio(r, base)
                    cells += [_cell(r), "" if ratio is None else f"{ratio:.2f}"]
                cells += [(by.get((coll, s, i, mode)).path or "") if by.get((coll, s, i, mode)) else "" for i in pathed]
                row = [by.get((coll, s, i, mode)) for i in impls]
                wrong = sum(r.wrong or 0 for r in row if r is not None)
                errors = [r for r in row if r is not None and r.error is not None]
                cells.append(f"{wrong}" + (f", {len(errors)} failed" if errors else ""))
                lines.append("| " + " | ".join(cells) + " |")
    failed = [r for r in recs if r.error is not None]
    if failed:
        lines += ["", "## Failed cases", ""]
        lines += [f"- {r.collective} {format_size(r.bytes)} {r.impl} {r.mode}: {r.error}" for r in failed]
    return "\n".join(lines) + "\n"


def _beside_table(coll: str, sizes, impls, by: dict) -> list[str]:
    """The beside mode's table: per implementation, one call's time alone, its completion
    beside the running GEMMs, what the GEMMs added, and the GEMMs' slowdown."""
    head = ["size"]
    for i in impls:
        head += [f"{i} alone (us)", "beside (us)", "+us", "GEMMs x"]
    lines = ["", f"## {coll}, beside running bf16 {BESIDE_GEMM_N}^3 GEMMs (one call, queued while the first runs)",
             "", "| " + " | ".join(head + ["#wrong"]) + " |", "| " + " | ".join("---:" for _ in head + [0]) + " |"]
    for s in sizes:
        cells, wrong = [format_size(s)], 0
        for i in impls:
            r = by.get((coll, s, i, "beside"))
            if r is None or r.error is not None or r.alone_us is None:
                cells += ["err" if r is not None and r.error else ""] + [""] * 3
                continue
            wrong += r.wrong or 0
            cells += [f"{r.alone_us:.1f}", f"{r.us_per_call:.1f}", f"{r.us_per_call - r.alone_us:+.1f}",
                      "" if r.gemm_slowdown is None else f"{r.gemm_slowdown:.3f}"]
        lines.append("| " + " | ".join(cells + [str(wrong)]) + " |")
    return lines


def _calls_text(calls: list[int]) -> str:
    if len(calls) == 1:
        return str(calls[0])
    return f"{max(calls)} (fewer, down to {min(calls)}, at the largest sizes: see calls_per_graph)"
