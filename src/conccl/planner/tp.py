"""The tensor-parallel planner: which pipeline (:class:`~conccl.schedule.pipeline.TPSchedule`) an
all-gather+GEMM or GEMM+reduce-scatter should run, and how long it should take.

The model follows FiCCO's two losses, from measurements wherever they exist:

- a GEMM of ``r`` rows of a ``K x N`` weight, in a pipeline over ``M`` rows, takes
  ``rows_ms[MxKxN][r]`` (the characterization's table, ``conccl study tp``; interpolated
  between measured row counts); for a shape not measured, the measured shape of the same
  weight with the nearest ``M``, scaled by ``M``; for a weight never measured, a tile-wave
  model (128 x 256 output tiles, waves of one tile per SM, the rate the profile's GEMMs
  reached) stands in;
- every GEMM step beside copies is slower by the contention factor (default
  :data:`DEFAULT_CONTENTION`, the slowdown measured for a GEMM beside copy-engine traffic on
  H200 x4; the one-GPU characterization over-states it, so it is not used here);
- a piece of ``b`` bytes lands ``latency + b / bandwidth`` after the one before it on its
  stream; every peer at once (direct) shares the GPU's NVLink bandwidth, one peer at a time
  (ring) has it alone (one NVLink peer alone reaches the whole bus bandwidth on H200: 394 GB/s).

Then it plays the schedule's GEMM steps (:func:`conccl.schedule.pipeline.gemm_steps`, the same list the
pipeline runs) against the pieces' landing times. A pure function of plain data.

Where whole pipelines were timed on several GPUs (``conccl bench tp`` on >= 2 GPUs, kept as the
table's ``pipelines``: :func:`pipelines_from_bench`), a shape measured at the world size asked
is planned from those times instead: the fastest schedule measured. One GPU cannot see what a
pipeline exposes before its first step, nor the copies' contention, so the model alone misses
by 3-13%; the measured best is what ``auto`` should run where it exists.
"""
from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
import pathlib
import statistics
from dataclasses import dataclass
from functools import lru_cache

from ..errors import InvalidArgument
from ..schedule.pipeline import SERIAL, Order, TPSchedule, gemm_steps, split_rows
from . import shipped
from .profile import HardwareProfile, load_profile

_DATA = pathlib.Path(__file__).parents[1] / "data"
# The characterizations shipped (``conccl study tp`` on one GPU of each kind), found by a word of
# the CUDA device's name; any other GPU gets the H200's (``conccl plan tp --characterization``
# takes the user's own).
EMBEDDED_TP = {"H100": _DATA / "h100_tp.json", "H200": _DATA / "h200_tp.json"}
DEFAULT_GPU = "H200"
FALLBACK_GPU = "H100"
DEFAULT_CONTENTION = 1.03
COPY_LATENCY_S = 8e-6  # one copy-engine copy's fixed cost on the GPU (H200: batched peer copies)
OPS = ("ag_gemm", "gemm_rs")
TILE_M, TILE_N = 128, 256


@dataclass(frozen=True)
class TPModel:
    """What the model needs: the GEMM table, the rates and the contention factor."""

    rows_ms: dict  # "MxKxN" -> {rows: ms}
    flops: float  # achieved bf16 GEMM rate, flop/s
    sm_count: int
    nvlink_bytes_per_s: float
    hbm_bytes_per_s: float
    contention: float = DEFAULT_CONTENTION
    gemm_scale: float = 1.0  # every GEMM time multiplied by it (to time a measured decomposition)
    # Whole pipelines timed on several GPUs: {"world": W, "dtype": name, op: {"MxKxN":
    # {schedule: ratio to the GEMM alone}}} (:func:`pipelines_from_bench`); empty: none
    pipelines: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)
    # A call's fixed cost on the GPU beyond its GEMMs and copies (signals, marks, the waits
    # between them): fitted to the pipelines where they exist (:func:`fit_call_overhead`)
    call_overhead_s: float = 0.0
    # The least time a step of a pipeline of several takes: queueing a step (its GEMM, marks and
    # copies) costs the host about this, so a shorter GEMM step leaves the GPU waiting (decode
    # sizes: on 2 x H100 each step past the first of a 1024-row GEMM+reduce-scatter added 35-40
    # us). Fitted with the call's fixed cost (:func:`fit_overheads`); 0 without timed pipelines.
    step_overhead_s: float = 0.0

    def gemm_s(self, rows: int, K: int, N: int, M: int | None = None) -> float:
        """Seconds of one GEMM of ``rows`` rows with a ``K x N`` weight, run as a piece of a
        pipeline over ``M`` rows (None: ``rows``)."""
        M = M or rows
        return self._gemm_s(rows, K, N, M) * self.gemm_scale

    def _gemm_s(self, rows: int, K: int, N: int, M: int) -> float:
        table = self.rows_ms.get(f"{M}x{K}x{N}")
        if table:
            return _interpolate(table, rows) / 1e3
        same = [m for m, k, n in (map(int, key.split("x")) for key in self.rows_ms) if (k, n) == (K, N)]
        if same:
            near = min(same, key=lambda m: abs(math.log(m / M)))
            return _interpolate(self.rows_ms[f"{near}x{K}x{N}"], rows * near / M) / 1e3 * M / near
        tiles = math.ceil(rows / TILE_M) * math.ceil(N / TILE_N)
        waves = math.ceil(tiles / self.sm_count)
        return waves * (2 * TILE_M * TILE_N * K) / (self.flops / self.sm_count)

    def measured(self, M: int, K: int, N: int) -> bool:
        return f"{M}x{K}x{N}" in self.rows_ms


def _interpolate(table: dict, rows: int) -> float:
    xs = sorted(table)
    if rows in table:
        return table[rows]
    if rows <= xs[0]:
        return table[xs[0]] * max(rows / xs[0], 0.5)  # below the smallest measured: latency-bound
    if rows >= xs[-1]:
        return table[xs[-1]] * rows / xs[-1]
    i = bisect.bisect_left(xs, rows)
    a, b = xs[i - 1], xs[i]
    return table[a] + (table[b] - table[a]) * (rows - a) / (b - a)


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


def predict(model: TPModel, op: str, tp: TPSchedule, M: int, K: int, N: int, world: int, elem: int = 2) -> float:
    """Seconds the pipeline ``tp`` takes for ``op`` over ``M`` gathered (or product) rows."""
    if op not in OPS:
        raise InvalidArgument(f"unknown tensor-parallel op {op!r}; known: {', '.join(OPS)}")
    if M % world:
        raise InvalidArgument(f"M ({M}) must be divisible by the world size ({world})")
    rows = M // world
    rank = 0  # every rank runs the same shape of pipeline
    steps = gemm_steps(world, rank, tp, rows, scatter=op == "gemm_rs")
    cont = 1.0 if world == 1 or tp.serial else model.contention
    row_bytes = (K if op == "ag_gemm" else N) * elem
    if op == "ag_gemm":
        # The peers' shards are staged (read and written on their GPU) before they can move;
        # pushed from their inputs, they are not.
        stage_s = 2 * rows * row_bytes / model.hbm_bytes_per_s if world > 1 and not tp.push else 0.0
        landed = {pc: stage_s + t for pc, t in _landing_times(model, world, rank, tp, rows, row_bytes).items()}
        # A step is slowed by the contention only while pieces are still landing beside it.
        busy_until = max(landed.values(), default=0.0)
        # A pipelined pull's own step pays for the staging too: a same-GPU copy on SMs, which
        # the step waits for (a shard above 64 MiB, or captured) or runs beside. Measured
        # (session 12): push, which stages nothing, faster than direct on 16 of 16 shape-runs
        # on 2 x H100 and 30 of 32 on 2 x H200, by 0.4-4.7% in the shipped medians, about the
        # staging's time at HBM speed.
        t = stage_s if not tp.serial else 0.0
        least = model.step_overhead_s if len(steps) > 1 and world > 1 else 0.0
        for start, end, pieces in steps:
            t = max(t, max((landed.get(pc, 0.0) for pc in pieces), default=0.0))  # own rows: in place
            d = max(model.gemm_s(end - start, K, N, M), least)
            overlap = min(max(busy_until - t, 0.0), d * cont)
            t += overlap + (d - overlap / cont)
        return t + (model.call_overhead_s if world > 1 else 0.0)
    # GEMM, then reduce-scatter: pieces leave as their step ends (every step but the first has
    # copies beside it); the sum runs after the last has arrived.
    t, done = 0.0, {}
    least = model.step_overhead_s if len(steps) > 1 and world > 1 else 0.0
    for i, (start, end, pieces) in enumerate(steps):
        t += max(model.gemm_s(end - start, K, N, M) * (cont if i else 1.0), least)
        for pc in pieces:
            done[pc] = t
    sent = _sending_times(model, world, rank, tp, rows, row_bytes, done)
    chunk = rows * row_bytes
    reduce_s = (world + 1) * chunk / model.hbm_bytes_per_s
    return max([t, *sent.values()]) + reduce_s + (model.call_overhead_s if world > 1 else 0.0)


def _landing_times(model: TPModel, world, rank, tp, rows, row_bytes) -> dict:
    """(peer, piece) -> seconds after the call's start when that piece has landed."""
    cuts = split_rows(rows, 1 if tp.serial else tp.pieces)
    peers = [(rank + s) % world for s in range(1, world)]
    bw = model.nvlink_bytes_per_s
    out = {}
    if tp.order is Order.RING or tp.serial:
        t = 0.0
        for p in peers:
            for j, (a, b) in enumerate(cuts):
                t += COPY_LATENCY_S + (b - a) * row_bytes / bw
                out[(p, j)] = t
    else:  # every peer at once, sharing the bandwidth
        t = 0.0
        for j, (a, b) in enumerate(cuts):
            t += COPY_LATENCY_S + (b - a) * row_bytes * len(peers) / bw
            for p in peers:
                out[(p, j)] = t
    return out


def _sending_times(model: TPModel, world, rank, tp, rows, row_bytes, done: dict) -> dict:
    """(peer, piece) -> seconds when its push has arrived, each leaving once computed."""
    cuts = split_rows(rows, 1 if tp.serial else tp.pieces)
    peers = [(rank + s) % world for s in range(1, world)]
    share = 1 if tp.order is Order.RING or tp.serial else max(len(peers), 1)
    stream_free = {p: 0.0 for p in peers} if share > 1 else {}
    t_one = 0.0
    out = {}
    for p in peers:
        for j, (a, b) in enumerate(cuts):
            dur = COPY_LATENCY_S + (b - a) * row_bytes * share / model.nvlink_bytes_per_s
            if share > 1:
                stream_free[p] = max(stream_free[p], done[(p, j)]) + dur
                out[(p, j)] = stream_free[p]
            else:
                t_one = max(t_one, done[(p, j)]) + dur
                out[(p, j)] = t_one
    return out


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
    m = model or _default_model(device_name, world, nvlinks, os.environ.get(shipped.ENV) or None)
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


def decomposition_s(model: TPModel, op: str, tp: TPSchedule, M: int, K: int, N: int, world: int) -> float:
    """Seconds of the pipeline's GEMM steps alone, back to back (no transfer, no contention):
    what one GPU measures of it (``conccl bench tp`` on one GPU)."""
    return sum(model.gemm_s(e - s, K, N, M) for s, e, _ in gemm_steps(world, 0, tp, M // world, op == "gemm_rs"))


def without(model: TPModel, M: int, K: int, N: int) -> TPModel:
    """``model`` without the measurements of shape M x K x N (its GEMM steps and its timed
    pipelines): how it predicts a shape it never saw."""
    key = f"{M}x{K}x{N}"
    pipelines = {op: ({k: v for k, v in by.items() if k != key} if isinstance(by, dict) else by)
                 for op, by in model.pipelines.items()}
    return _fitted(dataclasses.replace(model, rows_ms={k: v for k, v in model.rows_ms.items() if k != key},
                                       pipelines=pipelines, call_overhead_s=0.0))
