"""The tensor-parallel planner: which pipeline (:class:`~conccl.schedule.tp_schedule.TPSchedule`)
an all-gather+GEMM or GEMM+reduce-scatter should run (:func:`choose`, ``auto``), and how long it
should take.

Its model (:mod:`conccl.planner.tp_model`: FiCCO's two losses, from the characterization's GEMM
table and the hardware profile's rates) predicts every candidate schedule (:func:`candidates`)
and the fastest is picked. Where whole pipelines were timed on several GPUs (``conccl bench tp``
on >= 2 GPUs, kept as the table's ``pipelines``: :mod:`conccl.planner.tp_fit`), a shape measured
at the world size asked is planned from those times instead: the fastest schedule measured. One
GPU cannot see what a pipeline exposes before its first step, nor the copies' contention, so the
model alone misses by 3-13%; the measured best is what ``auto`` should run where it exists.

The model and the fitting are this module's too (every name below): callers name them here.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from dataclasses import dataclass
from functools import lru_cache

from .. import env
from ..errors import InvalidArgument
from ..schedule.tp_schedule import SERIAL, Order, TPSchedule
from . import shipped
from .profile import HardwareProfile, load_profile
from .tp_fit import fit_call_overhead, fit_overheads, measured_pipelines, pipelines_from_bench
from .tp_model import (COPY_LATENCY_S, DEFAULT_CONTENTION, OPS, TILE_M, TILE_N, TPModel, decomposition_s,
                       predict)

__all__ = ["EMBEDDED_TP", "DEFAULT_GPU", "FALLBACK_GPU", "DEFAULT_CONTENTION", "COPY_LATENCY_S", "OPS", "TILE_M",
           "TILE_N", "TPModel", "predict", "decomposition_s", "fit_overheads", "fit_call_overhead",
           "measured_pipelines", "pipelines_from_bench", "embedded_gpu", "model_from", "with_pipelines", "without",
           "candidates", "push_measured", "Choice", "choose", "forget"]

_DATA = pathlib.Path(__file__).parents[1] / "data"
# The characterizations shipped (``conccl study tp`` on one GPU of each kind), found by a word of
# the CUDA device's name; any other GPU gets the H100's, no GPU the H200's (:func:`embedded_gpu`;
# ``conccl plan tp --characterization`` takes the user's own).
EMBEDDED_TP = {"H100": _DATA / "h100_tp.json", "H200": _DATA / "h200_tp.json"}
DEFAULT_GPU = "H200"
FALLBACK_GPU = "H100"


def embedded_gpu(device_name: str | None) -> str:
    """The key of :data:`EMBEDDED_TP` for a CUDA device name ("NVIDIA H100 80GB HBM3" -> "H100");
    no GPU: the H200 (as the profile then is), another GPU: the H100 (as its borrowed profile is,
    :data:`conccl.planner.shipped.FALLBACK_DEVICE`)."""
    found = next((k for k in EMBEDDED_TP if device_name and k in device_name.upper()), None)
    return found or (FALLBACK_GPU if device_name else DEFAULT_GPU)


@lru_cache(maxsize=4)
def _embedded_table(gpu: str) -> dict:
    return json.loads(EMBEDDED_TP[gpu].read_text(encoding="utf-8"))


def model_from(profile: HardwareProfile | None = None, table: dict | None = None,
               contention: float | None = None, device_name: str | None = None) -> TPModel:
    """The model from a hardware profile (default: the embedded one) and a characterization
    table (default: the profile's ``tp`` table, else the embedded characterization of the GPU
    named ``device_name``, :func:`embedded_gpu`)."""
    p = profile or load_profile()
    t = table if table is not None else (getattr(p, "tp", None) or _embedded_table(embedded_gpu(device_name)))
    t = _with_gemm_steps(t, device_name)
    rows_ms = {k: {int(r): float(v) for r, v in rows.items()} for k, rows in t.get("rows_ms", {}).items()}
    eff = p.gemm_efficiency.get("compute-bound", 0.7) if isinstance(p.gemm_efficiency, dict) else 0.7
    model = TPModel(rows_ms, p.bf16_flops * eff, p.sm_count, p.nvlink_bytes_per_s, p.hbm_bytes_per_s,
                    DEFAULT_CONTENTION if contention is None else contention, pipelines=t.get("pipelines") or {})
    return _fitted(model)


def _with_gemm_steps(table: dict, device_name: str | None) -> dict:
    """``table``, or where it has no GEMM steps of its own (timed pipelines alone), the GPU's
    shipped table with ``table`` over it."""
    return table if table.get("rows_ms") else {**_embedded_table(embedded_gpu(device_name)), **table}


def _fitted(model: TPModel) -> TPModel:
    """``model`` with its call and step overheads fitted to its pipelines (unchanged without them)."""
    fit = fit_overheads(model)
    return model if fit is None else dataclasses.replace(model, call_overhead_s=fit[0], step_overhead_s=fit[1])


def with_pipelines(table: dict, pipelines: dict, device_name: str | None) -> tuple[dict, str]:
    """(a characterization table, a hardware profile's ``tp``, holding ``pipelines``, what
    became of the times it held). A table without GEMM steps of its own takes those shipped
    for the GPU named ``device_name`` (and their pipelines). Times of the same world size and
    dtype are merged, the new ones replacing those of the same op and shape; others replaced."""
    base = _with_gemm_steps(table, device_name)
    old = base.get("pipelines") or {}
    if not old:
        return {**base, "pipelines": pipelines}, "new"
    if (old.get("world"), old.get("dtype", "bfloat16")) != (pipelines["world"], pipelines.get("dtype", "bfloat16")):
        return {**base, "pipelines": pipelines}, (f"replacing those of world {old.get('world')}, "
                                                  f"{old.get('dtype', 'bfloat16')}")
    merged = {k: v for k, v in old.items() if k != "source"}
    for op in OPS:
        if op in pipelines:
            merged[op] = {**old.get(op, {}), **pipelines[op]}
    return {**base, "pipelines": merged}, "merged with those it held"


def candidates(M: int, world: int, scatter: bool = False, push: bool = True) -> list[TPSchedule]:
    """The schedules ``auto`` weighs: serial, ring and direct at shard level, push (all-gather
    only, ``scatter`` False, where ``push``), and direct with 2 to 16 pieces per shard at every
    GEMM grain that divides them."""
    rows = M // world
    # Ties go to the first: at world 2 ring and direct are one schedule (one peer).
    out = [SERIAL, TPSchedule(order=Order.DIRECT), TPSchedule(order=Order.RING)]
    if push and not scatter:
        out.insert(1, TPSchedule(push=True))
    for pieces in (2, 4, 8, 16):
        if pieces > rows or world * pieces > 256:
            continue
        for g in (1, 2, 4, 8):
            if g < pieces and pieces % g == 0:
                out.append(TPSchedule(order=Order.DIRECT, pieces=pieces, gemm_pieces=g))
        out.append(TPSchedule(order=Order.RING, pieces=pieces))
    return out


def push_measured(model: TPModel, world: int) -> bool:
    """Whether the model's pipelines timed a push schedule on ``world`` GPUs: only then does
    ``auto`` weigh push for shapes not timed. Push takes ``world x`` the shard of workspace
    (pull: one shard, none from ``conccl.empty``), so at a world size never timed the model's
    small gain (no staging) is not worth the memory and the graph workspace a user reserved
    for pull."""
    return model.pipelines.get("world") == world and any(
        TPSchedule.parse(name).push for by in model.pipelines.get("ag_gemm", {}).values() for name in by)


@dataclass(frozen=True)
class Choice:
    schedule: TPSchedule
    predicted_s: float
    gemm_alone_s: float
    serial_s: float
    measured: bool  # the weight's GEMM times were measured (else the tile-wave model)
    ranked: tuple  # ((schedule name, seconds), ...) fastest first
    # The pick is the fastest of whole pipelines timed on this many GPUs (None: the model's)
    from_runs: int | None = None


def choose(op: str, M: int, K: int, N: int, world: int, dtype: str = "bfloat16", *,
           model: TPModel | None = None, device_name: str | None = None, nvlinks: int | None = None) -> Choice:
    """The fastest predicted schedule for ``op`` on this shape and world (``auto``); ``model``
    None: the embedded one of the GPU named ``device_name`` (:func:`embedded_gpu`)."""
    for name, v in (("M", M), ("K", K), ("N", N), ("world", world)):
        if not isinstance(v, int) or v < 1:
            raise InvalidArgument(f"{name} must be a whole number >= 1, got {v!r}")
    if M % world:
        raise InvalidArgument(f"M ({M}) must be divisible by the world size ({world})")
    m = model or _default_model(device_name, world, nvlinks, env.get("CONCCL_PROFILE") or None)
    elem = 4 if dtype == "float32" else 2
    gemm = m.gemm_s(M, K, N)
    runs = measured_pipelines(m, op, M, K, N, world) if dtype == m.pipelines.get("dtype", "bfloat16") else {}
    if runs:  # timed on GPUs: the fastest of the schedules timed (ties to the first name, every rank alike)
        ranked = sorted(((TPSchedule.parse(n), r * gemm) for n, r in sorted(runs.items())), key=lambda x: x[1])
        serial = runs["serial"] * gemm if "serial" in runs else predict(m, op, SERIAL, M, K, N, world, elem)
    else:
        ranked = sorted(((tp, predict(m, op, tp, M, K, N, world, elem))
                         for tp in candidates(M, world, op == "gemm_rs", push_measured(m, world))),
                        key=lambda x: x[1])
        serial = predict(m, op, SERIAL, M, K, N, world, elem)
    return Choice(ranked[0][0], ranked[0][1], gemm, serial, m.measured(M, K, N),
                  tuple((tp.name, s) for tp, s in ranked), world if runs else None)


@lru_cache(maxsize=16)
def _default_model(device_name: str | None, world: int, nvlinks: int | None, path: str | None) -> TPModel:
    """The profile the runtime plans with (:func:`conccl.planner.shipped.choose`: the shipped one
    of the GPU, a path given by $CONCCL_PROFILE, or a fallback with one warning) with its TP
    characterization, else the GPU's embedded one."""
    return model_from(shipped.choose(device_name, world, path, nvlinks).profile, device_name=device_name)


def forget() -> None:
    """Drop the memoised models (``runtime.clear_plan_cache``)."""
    _default_model.cache_clear()


def without(model: TPModel, M: int, K: int, N: int) -> TPModel:
    """``model`` without the measurements of shape M x K x N (its GEMM steps and its timed
    pipelines): how it predicts a shape it never saw."""
    key = f"{M}x{K}x{N}"
    pipelines = {op: ({k: v for k, v in by.items() if k != key} if isinstance(by, dict) else by)
                 for op, by in model.pipelines.items()}
    return _fitted(dataclasses.replace(model, rows_ms={k: v for k, v in model.rows_ms.items() if k != key},
                                       pipelines=pipelines, call_overhead_s=0.0))
