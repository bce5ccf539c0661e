"""One-shot schedules: a small call as one SM kernel of one CTA instead of copy engines.

A copy-engine call's latency is its signals (~7 us one way by stream memory operations on
H100, ~10 in a CUDA graph) and its driver calls; below some size NCCL's SM kernels win
(docs/results.md, "Two H100s": small calls in a CUDA graph). A one-shot call does what PyTorch's
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
where every rank's call would (the ranks agree per call on the board: conccl.group.agreement).

Here: the schedule's shape (:func:`build_one_shot`) and the worlds the kernel serves
(:func:`serves`); each collective's module says what its call stages and reads
(:meth:`~conccl.collectives.base.Collective.plan_one_shot`).
"""
from __future__ import annotations

from ..schedule.base import (Algorithm, Buf, Copy, Phase, Reduce, Schedule, SetSignal, Signal, StreamMode, Transfer,
                        WaitSignal, release_ops)
from .direct import peer_order

MAX_WORLD = 8  # the kernel's arrays


def serves(world: int) -> bool:
    """Whether a one-shot schedule exists for a group of ``world`` ranks (2 to :data:`MAX_WORLD`)."""
    return 2 <= world <= MAX_WORLD


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
