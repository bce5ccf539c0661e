"""The all-reduce's and the reduce-scatter's plans, with no process: the automatic choice of
one pass, what one pass pushes and reduces, the chunks, and every byte moved by copy with one
reduction (the reference executor running these plans on ranks: tests/multiproc/test_all_reduce.py,
tests/multiproc/test_reduce_scatter.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl import Algorithm, StreamMode  # noqa: E402
from conccl.collectives.all_reduce import (ALL_REDUCE, ONE_PASS_EXTRA_BYTES, chunk_ranges, one_pass,  # noqa: E402
                                           plan_all_reduce)
from conccl.collectives.reduce_scatter import plan_reduce_scatter  # noqa: E402
from conccl.schedule.base import Buf, Phase, Reduce, Signal, WaitSignal  # noqa: E402


def test_the_automatic_choice_runs_one_pass_while_it_sends_little_more_and_stays_double_buffered():
    from conccl.schedule.base import DOUBLE_BUFFER_MAX_BYTES

    # two ranks: the passes send the same bytes; one pass up to a double-buffered workspace
    assert one_pass(DOUBLE_BUFFER_MAX_BYTES // 2, 2) and not one_pass(DOUBLE_BUFFER_MAX_BYTES // 2 + 2, 2)
    # more: up to ONE_PASS_EXTRA_BYTES sent more than two passes, (w-1)(w-2)/w x the tensor
    for world in (3, 4, 8):
        most = world * ONE_PASS_EXTRA_BYTES // ((world - 1) * (world - 2))
        assert one_pass(most, world) and not one_pass(most + 2, world), world
    assert not one_pass(16, 1)
    call = ALL_REDUCE.local(torch.empty(1 << 20), torch.empty(1 << 20), (None,), 8, 0, "cpu")  # 4 MiB
    assert ALL_REDUCE.algorithm(None, False, call, 8) is Algorithm.PUSH
    assert ALL_REDUCE.algorithm(None, False, call, 2) is Algorithm.STAGED_PUSH
    assert ALL_REDUCE.algorithm(Algorithm.PUSH, False, call, 2) is Algorithm.PUSH  # asked: kept


def test_one_pass_pushes_the_whole_input_and_reduces_every_slot_once():
    world, numel, esize = 3, 1000, 2
    for rank in range(world):
        for mode in StreamMode:
            for in_place in (False, True):
                s = plan_all_reduce(world, rank, numel, esize, "bfloat16", stream_mode=mode,
                                    algorithm=Algorithm.STAGED_PUSH, in_place=in_place)
                pushes = [t for t in s.transfers if t.phase is Phase.PEER]
                assert sorted((t.dst_rank, t.src_offset, t.nbytes, t.dst, t.dst_offset) for t in pushes) == [
                    (p, 0, 2000, Buf.WORKSPACE, rank * 2048) for p in range(world) if p != rank]
                reduces = [op for ops in s.slots for op in ops if isinstance(op, Reduce)]
                assert len(reduces) == 1 and reduces[0].nbytes == 2000 and reduces[0].dst == (Buf.OUTPUT, 0)
                assert reduces[0].srcs == tuple((Buf.INPUT, 0) if q == rank else (Buf.WORKSPACE, q * 2048)
                                                for q in range(world))
                # one signal kind on the critical path (DONE of this call), the pushes gated by FREE
                waits = {(w.kind, w.seq_delta) for ops in s.slots for w in ops if isinstance(w, WaitSignal)}
                assert (Signal.DONE, 0) in waits and (Signal.PUSHED, 0) not in waits and (Signal.REDUCED, 0) not in waits
                assert s.workspace_bytes == world * 2048 and s.double_buffered
                if in_place:  # every push before the reduction on one stream
                    assert s.num_slots == 1


def test_chunks_cover_the_tensor_once_and_start_on_16_bytes():
    for numel, world, esize in ((1, 2, 2), (10, 3, 2), (1001, 8, 4), (12345, 5, 2), (0, 4, 4)):
        chunks = chunk_ranges(numel, world, esize)
        assert len(chunks) == world
        assert sum(n for _, n in chunks) == numel * esize
        ends = 0
        for off, n in chunks:
            assert off == ends and off % 16 == 0 or n == 0
            ends = off + n if n else ends


def test_the_all_reduces_plan_moves_every_byte_by_copy_and_reduces_only_its_own_chunk():
    world, numel, esize = 4, 1000, 2
    chunks = chunk_ranges(numel, world, esize)
    for rank in range(world):
        s = plan_all_reduce(world, rank, numel, esize, "bfloat16")
        peer = [t for t in s.transfers if t.phase is Phase.PEER]
        pushes = [t for t in peer if t.src_rank == rank]
        pulls = [t for t in peer if t.dst_rank == rank]
        # each peer gets its chunk of our input, and each peer's reduced chunk comes back
        assert sorted((t.dst_rank, t.src_offset, t.nbytes) for t in pushes) == sorted(
            (p, *chunks[p]) for p in range(world) if p != rank)
        assert sorted((t.src_rank, t.dst_offset, t.nbytes) for t in pulls) == sorted(
            (p, *chunks[p]) for p in range(world) if p != rank)
        assert all(t.src is Buf.WORKSPACE and t.dst is Buf.OUTPUT for t in pulls)
        reduces = [op for ops in s.slots for op in ops if isinstance(op, Reduce)]
        assert len(reduces) == 1 and reduces[0].nbytes == chunks[rank][1]
        # a pull waits for that peer's REDUCED, which it sends only after everyone's PUSHED; a
        # push for the peer's FREE of an earlier call (double buffering), the release for DONE(s-1)
        waits = [op for ops in s.slots for op in ops if isinstance(op, WaitSignal)]
        assert {(w.kind, w.seq_delta) for w in waits} == {(Signal.DONE, -1), (Signal.FREE, -1), (Signal.PUSHED, 0),
                                                          (Signal.REDUCED, 0)}
        assert s.workspace_bytes == world * 512  # 500 bytes per chunk, slots of 256-byte multiples


def test_the_reduce_scatters_plan_moves_every_byte_by_copy_and_reduces_once_in_rank_order():
    world, chunk = 4, 96
    for rank in range(world):
        s = plan_reduce_scatter(world, rank, chunk, "bfloat16")
        assert {t.dst_rank for t in s.transfers} == set(range(world)) - {rank}
        assert all(t.nbytes == chunk and t.src_offset == t.dst_rank * chunk for t in s.transfers)
        reduces = [op for ops in s.slots for op in ops if isinstance(op, Reduce)]
        assert len(reduces) == 1 and reduces[0].nbytes == chunk
        slot = 256  # each peer's chunk at an aligned slot of the workspace (16-byte vectors)
        assert all(t.dst_offset == rank * slot for t in s.transfers)
        assert [src[1] for src in reduces[0].srcs] == [k * chunk if k == rank else k * slot for k in range(world)]
        assert s.workspace_bytes == world * slot
