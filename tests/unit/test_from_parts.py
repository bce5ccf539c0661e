"""CPU tier: ``collectives.reduce_scatter.from_parts``, the reduce-scatter that reads FSDP's
per-parameter gradients where they are (no copy-in). Every rank's copies are applied here to
plain byte arrays, and what each rank's reduction then reads must be the flat input's rows
(FSDP's ``chunk_cat`` layout), byte for byte, wherever they are not padding."""
from __future__ import annotations

import numpy as np
import pytest

from conccl.collectives.direct import WORKSPACE_ALIGN
from conccl.collectives.reduce_scatter import from_parts, plan_reduce_scatter
from conccl.errors import InvalidArgument
from conccl.schedule.base import Buf, Copy, Phase, Reduce, SetSignal, Signal, StreamMode, WaitSignal

ELEM = 2  # bytes per element (bf16)


def _setup(world, rng, numels, rows):
    """Every rank's parts (bytes) in one arena each, out of order and with gaps, and the flat
    input they stand for (padding as 0xEE: never to be read)."""
    arenas, layouts, flats = [], [], []
    for _ in range(world):
        at, where = 7, {}
        for i in [3, 0, 2, 1][:len(numels)] + list(range(4, len(numels))):
            where[i] = at
            at += numels[i] * ELEM + 13
        arena = rng.integers(0, 255, at, dtype=np.uint8)
        base = min(where[i] for i in range(len(numels)) if numels[i])
        offs = np.cumsum([0] + [r * ELEM for r in rows[:-1]])
        layouts.append((base, tuple((int(offs[i]), rows[i] * ELEM, where[i] - base, numels[i] * ELEM)
                                    for i in range(len(numels)) if numels[i])))
        flat = np.full(world * sum(rows) * ELEM, 0xEE, np.uint8).reshape(world, -1)
        for i, (n, r) in enumerate(zip(numels, rows)):
            part = np.full(world * r * ELEM, 0xEE, np.uint8)
            part[:n * ELEM] = arena[where[i]:where[i] + n * ELEM]
            flat[:, offs[i]:offs[i] + r * ELEM] = part.reshape(world, r * ELEM)
        arenas.append(arena)
        flats.append(flat)
    return arenas, layouts, flats


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("mode", [StreamMode.BATCH, StreamMode.PER_PEER])
def test_every_rank_reduces_the_flat_inputs_rows(world, mode):
    rng = np.random.default_rng(world)
    numels = [11, 1, 40, 0, 17]  # elements of each part; padded to world rows of `rows`
    rows = [-(-n // world) if n else 3 for n in numels]  # an empty part keeps its (padding) rows
    chunk = sum(rows) * ELEM
    slot = -(-chunk // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
    arenas, layouts, flats = _setup(world, rng, numels, rows)
    workspaces = [np.full(world * slot, 0xAB, np.uint8) for _ in range(world)]
    moved = {}
    for rank in range(world):
        sched = plan_reduce_scatter(world, rank, chunk, "bfloat16", stream_mode=mode)
        moved[rank] = m = from_parts(sched, chunk, layouts[rank][1])
        signals = lambda s: [op for ops in s.slots for op in ops if not isinstance(op, (Copy, Reduce))]  # noqa: E731
        assert signals(m) == signals(sched)  # the protocol is the flat call's
        base = layouts[rank][0]
        for ops in m.slots:
            for op in ops:
                if isinstance(op, Copy):
                    t = op.transfer
                    assert t.src is Buf.INPUT and t.src_rank == rank and t.dst is Buf.WORKSPACE, t
                    assert t.phase is (Phase.LOCAL if t.dst_rank == rank else Phase.PEER), t
                    src = arenas[rank][base + t.src_offset:base + t.src_offset + t.nbytes]
                    workspaces[t.dst_rank][t.dst_offset:t.dst_offset + t.nbytes] = src
    for d in range(world):
        (red,) = [op for ops in moved[d].slots for op in ops if isinstance(op, Reduce)]
        assert [buf for buf, _ in red.srcs] == [Buf.WORKSPACE] * world  # the own chunk too
        for r, (_, off) in enumerate(red.srcs):
            got, want = workspaces[d][off:off + chunk], flats[r][d]
            real = want != 0xEE  # padding (0xEE) is never copied; the random bytes may be 0xEE too
            assert (got[real] == want[real]).all(), (d, r)
            assert (got == want).sum() >= real.sum()
        # the own chunk's copies run on the reduction's slot, before it, and only after the
        # peers' DONE of the previous call (they may still read the own slot: an all-reduce's
        # reduced chunk) and, in one stream, after this rank's DONE (never delaying a peer)
        k = next(k for k, ops in enumerate(moved[d].slots) if red in ops)
        ops = moved[d].slots[k]
        own = [i for i, op in enumerate(ops) if isinstance(op, Copy) and op.transfer.dst_rank == d]
        assert own and max(own) < ops.index(red)
        previous = [i for i, op in enumerate(ops) if isinstance(op, WaitSignal) and op.seq_delta < 0]
        assert not previous or min(own) > max(previous), ops
        done = [i for i, op in enumerate(ops) if isinstance(op, SetSignal) and op.kind is Signal.DONE]
        assert not done or min(own) > max(done), ops
        assert moved[d].parts


def test_padding_is_never_copied_and_a_pull_is_refused():
    # one part of 5 elements over 4 ranks: rows of 2, the last rank's row is all padding
    sched = plan_reduce_scatter(4, 0, 2 * ELEM, "float32", stream_mode=StreamMode.BATCH)
    m = from_parts(sched, 2 * ELEM, ((0, 2 * ELEM, 0, 5 * ELEM),))
    copies = sorted((op.transfer.dst_rank, op.transfer.src_offset, op.transfer.nbytes)
                    for ops in m.slots for op in ops if isinstance(op, Copy))
    assert copies == [(0, 0, 4), (1, 4, 4), (2, 8, 2)]  # rank 3 gets nothing
    from conccl.collectives.all_gather import plan_all_gather

    with pytest.raises(InvalidArgument, match="push"):
        from_parts(plan_all_gather(2, 0, 8), 8, ((0, 8, 0, 8),))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_widening_plan_moves_16_bit_chunks_and_sums_them_into_fp32(dtype):
    """16-bit gradients reduced in fp32 (FSDP2's reduce_dtype=float32): the copies and the
    workspace are the 16-bit plan's, the one reduction writes fp32 (twice the chunk's bytes)."""
    narrow = plan_reduce_scatter(3, 1, 4096, dtype, 0.5, stream_mode=StreamMode.PER_PEER)
    wide = plan_reduce_scatter(3, 1, 4096, dtype, 0.5, stream_mode=StreamMode.PER_PEER, out_dtype="float32")
    copies = lambda s: [op for ops in s.slots for op in ops if isinstance(op, Copy)]  # noqa: E731
    assert copies(wide) == copies(narrow) and wide.workspace_bytes == narrow.workspace_bytes
    (red,) = [op for ops in wide.slots for op in ops if isinstance(op, Reduce)]
    assert (red.dtype, red.out_dtype, red.nbytes, red.out_bytes) == (dtype, "float32", 4096, 8192)
    (same,) = [op for ops in narrow.slots for op in ops if isinstance(op, Reduce)]
    assert same.out_dtype is None and same.out_bytes == 4096
    assert plan_reduce_scatter(3, 1, 4096, dtype, out_dtype=dtype) == plan_reduce_scatter(3, 1, 4096, dtype)
    with pytest.raises(InvalidArgument, match="float32"):
        plan_reduce_scatter(3, 1, 4096, "float32", out_dtype="bfloat16")
