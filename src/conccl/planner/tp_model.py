"""The tensor-parallel planner's model: how long a pipeline (:class:`~conccl.schedule.tp_schedule.TPSchedule`)
of an all-gather+GEMM or GEMM+reduce-scatter takes (:func:`predict`). A pure function of plain
data, from measurements wherever they exist; FiCCO's two losses:

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

Then it plays the schedule's GEMM steps (:func:`conccl.schedule.tp_schedule.gemm_steps`, the same
list the pipeline runs) against the pieces' landing times. A call's and a step's fixed costs
are fitted to pipelines timed on several GPUs (:mod:`conccl.planner.tp_fit`).
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass

from ..errors import InvalidArgument
from ..schedule.tp_schedule import Order, TPSchedule, gemm_steps, split_rows

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
    # {schedule: ratio to the GEMM alone}}} (:func:`conccl.planner.tp_fit.pipelines_from_bench`); empty: none
    pipelines: dict = dataclasses.field(default_factory=dict, hash=False, compare=False)
    # A call's fixed cost on the GPU beyond its GEMMs and copies (signals, marks, the waits
    # between them): fitted to the pipelines where they exist (:mod:`conccl.planner.tp_fit`)
    call_overhead_s: float = 0.0
    # The least time a step of a pipeline of several takes: queueing a step (its GEMM, marks and
    # copies) costs the host about this, so a shorter GEMM step leaves the GPU waiting (decode
    # sizes: on 2 x H100 each step past the first of a 1024-row GEMM+reduce-scatter added 35-40
    # us). Fitted with the call's fixed cost (:mod:`conccl.planner.tp_fit`); 0 without timed pipelines.
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
        # the step waits for (a shard above 64 MiB, or captured) or runs beside. Measured: push,
        # which stages nothing, faster than direct on almost every shape on 2 x H100 and on
        # 2 x H200, by about the staging's time at HBM speed (docs/results.md, "The push
        # all-gather+GEMM pipeline").
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


def decomposition_s(model: TPModel, op: str, tp: TPSchedule, M: int, K: int, N: int, world: int) -> float:
    """Seconds of the pipeline's GEMM steps alone, back to back (no transfer, no contention):
    what one GPU measures of it (``conccl bench tp`` on one GPU)."""
    return sum(model.gemm_s(e - s, K, N, M) for s, e, _ in gemm_steps(world, 0, tp, M // world, op == "gemm_rs"))
