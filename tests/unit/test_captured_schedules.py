"""Captured calls' schedules (conccl.schedule.captured.graph_schedule), with no process: each
word waited once and reset, a one-stream call's own copy on a forked branch, a captured push
waiting for the previous replay's FREE (the reference executor replaying such calls on ranks:
tests/multiproc/test_graphs.py)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from conccl import StreamMode  # noqa: E402
from conccl.collectives.all_gather import plan_all_gather  # noqa: E402
from conccl.schedule.base import ResetSignal, Signal, WaitSignal  # noqa: E402
from conccl.schedule.captured import graph_schedule  # noqa: E402


def test_the_captured_schedule_waits_once_per_word_resets_it_and_ends_with_every_done():
    for mode in (StreamMode.BATCH, StreamMode.PER_PEER):
        for staged in (True, False):
            eager = plan_all_gather(4, 1, 64, input_symmetric=not staged, output_symmetric=False, stream_mode=mode)
            g = graph_schedule(eager)
            ops = [op for slot in g.slots for op in slot]
            waits = [op for op in ops if isinstance(op, WaitSignal)]
            assert all(w.seq_delta == 0 for w in waits)  # no wait for the previous call's number
            # each (peer, kind) word waited once, and reset right after on the same slot
            assert len({(w.peer, w.kind) for w in waits}) == len(waits)
            for slot in g.slots:
                for i, op in enumerate(slot):
                    if isinstance(op, WaitSignal):
                        assert slot[i + 1] == ResetSignal(op.peer, op.kind)
            if staged:  # a staged pull: FREE of the previous replay first (primed), no DONE at the end
                assert sorted(w.peer for w in g.slots[0][:6:2]) == [0, 2, 3] and waits[0].kind is Signal.FREE
                assert {w.peer for w in waits if w.kind is Signal.FREE} == {0, 2, 3}
                assert not any(w.kind is Signal.DONE for w in waits)
            else:
                assert {w.peer for w in waits if w.kind is Signal.DONE} == {0, 2, 3}


def test_a_one_stream_calls_own_copy_runs_on_a_forked_branch_and_nothing_else_moves():
    """In a graph the own-shard copy (input to the own chunk) leaves the signal chain for a slot
    of its own (forked at the start, joined at the end); a copy that reads what the call
    computed (the all-reduce's own piece, from the workspace after the sum) stays in order."""
    from conccl.collectives.all_reduce import plan_all_reduce
    from conccl.schedule.base import Algorithm, Buf, Copy, Phase, Reduce

    def local(op):
        return isinstance(op, Copy) and op.transfer.phase is Phase.LOCAL

    for kw in ({"algorithm": Algorithm.PUSH, "input_symmetric": True, "output_symmetric": True},
               {"algorithm": Algorithm.PULL}, {"algorithm": Algorithm.PULL, "input_symmetric": True}):
        eager = plan_all_gather(2, 0, 1 << 16, stream_mode=StreamMode.BATCH, **kw)
        g = graph_schedule(eager)
        assert len(eager.slots) == 1 and len(g.slots) == 2, kw
        assert not any(local(op) for op in g.slots[0])
        assert [op.transfer.slot for op in g.slots[1]] == [1] and all(local(op) for op in g.slots[1])
        assert g.slots[1][0].transfer.src is Buf.INPUT and g.slots[1][0].transfer.dst is Buf.OUTPUT
    in_place = graph_schedule(plan_all_gather(2, 0, 1 << 16, stream_mode=StreamMode.BATCH, in_place=True,
                                              output_symmetric=True, peers_in_place=True))
    assert len(in_place.slots) == 1  # no own copy: nothing to fork
    ar = graph_schedule(plan_all_reduce(2, 0, 1 << 15, 2, "bfloat16", stream_mode=StreamMode.BATCH))
    ops = ar.slots[0]
    assert len(ar.slots) == 1 and any(local(op) for op in ops)
    assert max(i for i, op in enumerate(ops) if isinstance(op, Reduce)) < min(i for i, op in enumerate(ops) if local(op))


def test_a_captured_push_into_the_peers_workspace_waits_for_the_previous_replays_free():
    """One stream: no READY round trip before the pushes, FREE of the previous replay instead
    (sent by each rank last, to every peer); several streams keep the READY."""
    from conccl.collectives.all_reduce import plan_all_reduce
    from conccl.collectives.reduce_scatter import plan_reduce_scatter
    from conccl.schedule.base import SetSignal

    for eager in (plan_reduce_scatter(3, 1, 4096, "bfloat16", stream_mode=StreamMode.BATCH),
                  plan_all_reduce(3, 1, 6144, 2, "bfloat16")):
        (ops,) = graph_schedule(eager).slots
        assert not any(getattr(op, "kind", None) is Signal.READY for op in ops), eager.collective
        assert set(ops[:4]) == {WaitSignal(0, Signal.FREE), ResetSignal(0, Signal.FREE), WaitSignal(2, Signal.FREE),
                                ResetSignal(2, Signal.FREE)}
        assert set(ops[-2:]) == {SetSignal(0, Signal.FREE), SetSignal(2, Signal.FREE)}
        last_done = max(i for i, op in enumerate(ops) if isinstance(op, WaitSignal) and op.kind is Signal.DONE)
        assert last_done < len(ops) - 2  # freed only once every peer is done with this rank's memory
    # several streams alike (a rank's stream mode is its own: the protocol must not depend on it)
    per_peer = graph_schedule(plan_reduce_scatter(3, 1, 4096, "bfloat16", stream_mode=StreamMode.PER_PEER))
    kinds = {op.kind for slot in per_peer.slots for op in slot if isinstance(op, (WaitSignal, SetSignal))}
    assert Signal.READY not in kinds and Signal.FREE in kinds
    assert set(per_peer.slots[0][-2:]) == {SetSignal(0, Signal.FREE), SetSignal(2, Signal.FREE)}
