"""CPU multi-process tier for persistent collectives: agreed once over the host board, then
started many times with only the execute step (reference executor, real signal protocol)."""
from __future__ import annotations

from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from conccl import Algorithm, StreamMode  # noqa: E402
from conccl.errors import CollectiveError, CollectiveTimeout, InvalidArgument  # noqa: E402
from conccl.testing import spawn  # noqa: E402

MODES = [(a, m) for a in (Algorithm.PULL, Algorithm.PUSH) for m in StreamMode]


def _exchanges(comm):
    """Count the board exchanges this rank makes from now on."""
    count = {"n": 0}
    exchange = comm.board.exchange

    def counted(*a, **k):
        count["n"] += 1
        return exchange(*a, **k)

    comm.board.exchange = counted
    return count


def _gather_started_many_times(comm, n, starts):
    w, r = comm.world, comm.rank
    ex = comm.executor
    ok = []
    for algo, mode in MODES:
        out = ex.empty((w * n,), torch.int32)
        inp = ex.empty((n,), torch.int32) if algo is Algorithm.PUSH else torch.empty(n, dtype=torch.int32)
        op = comm.persistent_all_gather_into_tensor(out, inp, algorithm=algo, stream_mode=mode)
        seq0, count = comm.seq, _exchanges(comm)
        for i in range(starts):
            inp.copy_(torch.arange(n, dtype=torch.int32) + 1000 * r + 100 * i)  # new contents every step
            out.fill_(-1)
            op.start()
            expected = torch.cat([torch.arange(n, dtype=torch.int32) + 1000 * k + 100 * i for k in range(w)])
            ok.append(bool(torch.equal(out, expected)))
        # Only the workspace's first growth (pull, staged) may meet the peers; no call does.
        ok.append(comm.seq - seq0 == starts and count["n"] <= 1)
        op.close()
    return ok


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_persistent_all_gather_every_mode(world):
    for per_rank in spawn(world, _gather_started_many_times, 13, 3):
        assert all(per_rank), per_rank


def _a2a_uneven_started_many_times(comm, starts):
    w, r = comm.world, comm.rank
    ex = comm.executor
    in_splits = [(r * 3 + d * 5) % 4 for d in range(w)]  # zeros included
    out_splits = [(s * 3 + r * 5) % 4 for s in range(w)]
    ok = []
    for algo, mode in MODES:
        inp = ex.empty((sum(in_splits), 3), torch.int16)
        out = ex.empty((sum(out_splits), 3), torch.int16)
        op = comm.persistent_all_to_all_single(out, inp, out_splits, in_splits, algorithm=algo, stream_mode=mode)
        for i in range(starts):
            inp.copy_(torch.tensor([[100 * r + d, k, i] for d in range(w) for k in range(in_splits[d])],
                                   dtype=torch.int16).view(-1, 3))
            out.fill_(-1)
            op.start()
            expected = torch.tensor([[100 * s + r, k, i] for s in range(w) for k in range(out_splits[s])],
                                    dtype=torch.int16).view(-1, 3)
            ok.append(bool(torch.equal(out, expected)))
    return ok


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_persistent_all_to_all_uneven_splits(world):
    for per_rank in spawn(world, _a2a_uneven_started_many_times, 2):
        assert all(per_rank), per_rank


def _mixed_with_calls(comm, rounds):
    """Persistent starts and one-shot calls of both collectives interleave on one group: they
    share its sequence numbers and signal words."""
    w, r = comm.world, comm.rank
    ex = comm.executor
    g_out, g_in = ex.empty((w * 5,), torch.int64), ex.empty((5,), torch.int64)
    a_out, a_in = torch.empty(w * 2, dtype=torch.int64), torch.empty(w * 2, dtype=torch.int64)
    gather = comm.persistent_all_gather_into_tensor(g_out, g_in)
    a2a = comm.persistent_all_to_all_single(a_out, a_in)
    wrong = 0
    for i in range(rounds):
        g_in.fill_(i * 10 + r)
        gather.start()
        wrong += int((g_out != (i * 10 + torch.arange(w)).repeat_interleave(5)).sum())
        a_in.copy_((i * 100 + r * 10 + torch.arange(w)).repeat_interleave(2))
        a2a.start()
        wrong += int((a_out != (i * 100 + torch.arange(w) * 10 + r).repeat_interleave(2)).sum())
        out = torch.empty(w * 3, dtype=torch.int64)
        comm.all_gather_into_tensor(out, torch.full((3,), i + r, dtype=torch.int64))  # a one-shot call between
        wrong += int((out != (i + torch.arange(w)).repeat_interleave(3)).sum())
    return wrong, comm.seq, (gather.op_id, a2a.op_id)


def test_persistent_starts_and_calls_interleave():
    assert spawn(4, _mixed_with_calls, 20) == [(0, 60, (1, 2))] * 4


def _async_start_ordering(comm):
    """An async start is not complete when it returns and its output is not there yet; a
    later call of the group runs after it (it reads what the async start wrote); wait()
    completes it. The reference executor defers async calls as a stream would."""
    w, r = comm.world, comm.rank
    out = comm.executor.empty((w * 4,), torch.float32)
    out.fill_(-1.0)
    inp = torch.full((4,), float(r))
    op = comm.persistent_all_gather_into_tensor(out, inp)
    work = op.start(async_op=True)
    early = (work.is_completed(), bool((out == -1.0).all()))
    # A one-shot call whose input is the async start's output: stream order means it runs
    # second, so it gathers the gathered values (every rank's chunk r: r's own value).
    again = torch.empty(w * w * 4)
    comm.all_gather_into_tensor(again, out)
    late = work.is_completed()
    work.wait()
    gathered = torch.arange(w).float().repeat_interleave(4)
    first = out.tolist() == gathered.tolist() and again.tolist() == gathered.repeat(w).tolist()
    # With no later call, wait() alone is what completes a start.
    inp.add_(10.0)
    work = op.start(async_op=True)
    pending = work.is_completed()
    work.wait()
    return early, late, first, (pending, work.is_completed(), out.tolist() == (gathered + 10).tolist())


EXPECTED_ORDER = ((False, True), True, True, (False, True, True))


def test_async_start_is_ordered_before_later_calls_and_completes_on_wait():
    assert spawn(3, _async_start_ordering) == [EXPECTED_ORDER] * 3


def _mismatched_init(comm):
    n = 8 if comm.rank != 1 else 9
    out = torch.full((comm.world * n,), 3.0)
    try:
        comm.persistent_all_gather_into_tensor(out, torch.zeros(n))
    except CollectiveError as e:
        return str(e), bool((out == 3.0).all()), comm.persistent_ops
    return "no error", False, comm.persistent_ops


def test_a_mismatch_at_creation_raises_on_every_rank_and_makes_no_op():
    for msg, untouched, ops in spawn(3, _mismatched_init):
        assert "rank 1" in msg and "nothing was moved" in msg and untouched and ops == 0


def _misuse(comm):
    w = comm.world
    out, inp = torch.empty(w * 4), torch.zeros(4)
    errors = []
    with pytest.raises(ValueError, match="contiguous"):  # validated at creation, as a call is
        comm.persistent_all_gather_into_tensor(torch.empty(w * 8)[::2], inp)
    op = comm.persistent_all_gather_into_tensor(out, inp)
    inp.resize_(1 << 16)  # reallocates: peers would reach the old memory
    try:
        op.start()
    except InvalidArgument as e:
        errors.append("moved" in str(e))
    op.close()
    try:
        op.start()
    except InvalidArgument as e:
        errors.append("closed" in str(e))
    return errors, comm.seq


def test_a_moved_tensor_or_a_closed_op_is_refused_before_anything_moves():
    assert spawn(2, _misuse) == [([True, True], 0)] * 2


def _peer_never_starts(comm):
    import time

    w = comm.world
    op = comm.persistent_all_gather_into_tensor(torch.empty(w * 4), torch.zeros(4), timeout=timedelta(seconds=0.5))
    if comm.rank == 1:
        time.sleep(2.0)
        return "absent"
    try:
        op.start()
    except CollectiveTimeout as e:
        return e.missing
    return "no error"


def test_a_peer_that_never_starts_times_out_with_its_rank_named():
    results = spawn(3, _peer_never_starts)
    assert results[0] == [1] and results[2] == [1]


def _op_of_a_closed_group(comm):
    out = torch.zeros(comm.world * 4)
    op = comm.persistent_all_gather_into_tensor(out, torch.ones(4))
    op.start()
    comm.close()  # what conccl.destroy() does to each group
    try:
        op.start()
    except InvalidArgument as e:
        return op.closed, str(e)
    return op.closed, "started"


def test_an_op_of_a_destroyed_group_is_refused():
    for closed, msg in spawn(2, _op_of_a_closed_group):
        assert closed and "destroyed" in msg


@pytest.mark.parametrize("broken", ["runs_at_once", "later_call_first", "wait_runs_nothing"])
def test_the_async_ordering_test_fails_when_the_ordering_is_broken(monkeypatch, broken):
    """The test above is not vacuous: break the ordering it checks, three ways, and it fails
    (the children are forked, so they inherit the patched executor)."""
    from conccl.executors import reference

    if broken == "runs_at_once":
        run = reference.ReferenceExecutor.run
        monkeypatch.setattr(reference.ReferenceExecutor, "run",
                            lambda self, *a, **k: run(self, *a[:4], False, *a[5:], **k))
    elif broken == "later_call_first":
        flush = reference.ReferenceExecutor.flush
        monkeypatch.setattr(reference.ReferenceExecutor, "flush",
                            lambda self, until=None: flush(self, until) if until is not None else None)
    else:
        monkeypatch.setattr(reference._Deferred, "run_now", lambda self: None)
    try:
        results = spawn(3, _async_start_ordering, timeout=timedelta(seconds=3))
    except RuntimeError as e:  # a rank finished while a peer still waited for its copies
        assert "CollectiveTimeout" in str(e)
        return
    assert results != [EXPECTED_ORDER] * 3
