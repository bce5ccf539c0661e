"""CPU tier: ``collectives.all_gather.into_parts``, the all-gather that fills FSDP's
per-parameter tensors straight from the peers. Its copies are applied here to plain byte
arrays, one per rank, as the executors would apply them to memory."""
from __future__ import annotations

import numpy as np
import pytest

from conccl.collectives.all_gather import into_parts, plan_all_gather
from conccl.schedule.base import Algorithm, Buf, Copy, Phase, StreamMode


def _apply(schedule, world, chunk, flats, arena, base):
    """Run ``schedule``'s copies: INPUT = own chunk of the flat buffer, OUTPUT of a peer = its
    flat buffer, OUTPUT of this rank = ``arena`` from ``base``."""
    rank = schedule.rank
    for ops in schedule.slots:
        for op in ops:
            if not isinstance(op, Copy):
                continue
            t = op.transfer
            if t.src is Buf.INPUT:
                src = flats[t.src_rank][t.src_rank * chunk:(t.src_rank + 1) * chunk]
            else:
                assert t.src is Buf.OUTPUT and t.src_rank != rank, t
                src = flats[t.src_rank]
            assert t.dst is Buf.OUTPUT and t.dst_rank == rank, t
            arena[base + t.dst_offset:base + t.dst_offset + t.nbytes] = src[t.src_offset:t.src_offset + t.nbytes]


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("mode", [StreamMode.BATCH, StreamMode.PER_PEER])
@pytest.mark.parametrize("in_place", [True, False])  # False: the peers read the input (no flat output at all)
def test_every_part_gets_every_ranks_bytes_and_nothing_else(world, mode, in_place):
    sizes = [7, 1, 40, 16, 3]  # bytes of each part per rank, odd on purpose
    chunk = sum(sizes)
    rng = np.random.default_rng(world)
    flats = [rng.integers(0, 255, world * chunk, dtype=np.uint8) for _ in range(world)]
    for rank in range(world):
        # the parts sit in the arena out of order, with gaps: the lowest one is the output
        order, gap, at, dst = [3, 0, 4, 2, 1], 5, 11, {}
        for i in order:
            dst[i] = at
            at += world * sizes[i] + gap
        base = min(dst.values())
        arena = np.full(at, 0xEE, np.uint8)
        offs = np.cumsum([0] + sizes[:-1])
        parts = tuple((int(offs[i]), sizes[i], dst[i] - base) for i in range(len(sizes)))
        sched = plan_all_gather(world, rank, chunk, algorithm=Algorithm.PULL, stream_mode=mode, input_symmetric=True,
                                output_symmetric=in_place, in_place=in_place, peers_in_place=in_place)
        moved = into_parts(sched, chunk, parts)
        _apply(moved, world, chunk, flats, arena, base)
        for i, n in enumerate(sizes):
            got = arena[dst[i]:dst[i] + world * n].reshape(world, n)
            for r in range(world):
                assert (got[r] == flats[r][r * chunk + offs[i]:r * chunk + offs[i] + n]).all(), (rank, i, r)
            assert arena[dst[i] + world * n:dst[i] + world * n + gap].tolist() == [0xEE] * min(gap, len(arena) - dst[i] - world * n)
        # the signals are the all-gather's, untouched; the own chunk comes from the input, locally
        signals = lambda s: [op for ops in s.slots for op in ops if not isinstance(op, Copy)]  # noqa: E731
        assert signals(moved) == signals(sched)
        own = [op.transfer for ops in moved.slots for op in ops
               if isinstance(op, Copy) and op.transfer.src is Buf.INPUT and op.transfer.src_rank == rank]
        assert len(own) == len(sizes) and all(t.phase is Phase.LOCAL for t in own)


def test_a_push_schedule_or_a_world_of_one():
    from conccl.errors import InvalidArgument

    push = plan_all_gather(2, 0, 8, algorithm=Algorithm.PUSH, stream_mode=StreamMode.BATCH, input_symmetric=True,
                           output_symmetric=True, in_place=True, peers_in_place=True)
    with pytest.raises(InvalidArgument, match="pull"):
        into_parts(push, 8, ((0, 8, 0),))
    alone = plan_all_gather(1, 0, 8, algorithm=Algorithm.PULL, stream_mode=StreamMode.BATCH, in_place=True)
    moved = into_parts(alone, 8, ((0, 3, 16), (3, 5, 0)))
    copies = [op.transfer for ops in moved.slots for op in ops if isinstance(op, Copy)]
    assert [(t.src_offset, t.dst_offset, t.nbytes) for t in copies] == [(0, 16, 3), (3, 0, 5)]
