"""No-device tier: schedules are pure data; check placement and the signal protocol."""
from __future__ import annotations

import itertools

import pytest

from conccl.collectives.all_gather import plan_all_gather
from conccl.collectives.all_reduce import plan_all_reduce
from conccl.collectives.all_to_all import equal_split_matrix, plan_all_to_all
from conccl.collectives.reduce_scatter import plan_reduce_scatter
from conccl.schedule.base import DOUBLE_BUFFER_MAX_BYTES, Algorithm, Buf, Copy, Phase, SetSignal, Signal, StreamMode, WaitSignal
from conccl.validate import InvalidArgument

MODES = list(StreamMode)


def _written(schedules, rank, buf=Buf.OUTPUT):
    """Byte ranges of ``rank``'s buffer written by any rank's schedule, with where they came from."""
    return sorted((t.dst_offset, t.dst_offset + t.nbytes, t.src_rank, t.src, t.src_offset)
                  for s in schedules for t in s.transfers if t.dst_rank == rank and t.dst is buf)


def _covers_once(ranges, total):
    pos = 0
    for start, end, *_ in ranges:
        assert start == pos, f"gap or overlap at {pos}: {ranges}"
        pos = end
    assert pos == total


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo,sym_in,sym_out", [(Algorithm.PULL, False, False), (Algorithm.PULL, True, False),
                                                 (Algorithm.PUSH, False, True)])
def test_all_gather_places_every_chunk_once(world, mode, algo, sym_in, sym_out):
    n = 1000
    plans = [plan_all_gather(world, r, n, algorithm=algo, stream_mode=mode, input_symmetric=sym_in,
                             output_symmetric=sym_out) for r in range(world)]
    for r in range(world):
        written = _written(plans, r)
        _covers_once(written, world * n)
        for start, _, src_rank, src, src_off in written:
            assert start == src_rank * n  # chunk k comes from rank k
            staged = algo is Algorithm.PULL and not sym_in and world > 1 and src_rank != r
            assert src is (Buf.WORKSPACE if staged else Buf.INPUT)


def test_all_gather_in_place_reads_peers_outputs_and_skips_own_copy():
    plans = [plan_all_gather(4, r, 64, input_symmetric=False, output_symmetric=True, in_place=True,
                             peers_in_place=True) for r in range(4)]
    for r, p in enumerate(plans):
        assert all(t.src is Buf.OUTPUT and t.src_offset == t.src_rank * 64 for t in p.transfers)
        assert not any(t.phase is Phase.LOCAL for t in p.transfers)
        _covers_once(sorted(_written(plans, r) + [(r * 64, (r + 1) * 64, r, None, 0)], key=lambda x: x[0]), 256)


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("algo,sym_out", [(Algorithm.PULL, False), (Algorithm.PUSH, True)])
def test_all_to_all_uneven_and_zero_splits(world, algo, sym_out):
    matrix = tuple(tuple(((s * 3 + d * 5) % 4) * 8 for d in range(world)) for s in range(world))
    plans = [plan_all_to_all(world, r, matrix, algorithm=algo, output_symmetric=sym_out) for r in range(world)]
    for r in range(world):
        written = _written(plans, r)
        _covers_once(written, sum(matrix[s][r] for s in range(world)))
        for start, end, src_rank, _, src_off in written:
            assert end - start == matrix[src_rank][r]
            assert src_off == sum(matrix[src_rank][:r])  # rank r's chunk within the source's input
    # zero-byte chunks move nothing
    assert all(t.nbytes > 0 for p in plans for t in p.transfers)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("mode", MODES)
def test_every_wait_has_a_matching_signal(world, mode):
    # Each collective's kinds: pulls announce READY, pushes into the workspace wait for FREE
    # instead (double buffering), every call makes the release (FREE) and reports DONE.
    one_phase = {Signal.READY, Signal.DONE, Signal.FREE}
    for plans, kinds in (([plan_all_gather(world, r, 10, stream_mode=mode) for r in range(world)], one_phase),
                         ([plan_all_to_all(world, r, equal_split_matrix(world, 0), stream_mode=mode)
                           for r in range(world)], one_phase),
                         ([plan_reduce_scatter(world, r, 32, "float32", stream_mode=mode) for r in range(world)],
                          {Signal.DONE, Signal.FREE}),
                         # an all-reduce of fewer elements than ranks: some chunks are empty
                         ([plan_all_reduce(world, r, 3, 4, "float32", stream_mode=mode) for r in range(world)],
                          set(Signal) - {Signal.READY})):
        sets = {(r, op.peer, op.kind, op.seq_delta) for r, p in enumerate(plans) for ops in p.slots for op in ops
                if isinstance(op, SetSignal)}
        for r, p in enumerate(plans):
            assert p.double_buffered == (p.workspace_bytes > 0)
            for ops in p.slots:
                for op in ops:
                    if isinstance(op, WaitSignal) and op.seq_delta == 0:
                        assert (op.peer, r, op.kind, 0) in sets
                    elif isinstance(op, WaitSignal) and op.kind is Signal.FREE:
                        # FREE >= s-1 is what the peer wrote (s') in its call s' = s-1
                        assert op.seq_delta == -1 and (op.peer, r, Signal.FREE, 0) in sets
                    elif isinstance(op, WaitSignal):  # the release's wait for the previous call
                        assert (op.kind, op.seq_delta) == (Signal.DONE, -1)
            # every rank reports every kind its collective uses to every peer, every call, even
            # with no bytes
            assert {op.kind for ops in p.slots for op in ops if isinstance(op, SetSignal)} == kinds
            for peer, kind in itertools.product(set(range(world)) - {r}, kinds):
                assert (r, peer, kind, 0) in sets


def test_single_stream_puts_own_shard_after_peer_copies():
    p = plan_all_gather(4, 1, 100, stream_mode=StreamMode.SINGLE)
    assert p.num_slots == 1
    phases = [op.transfer.phase for op in p.slots[0] if isinstance(op, Copy)]
    assert phases == [Phase.STAGE, Phase.PEER, Phase.PEER, Phase.PEER, Phase.LOCAL]


def test_per_peer_mode_uses_one_slot_per_peer_and_numbers_them():
    p = plan_all_gather(4, 0, 100, stream_mode=StreamMode.PER_PEER)
    assert p.num_slots == 5  # control, three peers, own shard
    for k, ops in enumerate(p.slots):
        assert all(op.transfer.slot == k for op in ops if isinstance(op, Copy))
    # peers are visited starting after the own rank so no GPU is everyone's first source
    first_peer = [op.peer for op in p.slots[1] if isinstance(op, WaitSignal)][0]
    assert first_peer == 1


def test_staged_pull_stages_into_its_half_without_waiting():
    """Double-buffered: the staging of call s writes the half call s-2 used, which the release
    of call s-1 (waits for DONE(s-2)) freed, so nothing waits before it; a call too large to
    double-buffer waits for the previous call's readers first, and for every peer at its end."""
    ops = plan_all_gather(3, 0, 8, stream_mode=StreamMode.SINGLE).slots[0]
    stage_at = next(i for i, op in enumerate(ops) if isinstance(op, Copy))
    assert stage_at == 0
    release = [(op.peer, op.kind, op.seq_delta) for op in ops if isinstance(op, (WaitSignal, SetSignal))
               and op.kind in (Signal.FREE,) or (isinstance(op, WaitSignal) and op.seq_delta == -1)]
    assert sorted(release) == [(1, Signal.DONE, -1), (1, Signal.FREE, 0), (2, Signal.DONE, -1), (2, Signal.FREE, 0)]
    big = plan_all_gather(3, 0, DOUBLE_BUFFER_MAX_BYTES + 16, stream_mode=StreamMode.SINGLE)
    assert not big.double_buffered
    ops = big.slots[0]
    stage_at = next(i for i, op in enumerate(ops) if isinstance(op, Copy))
    waits = [op for op in ops[:stage_at] if isinstance(op, WaitSignal)]
    assert {(w.peer, w.kind, w.seq_delta) for w in waits} == {(1, Signal.DONE, -1), (2, Signal.DONE, -1)}
    # ends: DONE(s) of every peer, then the release (FREE only: DONE(s) implies DONE(s-1))
    assert [(op.peer, op.kind) for op in ops[-4:]] == [(1, Signal.DONE), (2, Signal.DONE), (1, Signal.FREE),
                                                        (2, Signal.FREE)]


def test_symmetric_input_call_ends_after_peers_read_it():
    ops = plan_all_gather(3, 0, 8, input_symmetric=True, stream_mode=StreamMode.SINGLE).slots[0]
    assert [(op.peer, op.kind, op.seq_delta) for op in ops[-2:]] == [(1, Signal.DONE, 0), (2, Signal.DONE, 0)]


def test_plans_are_cached_pure_functions():
    assert plan_all_gather(4, 2, 4096) is plan_all_gather(4, 2, 4096)
    assert plan_all_gather(4, 2, 4096) != plan_all_gather(4, 1, 4096)


@pytest.mark.parametrize("call", [
    lambda: plan_all_gather(4, 4, 10),
    lambda: plan_all_gather(4, 0, 10, algorithm=Algorithm.PUSH),
    lambda: plan_all_to_all(2, 0, ((1, 2),)),
    lambda: plan_all_to_all(2, 0, ((1, -2), (3, 4))),
    lambda: plan_all_to_all(2, 0, ((1, 2), (3, 4)), algorithm=Algorithm.PUSH),
])
def test_bad_plans_raise(call):
    with pytest.raises(InvalidArgument):
        call()
