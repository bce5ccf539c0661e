"""What a study's numbers may be, checked where results.json is read (:func:`conccl.study.results.from_dict`).

The formulas (:mod:`conccl.study.metrics`) divide by times, sizes and rates: a 0, a negative, a
NaN or an infinity let through here would surface as a ZeroDivisionError in a report, or as a
negative, infinite or NaN time, speedup or efficiency in its tables. Each is refused instead,
naming its field (the path of attribute names, as in the JSON) and the value. Types are checked
before this, by the reader.
"""
from __future__ import annotations

import math

from ..collectives import REGISTRY

MAX_MS = 1e7  # a kernel timed at more than ~3 hours is a corrupt file, not a measurement


class Refused(ValueError):
    """A field of the results outside what it may be (the message names it)."""


def _number(v, where: str, lo: float = 0.0, hi: float = math.inf, zero: bool = False) -> None:
    """``v`` finite, above ``lo`` (or equal to it where ``zero``) and at most ``hi``."""
    if not (math.isfinite(v) and (v >= lo if zero else v > lo) and v <= hi):
        above = f"{'>=' if zero else '>'} {lo:g}"
        bound = above if hi == math.inf else f"{'[' if zero else '('}{lo:g}, {hi:g}]"
        raise Refused(f"{where} must be a number {bound}, got {v!r}")


def _timing(t, where: str, note: str = "") -> None:
    """Each of a Timing's milliseconds: a report shows the spread beside the median."""
    if t is None:
        return
    for name in ("median", "min", "max"):
        v = getattr(t, name)
        if not (math.isfinite(v) and 0 < v <= MAX_MS):
            raise Refused(f"{where}.{name}{note}: a time must be a number of milliseconds in (0, {MAX_MS:g}], "
                          f"got {v!r}")


def check(res) -> None:
    """Refuse results (a StudyResults) whose numbers the formulas cannot use; every scenario
    also needs its GEMM's time."""
    _number(res.config.world, "config.world", 1)
    if res.config.min_timed_ms is not None:  # 0: no minimum (study.measure.timed_iterations)
        _number(res.config.min_timed_ms, "config.min_timed_ms", 0, MAX_MS, zero=True)
    if res.machine is not None:
        _number(res.machine.world, "machine.world", 1)
    if res.wall_s is not None:
        _number(res.wall_s, "wall_s")
    for name in ("bf16_flops", "hbm_bytes_per_s", "nvlink_bytes_per_s", "op_to_byte"):
        if getattr(res.peaks, name) is not None:
            _number(getattr(res.peaks, name), f"peaks.{name}")
    for impl, fits in res.peaks.collective_fits.items():
        for c, fit in fits.items():
            _number(fit.bytes_per_s, f"peaks.collective_fits.{impl}.{c}.bytes_per_s")
            _number(fit.latency_s, f"peaks.collective_fits.{impl}.{c}.latency_s", zero=True)
    for tag, counters in res.ncu.items():
        if tag == "error":
            continue
        if not isinstance(counters, dict):
            raise Refused(f"ncu.{tag}: expected an object of positive byte counts, got {type(counters).__name__}")
        for k, v in counters.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise Refused(f"ncu.{tag}.{k}: expected a positive number, got {v!r}")
            _number(v, f"ncu.{tag}.{k}")

    for table in ("gemm_sm_loss", "coll_sizes", "eager_sizes", "coll_ctas"):
        for i, r in enumerate(getattr(res, table)):
            _timing(r.time_ms, f"{table}[{i}].time_ms")
    for i, r in enumerate(res.copy_beside_gemm):
        for name in ("gemm_ms", "copy_ms", "together_ms"):
            _timing(getattr(r, name), f"copy_beside_gemm[{i}].{name}")
        _number(r.copy_bytes, f"copy_beside_gemm[{i}].copy_bytes")
    for i, s in enumerate(res.scenarios):
        where, note = f"scenarios[{i}]", f" (scenario {s.id})"
        if s.t_gemm is None:
            raise Refused(f"{where}.t_gemm{note}: no GEMM time; re-create the file with `conccl study`")
        if s.collective not in REGISTRY:
            raise Refused(f"{where}.collective{note}: unknown collective {s.collective!r}; known: "
                          f"{', '.join(REGISTRY)}")
        _timing(s.t_gemm, f"{where}.t_gemm", note)
        _number(s.size, f"{where}.size{note}")
        for dim in ("m", "n", "k", "flops", "bytes"):
            _number(getattr(s.gemm, dim), f"{where}.gemm.{dim}{note}")
        if s.hbm_bytes is not None:  # divided by the times into the HBM rates a report shows
            _number(s.hbm_bytes.gemm, f"{where}.hbm_bytes.gemm{note}")
            _number(s.hbm_bytes.comm, f"{where}.hbm_bytes.comm{note}")
        if s.auto_in_turns is not None:
            _timing(s.auto_in_turns.best_ms, f"{where}.auto_in_turns.best_ms", note)
            _timing(s.auto_in_turns.auto_ms, f"{where}.auto_in_turns.auto_ms", note)
        for impl, t in s.t_comm.items():
            _timing(t, f"{where}.t_comm.{impl}", note)
            tg, tc = s.t_gemm.median, t.median
            if tg + tc == max(tg, tc):  # an ideal speedup of exactly 1: percent of ideal divides by 0
                raise Refused(f"{where}{note}: t_gemm.median {tg!r} and t_comm.{impl}.median {tc!r} ms are too far "
                              "apart to be measured together")
        for name, runs in s.runs.items():
            for j, r in enumerate(runs):
                _timing(r.time_ms, f"{where}.runs.{name}[{j}].time_ms", note)
