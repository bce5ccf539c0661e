"""One-shot schedules: a small call as one SM kernel of one CTA instead of copy engines.

A copy-engine call's latency is its signals (~7 us one way by stream memory operations on
H100, ~10 in a CUDA graph) and its driver calls; below some size NCCL's SM kernels win
(benchmarks/2026-11-26-h100x2-latency). A one-shot call does what PyTorch's
``one_shot_all_reduce`` does, in conccl's protocol: the rank stages its input into its half
of the group workspace (double-buffered, :mod:`conccl.schedule.base`), signals READY to every
peer, waits for theirs, reads what it needs from their staged copies over NVLink (gather:
copies pieces; reduce: sums every rank's piece in rank order, fp32, rounded once: the copy-
engine path's bits), sends DONE and makes the release. One signal on the critical path,
one launch, one SM (:mod:`conccl.kernels.one_shot`); the CPU reference executor runs
the same ops one by one, so the protocol is tested where the kernel cannot run.

The cost is the SM: beside a GEMM the kernel (on the call's stream) waits for an SM to free
up, where a copy-engine call does not. So it is opt-in, per group, below a size:
``Options.one_shot_below`` (``CONCCL_ONE_SHOT_BELOW``), for the public functions' calls only,
where every rank's call would (the ranks agree per call on the board: conccl.group.group).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..schedule.base import (Algorithm, Buf, Copy, Phase, Reduce, Schedule, SetSignal, Signal, StreamMode, Transfer,
                        WaitSignal, release_ops)
from .direct import peer_order

MAX_WORLD = 8  # the kernel's arrays


def build_one_shot(collective: str, world: int, rank: int, stage_bytes: int,
                   pieces: dict[int, tuple[int, int, int]], reduce: tuple | None = None) -> Schedule:
    """One rank's one-shot schedule. ``pieces[p]`` = (offset in rank p's staged input, offset
    in this rank's output, bytes) for a gather (the own piece, p == rank, read from the input);
    ``reduce`` = (offset in every rank's input, offset in the output, bytes, dtype, scale) for
    a reduction. Every rank stages its first ``stage_bytes`` of input."""
    peers = peer_order(world, rank)
    ops: list = []
    if stage_bytes:
        ops.append(Copy(Transfer(rank, Buf.INPUT, 0, rank, Buf.WORKSPACE, 0, stage_bytes, 0, Phase.STAGE)))
    own = pieces.get(rank)
    if own is not None and own[2]:
        ops.append(Copy(Transfer(rank, Buf.INPUT, own[0], rank, Buf.OUTPUT, own[1], own[2], 0, Phase.LOCAL)))
    ops += [SetSignal(p, Signal.READY) for p in peers] + [WaitSignal(p, Signal.READY) for p in peers]
    for p in peers:
        src, dst, n = pieces.get(p, (0, 0, 0))
        if n:
            ops.append(Copy(Transfer(p, Buf.WORKSPACE, src, rank, Buf.OUTPUT, dst, n, 0, Phase.PEER)))
    if reduce is not None and reduce[2]:
        src, dst, n, dtype, scale = reduce
        srcs = tuple((Buf.INPUT, src) if q == rank else (Buf.WORKSPACE, src) for q in range(world))
        ops.append(Reduce((Buf.OUTPUT, dst), srcs, n, dtype, scale, src_ranks=tuple(range(world))))
    ops += [SetSignal(p, Signal.DONE) for p in peers] + release_ops(peers)
    return Schedule(collective=collective, world=world, rank=rank, slots=(tuple(ops),), algorithm=Algorithm.PULL,
                    stream_mode=StreamMode.SINGLE, staged=True, workspace_bytes=stage_bytes,
                    double_buffered=True, one_shot=True)


@lru_cache(maxsize=1024)
def plan_one_shot_all_gather(world: int, rank: int, nbytes: int, in_place: bool) -> Schedule:
    pieces = {p: (0, p * nbytes, 0 if (p == rank and in_place) else nbytes) for p in range(world)}
    return build_one_shot("all_gather", world, rank, nbytes, pieces)


@lru_cache(maxsize=1024)
def plan_one_shot_all_to_all(world: int, rank: int, matrix: tuple) -> Schedule:
    pieces = {p: (sum(matrix[p][:rank]), sum(matrix[k][rank] for k in range(p)), matrix[p][rank])
              for p in range(world)}
    # every rank stages its whole input; the workspace must be alike on every rank: the largest
    return replace(build_one_shot("all_to_all", world, rank, sum(matrix[rank]), pieces),
                   workspace_bytes=max(sum(row) for row in matrix))


@lru_cache(maxsize=1024)
def plan_one_shot_reduce_scatter(world: int, rank: int, chunk: int, dtype: str, scale: float) -> Schedule:
    return build_one_shot("reduce_scatter", world, rank, world * chunk, {},
                          (rank * chunk, 0, chunk, dtype, scale))


@lru_cache(maxsize=1024)
def plan_one_shot_all_reduce(world: int, rank: int, nbytes: int, dtype: str, scale: float) -> Schedule:
    return build_one_shot("all_reduce", world, rank, nbytes, {}, (0, 0, nbytes, dtype, scale))


def one_shot_plan(name: str, world: int, rank: int, local, peers) -> Schedule | None:
    """The one-shot schedule of a call of collective ``name`` (``local``: its
    :class:`~conccl.collectives.base.LocalCall`; ``peers``: every rank's, from the board), or
    None where there is none (a world over :data:`MAX_WORLD`, another collective)."""
    if not 2 <= world <= MAX_WORLD:
        return None
    if name == "all_gather":
        nbytes, in_place = local.extra
        return plan_one_shot_all_gather(world, rank, nbytes, in_place)
    if name == "all_to_all":
        return plan_one_shot_all_to_all(world, rank, peers.send)
    if name == "reduce_scatter":
        chunk, dtype, scale, _, out_dtype = local.extra
        if out_dtype is not None:  # a widening call (parts into fp32) is never one-shot
            return None
        return plan_one_shot_reduce_scatter(world, rank, chunk, dtype, scale)
    if name == "all_reduce":
        numel, esize, dtype, scale = local.extra
        return plan_one_shot_all_reduce(world, rank, numel * esize, dtype, scale)
    return None
