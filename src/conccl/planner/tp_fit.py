"""The tensor-parallel planner from whole pipelines timed on several GPUs (``conccl bench tp``
on >= 2 GPUs, kept as the characterization table's ``pipelines``): the table made from the
bench's results (:func:`pipelines_from_bench`), the times of one shape (:func:`measured_pipelines`),
and the model's fixed costs per call and per step fitted to them (:func:`fit_overheads`).

One GPU cannot see what a pipeline exposes before its first step, nor the copies' contention,
so the model alone misses by 3-13%; a shape measured at the world size asked is planned from
its timed pipelines instead (:func:`conccl.planner.tp.choose`).
"""
from __future__ import annotations

import dataclasses
import statistics

from ..errors import InvalidArgument
from ..schedule.tp_schedule import TPSchedule
from .tp_model import OPS, TPModel, predict


# The per-step least times fit_overheads tries, in us: every 6 us to 60, then every 2 us
# around the best (the model is fitted once per process; each try replays every timed run).
_STEP_COARSE_US, _STEP_FINE_US = tuple(range(0, 61, 6)), (-4, -2, 2, 4)


def fit_overheads(model: TPModel) -> tuple[float, float] | None:
    """(call overhead, step overhead) in seconds that bring the model nearest to the pipelines
    timed on several GPUs (least mean relative error over every op, shape and schedule timed):
    for each step overhead tried (0-60 us, :data:`_STEP_COARSE_US` then :data:`_STEP_FINE_US`
    around the best) the call overhead as :func:`fit_call_overhead` finds it; ties go to the
    smaller step overhead. None without timed pipelines."""
    tried: dict = {}

    def at(h: int):
        if h not in tried:
            tried[h] = _fit_call_overhead(dataclasses.replace(model, step_overhead_s=h * 1e-6))
        return tried[h]

    def best(hs):
        found = [(at(h)[1], h) for h in hs if at(h) is not None]
        return min(found)[1] if found else None

    h = best(_STEP_COARSE_US)
    if h is None:
        return None
    h = best(sorted({h, *(h + d for d in _STEP_FINE_US if 0 <= h + d <= 60)}))
    return at(h)[0], h * 1e-6


def fit_call_overhead(model: TPModel) -> float | None:
    """The call overhead alone (the model's step overhead as it is): see :func:`_fit_call_overhead`."""
    found = _fit_call_overhead(model)
    return None if found is None else found[0]


def _fit_call_overhead(model: TPModel) -> tuple[float, float] | None:
    """The fixed cost per call (seconds, 0 to 200 us, to the microsecond) that brings the model
    nearest to the pipelines timed on several GPUs: the least mean relative error over every op,
    shape and schedule timed (a call's time is the model's plus c: the ratio grows by c / the
    GEMM's time, so it is the small shapes that show it). Fitted at the runs' world size, it
    stands for every world of two or more. (seconds, its mean relative error), or None without
    timed pipelines."""
    world, runs = model.pipelines.get("world"), []
    elem = 4 if model.pipelines.get("dtype") == "float32" else 2
    base = dataclasses.replace(model, call_overhead_s=0.0)
    for op in OPS:
        for key, by in (model.pipelines.get(op) or {}).items():
            M, K, N = map(int, key.split("x"))
            if not world or M % world:
                continue
            g = base.gemm_s(M, K, N)
            for name, ratio in by.items():
                runs.append((ratio, predict(base, op, TPSchedule.parse(name), M, K, N, world, elem) / g, g))
    if not runs:
        return None
    error = {c: sum(abs((p + c * 1e-6 / g) / r - 1) for r, p, g in runs) for c in range(201)}
    c = min(error, key=lambda c: (error[c], c))
    return c * 1e-6, error[c] / len(runs)


def measured_pipelines(model: TPModel, op: str, M: int, K: int, N: int, world: int) -> dict:
    """{schedule name: ratio to the GEMM alone} of ``op`` on this shape timed as whole pipelines
    on ``world`` GPUs, or {} where it was not."""
    if model.pipelines.get("world") != world:
        return {}
    return dict(model.pipelines.get(op, {}).get(f"{M}x{K}x{N}", {}))


def pipelines_from_bench(docs: list) -> dict:
    """The ``pipelines`` table from ``conccl bench tp`` results (``tp.json`` documents) of
    several GPUs: per op, shape and conccl schedule, the median over the runs of its ratio to
    the GEMM alone. Every document must come from one world size; those of one GPU (GEMM steps
    alone, no pipeline) are refused."""
    runs: dict = {}
    worlds, dtypes = set(), {(doc.get("config") or {}).get("dtype", "bfloat16") for doc in docs}
    if len(dtypes) != 1:
        raise InvalidArgument(f"pipelines come from runs of one dtype; these have {sorted(dtypes)}")
    for doc in docs:
        for r in doc.get("results", ()):
            if r.get("impl") != "conccl" or r.get("error") or not r.get("ratio_to_gemm") or r.get("wrong"):
                continue
            worlds.add(r["world"])
            key = f"{r['M']}x{r['K']}x{r['N']}"
            runs.setdefault(r["op"], {}).setdefault(key, {}).setdefault(r["schedule"], []).append(r["ratio_to_gemm"])
    if len(worlds) != 1 or min(worlds) < 2:
        raise InvalidArgument(f"pipelines come from runs on one world size of >= 2 GPUs; these have {sorted(worlds)}")
    out: dict = {"world": worlds.pop(), "dtype": dtypes.pop()}
    for op, shapes in runs.items():
        out[op] = {k: {n: round(statistics.median(v), 4) for n, v in sorted(by.items())} for k, by in sorted(shapes.items())}
    return out
