"""CPU multi-process tier: push all-gathers whose own chunk is read back from a peer's output
(Options.own_chunk_via_peer), run by the reference executor across processes: eager with the
ranks drifting apart, on some ranks only (the choice is each rank's own), captured and
replayed, and as a persistent op."""
from __future__ import annotations

import random
import time

import pytest

torch = pytest.importorskip("torch")

from conccl import StreamMode  # noqa: E402
from conccl.collectives.all_gather import ALL_GATHER  # noqa: E402
from conccl.testing import spawn  # noqa: E402
from conccl.schedule.base import Copy  # noqa: E402


def _record_runs(ex):
    """The schedules the executor runs or captures, recorded."""
    ran = []
    run, capture = ex.run, ex.capture_call
    ex.run = lambda schedule, *a, **k: (ran.append(schedule), run(schedule, *a, **k))[1]
    ex.capture_call = lambda schedule, *a, **k: (ran.append(schedule), capture(schedule, *a, **k))[1]
    return ran


def _same_gpu_copies(schedule) -> int:
    return sum(1 for ops in schedule.slots for op in ops
               if isinstance(op, Copy) and op.transfer.src_rank == op.transfer.dst_rank)


def _expected(w, n, step):
    return torch.cat([torch.arange(n, dtype=torch.float32) + 1000 * k + 7 * step for k in range(w)])


def _eager(comm, mode, on_ranks, calls):
    w, r = comm.world, comm.rank
    comm.options.stream_mode = mode
    comm.options.own_chunk_via_peer = r in on_ranks
    ran = _record_runs(comm.executor)
    rng = random.Random(r)
    n = 33
    out = comm.executor.empty((w * n,), torch.float32)  # peer-reachable: the push (the default)
    inp = torch.empty(n)
    ok = []
    for step in range(calls):
        inp.copy_(torch.arange(n, dtype=torch.float32) + 1000 * r + 7 * step)
        time.sleep(rng.random() * 0.003)
        comm.all_gather_into_tensor(out, inp)
        ok.append(bool(torch.equal(out, _expected(w, n, step))))
        out.fill_(-1)  # the caller reuses its output: a late read-back would see this
    return ok, sorted({_same_gpu_copies(s) for s in ran})


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("mode", list(StreamMode))
def test_eager_push_all_gathers_read_their_own_chunk_back_on_every_or_some_ranks(world, mode):
    for on_ranks in (range(world), [0]):
        for r, (ok, own_copies) in enumerate(spawn(world, _eager, mode, list(on_ranks), 12)):
            assert ok == [True] * 12, (r, ok)
            assert own_copies == ([0] if r in on_ranks else [1]), (r, own_copies)


def _captured_and_persistent(comm, mode, replays):
    w, r = comm.world, comm.rank
    comm.options.stream_mode = mode
    comm.options.own_chunk_via_peer = True
    ex = comm.executor
    ran = _record_runs(ex)
    rng = random.Random(r)
    n = 20
    inp = torch.empty(n)
    graph_out = ex.empty((w * n,), torch.float32)
    persistent = comm.persistent(ALL_GATHER, ex.empty((w * n,), torch.float32), inp, ())
    with ex.capture() as graph:
        comm.all_gather_into_tensor(graph_out, inp)
    ok = []
    for step in range(replays):
        inp.copy_(torch.arange(n, dtype=torch.float32) + 1000 * r + 7 * step)
        time.sleep(rng.random() * 0.005)
        ex.replay(graph)
        ok.append(bool(torch.equal(graph_out, _expected(w, n, step))))
        graph_out.fill_(-1)
        persistent.start()
        ok.append(bool(torch.equal(persistent.output, _expected(w, n, step))))
        persistent.output.fill_(-1)
    return ok, sorted({_same_gpu_copies(s) for s in ran})


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("mode", [StreamMode.BATCH, StreamMode.PER_PEER])
def test_captured_and_persistent_push_all_gathers_read_their_own_chunk_back(world, mode):
    for ok, own_copies in spawn(world, _captured_and_persistent, mode, 4):
        assert ok == [True] * 8, ok
        assert own_copies == [0], own_copies


def _toggled(comm, calls):
    """The option changed between calls on the same buffers: each call runs the schedule the
    option asks for at that call (the remembered local step is keyed on it)."""
    w, r = comm.world, comm.rank
    ran = _record_runs(comm.executor)
    n = 9
    out, inp = comm.executor.empty((w * n,), torch.float32), torch.empty(n)
    ok, own = [], []
    for step in range(calls):
        comm.options.own_chunk_via_peer = step % 3 == 1  # off, on, off, off, on, ...
        inp.copy_(torch.arange(n, dtype=torch.float32) + 1000 * r + 7 * step)
        comm.all_gather_into_tensor(out, inp)
        ok.append(bool(torch.equal(out, _expected(w, n, step))))
        own.append(_same_gpu_copies(ran[-1]))
    return ok, own


@pytest.mark.parametrize("world", [2, 3])
def test_the_option_changed_between_calls_on_the_same_buffers_takes_effect_at_once(world):
    for ok, own in spawn(world, _toggled, 9):
        assert ok == [True] * 9, ok
        assert own == [0 if step % 3 == 1 else 1 for step in range(9)], own
