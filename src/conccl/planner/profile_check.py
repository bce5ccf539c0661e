"""What a hardware profile's numbers may be, checked where the profile is read.

Every number of a profile is divided by or multiplied into a time somewhere in the planner: a
0, a string, an empty list or a 1e-300 would surface as a ZeroDivisionError, a TypeError or an
infinite time deep inside it. Each is refused here instead, naming its field and the range
accepted. The ranges are wide (any GPU of any generation fits) but finite.
"""
from __future__ import annotations

import math

from ..errors import InvalidArgument
from ..schedule.pipeline import TPSchedule

RATE = (1e6, 1e18)  # flop/s or bytes/s of one GPU
SLOWDOWN = (0.01, 1e3)  # a time ratio: below 1 when losing SMs helps (memory-bound GEMMs)
SECONDS = (0.0, 60.0)  # a latency or a delay (added to a time: 0 is fine)
SWEEP_SECONDS = (1e-9, 60.0)  # a collective's time alone: a time divides, so not ~0
EFFICIENCY = (1e-3, 2.0)  # fraction of a peak a GEMM reaches
PERCENT = (-1e6, 1e6)  # percent of ideal, which explodes near an ideal of 1

# table -> depth of nested objects above its numbers, and each number's range by its key
# (None: by the table). Depths follow conccl.planner.profile.HardwareProfile's comments.
TABLES = {
    "gemm_efficiency": (1, {None: EFFICIENCY}),
    "collectives": (3, {"latency_s": SECONDS, "bus_bytes_per_s": RATE}),
    "gemm_sm_loss": (2, {None: SLOWDOWN}),
    "coll_cta_loss": (3, {None: SLOWDOWN}),
    "overlap": (3, {None: PERCENT}),
    "interference": (3, {"gemm": SLOWDOWN, "comm": SLOWDOWN, "delay_s": SECONDS, "n": (0, 1e9),
                         "rms_log_error": (0, 1e3)}),
}
REQUIRED = {"collectives": ("latency_s", "bus_bytes_per_s")}


class Refused(ValueError):
    """A field of the profile outside what it may be (the message names it)."""


def _number(v, where: str, lo: float, hi: float, open_low: bool = True) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v > hi or (v <= lo if open_low else v < lo):
        bound = f"({lo:g}, {hi:g}]" if open_low else f"[{lo:g}, {hi:g}]"
        raise Refused(f"field {where} must be a number in {bound}, got {v!r}")


def _objects(table, where: str, depth: int):
    """(path, object) of the objects ``depth`` levels down, refusing anything else above."""
    if not isinstance(table, dict):
        raise Refused(f"field {where} must be an object, got {type(table).__name__}")
    if depth == 0:
        yield where, table
        return
    for k, v in table.items():
        yield from _objects(v, f"{where}.{k}", depth - 1)


def check(p) -> None:
    """Refuse a profile (a HardwareProfile) whose fields are not what the planner can use."""
    if not isinstance(p.device, str) or not p.device:
        raise Refused(f"field device must be the GPU's name (a non-empty string), got {p.device!r}")
    for name, lo, hi in (("world", 2, 1024), ("sm_count", 1, 1e5), ("memory_bytes", 1, 1e15)):
        v = getattr(p, name)
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise Refused(f"field {name} must be a whole number from {lo} to {hi:g}, got {v!r}")
    if not isinstance(p.nvlinks, int) or isinstance(p.nvlinks, bool) or not 0 <= p.nvlinks <= 1024:
        raise Refused(f"field nvlinks must be a whole number from 0 to 1024, got {p.nvlinks!r}")
    for name in ("bf16_flops", "hbm_bytes_per_s", "nvlink_bytes_per_s"):
        _number(getattr(p, name), name, *RATE)
    if not isinstance(p.source, dict):
        raise Refused(f"field source must be an object, got {type(p.source).__name__}")
    for name, (depth, ranges) in TABLES.items():
        for where, obj in _objects(getattr(p, name), name, depth - 1):
            for key in REQUIRED.get(name, ()):
                if key not in obj:
                    raise Refused(f"field {where} lacks {key!r}")
            for k, v in obj.items():
                lo, hi = ranges.get(k, ranges.get(None, (0, math.inf)))
                _number(v, f"{where}.{k}", lo, hi, open_low=lo > 0 or name == "overlap")
    check_tp(p.tp)
    for where, sweep in (*_objects(p.comm_sweep, "comm_sweep", 1), *_objects(p.eager_sweep, "eager_sweep", 1)):
        for c, points in sweep.items():
            if not isinstance(points, list) or not points:
                raise Refused(f"field {where}.{c} must be a non-empty list of [bytes, seconds] pairs")
            for i, pt in enumerate(points):
                if not isinstance(pt, list) or len(pt) != 2:
                    raise Refused(f"field {where}.{c}[{i}] must be a [bytes, seconds] pair, got {pt!r}")
                _number(pt[0], f"{where}.{c}[{i}][0]", 0, 1e15)
                _number(pt[1], f"{where}.{c}[{i}][1]", *SWEEP_SECONDS)
            if [pt[0] for pt in points] != sorted(pt[0] for pt in points):
                raise Refused(f"field {where}.{c} must list its sizes in increasing order, got "
                              f"{[pt[0] for pt in points]!r}")


TP_MS = (1e-6, 6e4)  # one GEMM's milliseconds


def check_pipelines(p) -> None:
    """``tp.pipelines``: {"world": >= 2, "dtype": a name, op: {"MxKxN": {schedule: ratio}}, and
    "source": free text}, every ratio to the GEMM alone in (0.5, 1000]."""
    if not isinstance(p, dict):
        raise Refused(f"field tp.pipelines must be an object, got {type(p).__name__}")
    if not isinstance(p.get("world"), int) or isinstance(p.get("world"), bool) or p["world"] < 2:
        raise Refused("field tp.pipelines.world must be the whole number of GPUs (>= 2) the pipelines ran on")
    if not isinstance(p.get("dtype", "bfloat16"), str):
        raise Refused("field tp.pipelines.dtype must be a dtype name")
    for op, shapes in p.items():
        if op in ("world", "dtype", "source"):
            continue
        if op not in ("ag_gemm", "gemm_rs") or not isinstance(shapes, dict):
            raise Refused(f"field tp.pipelines.{op} must be ag_gemm or gemm_rs, mapping shapes to schedules")
        for shape, by in shapes.items():
            dims = str(shape).split("x")
            if len(dims) != 3 or not all(d.isdecimal() and d.isascii() and int(d) > 0 for d in dims):
                raise Refused(f"field tp.pipelines.{op} must be keyed by shapes MxKxN, got {shape!r}")
            if not isinstance(by, dict) or not by:
                raise Refused(f"field tp.pipelines.{op}.{shape} must map schedule names to ratios")
            for name, ratio in by.items():
                try:
                    TPSchedule.parse(name)
                except InvalidArgument:
                    raise Refused(f"field tp.pipelines.{op}.{shape} names no schedule: {name!r}") from None
                _number(ratio, f"tp.pipelines.{op}.{shape}.{name}", 0.5, 1000.0)


def check_tp(tp) -> None:
    """The ``tp`` table: every shape key ``MxKxN`` of positive whole numbers, every row count a
    positive whole number, every time in :data:`TP_MS` and every slowdown in :data:`SLOWDOWN`."""
    if not isinstance(tp, dict):
        raise Refused(f"field tp must be an object, got {type(tp).__name__}")
    if tp and not tp.get("rows_ms"):
        raise Refused("field tp.rows_ms must hold the row-chunk timings of at least one shape (or tp be empty)")
    pipelines = tp.get("pipelines", {})
    if pipelines:
        check_pipelines(pipelines)
    for name, rng in (("rows_ms", TP_MS), ("contention", SLOWDOWN)):
        for where, rows in _objects(tp.get(name, {}), f"tp.{name}", 1):
            dims = where.rsplit(".", 1)[-1].split("x")
            if len(dims) != 3 or not all(d.isdecimal() and d.isascii() and int(d) > 0 for d in dims):
                raise Refused(f"field {where} must be keyed by a shape MxKxN of positive whole numbers")
            if not rows:
                raise Refused(f"field {where} must map at least one row count to a number")
            for r, v in rows.items():
                if not (str(r).isdecimal() and str(r).isascii()) or int(r) < 1:
                    raise Refused(f"field {where} must map row counts (positive whole numbers) to numbers, got {r!r}")
                _number(v, f"{where}.{r}", *rng)
