"""CPU multi-process tier for tensor parallelism (conccl.tp): every pipeline schedule, run by
the reference executor across processes (the same schedules, marks and signal protocol as the
GPU), gives the serial result: the whole collective, then one GEMM (or one GEMM, then the
reduce-scatter). Inputs are small whole numbers, so every GEMM is exact and "the same result"
means the same bits whatever the rows a GEMM step covers."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conccl import tp as ctp  # noqa: E402
from conccl.collectives.reduce_scatter import REDUCE_SCATTER  # noqa: E402
from conccl.errors import InvalidArgument  # noqa: E402
from conccl.testing import spawn  # noqa: E402

SCHEDULES = ["serial", "ring", "direct", "direct-p2", "direct-p4-g2", "ring-p3", "direct-p3-g3", "direct-s2",
             "ring-p2-g2-s2", "push", "push-s2", "auto"]


def _ints(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).to(dtype)


def _every_schedule(comm, rows, K, Ns, dtype):
    w, r = comm.world, comm.rank
    shards = [_ints((rows, K), 100 + s, dtype) for s in range(w)]
    weights = [_ints((K, n), 7 + i, dtype) for i, n in enumerate(Ns)]
    full = torch.cat(shards)
    expect_ag = [full @ wt for wt in weights]
    a_rs = [_ints((w * rows, K), 200 + s, dtype) for s in range(w)]
    expect_rs = REDUCE_SCATTER.reference([(a @ weights[0]).reshape(-1) for a in a_rs], r).view(rows, Ns[0])
    bad = []
    for name in SCHEDULES:
        for rep in range(3):  # the later calls run the cached pipeline; the last keeps no gathered rows
            gathered, outs = ctp.all_gather_matmul(shards[r].clone(), weights, 0, comm, schedule=name,
                                                   return_gathered=rep < 2)
            if (rep < 2 and not torch.equal(gathered, full)) or any(not torch.equal(o, e) for o, e in zip(outs, expect_ag)):
                bad.append(("ag_gemm", name, rep))
            out = ctp.matmul_reduce_scatter(a_rs[r].clone(), weights[0], 0, None, comm, schedule=name)
            if not torch.equal(out.view(torch.uint8), expect_rs.view(torch.uint8)):
                bad.append(("gemm_rs", name, rep))
    return bad


@pytest.mark.parametrize("world", [2, 3, 4, 5, 6, 7, 8])
def test_every_schedule_equals_the_serial_result(world):
    results = spawn(world, _every_schedule, 6, 16, (12, 8), torch.float32)
    assert results == [[]] * world


def test_bf16_and_a_shard_of_fewer_rows_than_pieces():
    assert spawn(2, _every_schedule, 2, 8, (4,), torch.bfloat16) == [[]] * 2


def _async_and_other_dims(comm):
    w, r = comm.world, comm.rank
    x = [_ints((2, 3, 8), 300 + s) for s in range(w)]  # [batch, seq shard, K]: gather the sequence
    wt = _ints((8, 5), 9)
    work, A, (y,) = ctp.all_gather_matmul(x[r].clone(), wt, 1, comm, schedule="direct-p2", return_gathered=True,
                                          async_op=True)
    before = work.is_completed()
    work.wait()
    full = torch.cat(x, dim=1)
    ok = torch.equal(A, full) and torch.equal(y, full @ wt) and not before
    a = _ints((2, 4 * w, 8), 400 + r)
    z = ctp.matmul_reduce_scatter(a, wt, 1, None, comm, schedule="direct-p2")
    total = sum(_ints((2, 4 * w, 8), 400 + s) @ wt for s in range(w))
    return ok and torch.equal(z, total[:, 4 * r:4 * (r + 1)])


def test_async_op_and_a_gather_dim_other_than_rows():
    assert spawn(3, _async_and_other_dims) == [True] * 3


def _bad_inputs(comm):
    errors = []
    a = torch.zeros(4, 8)
    for call in (lambda: ctp.all_gather_matmul(a, torch.zeros(7, 3), 0, comm),
                 lambda: ctp.all_gather_matmul(a, torch.zeros(8, 3, dtype=torch.float64), 0, comm),
                 lambda: ctp.all_gather_matmul(a, torch.zeros(8, 3), 1, comm),
                 lambda: ctp.all_gather_matmul(a, torch.zeros(8, 3), 0, comm, schedule="fastest"),
                 lambda: ctp.matmul_reduce_scatter(torch.zeros(3, 8), torch.zeros(8, 3), 0, None, comm),
                 lambda: ctp.matmul_reduce_scatter(a.to(torch.int32), torch.zeros(8, 3, dtype=torch.int32), 0,
                                                   None, comm)):
        try:
            call()
            errors.append(None)
        except InvalidArgument as e:
            errors.append(str(e)[:40])
    # The group is still usable after every refusal, and the sequence numbers stayed in step.
    _, (y,) = ctp.all_gather_matmul(torch.ones(2, 8), torch.ones(8, 3), 0, comm, schedule="direct")
    return errors, torch.equal(y, torch.full((2 * comm.world, 3), 8.0))


def test_bad_inputs_are_refused_before_anything_moves():
    for errors, ok in spawn(2, _bad_inputs):
        assert None not in errors and ok, errors


def _mlp(comm, steps, world_sched):
    """A SwiGLU MLP block sharded with the parallel layers trains like the unsharded block."""
    torch.manual_seed(0)
    w, r = comm.world, comm.rank
    d, f, seq = 16, 32, 4 * w
    gate, up, down = (torch.randn(f, d) * 0.3, torch.randn(f, d) * 0.3, torch.randn(d, f) * 0.3)
    xs = [torch.randn(seq, d) for _ in range(steps)]
    # Unsharded reference.
    ref = [t.clone().requires_grad_() for t in (gate, up, down)]
    opt = torch.optim.SGD(ref, lr=0.1)
    ref_losses = []
    for x in xs:
        h = torch.nn.functional.silu(x @ ref[0].t()) * (x @ ref[1].t())
        loss = ((h @ ref[2].t()) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())
    col = ctp.ColumnParallelLinear(d, (f, f), comm, world_size=w, schedule=world_sched, backward_schedule=world_sched)
    row = ctp.RowParallelLinear(f, d, comm, world_size=w, schedule=world_sched, backward_schedule=world_sched)
    part = slice(r * f // w, (r + 1) * f // w)
    with torch.no_grad():
        col.weights[0].copy_(gate[part])
        col.weights[1].copy_(up[part])
        row.weight.copy_(down[:, part])
    params = list(col.parameters()) + list(row.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    losses = []
    rows = slice(r * seq // w, (r + 1) * seq // w)
    for x in xs:
        g_, u_ = col(x[rows])
        y = row(torch.nn.functional.silu(g_) * u_)
        local = (y ** 2).sum() / (seq * d)  # this rank's share of the mean over the whole sequence
        opt.zero_grad()
        local.backward()
        opt.step()
        total = torch.tensor([local.item()])
        losses.append(total)
    # Plain lists: a tensor sent back through the queue would outlive its process's memory.
    return ref_losses, [t.item() for t in losses], ref[0].detach()[part].tolist(), col.weights[0].detach().tolist()


@pytest.mark.parametrize("sched", ["direct-p2", "serial", "push", "auto"])
def test_a_sharded_mlp_block_trains_like_the_unsharded_block(sched):
    world = 2
    out = spawn(world, _mlp, 5, sched)
    ref_losses = out[0][0]
    for rank, (ref, local, ref_gate, gate) in enumerate(out):
        assert ref == ref_losses
        # fp32: only the order of summation differs (chunked GEMMs, the reduce-scatter's order)
        torch.testing.assert_close(torch.tensor(gate), torch.tensor(ref_gate), rtol=1e-5, atol=1e-6)
    summed = [sum(o[1][i] for o in out) for i in range(len(ref_losses))]
    assert summed == pytest.approx(ref_losses, rel=1e-5)


def _captured(comm, replays, jitter):
    """Both ops captured (the reference executor's stand-in for a CUDA graph) with every kind of
    schedule, replayed with new inputs, eager pipelines in between (their marks hold sequence
    numbers a replay must not mistake for its own)."""
    import random
    import time

    w, r = comm.world, comm.rank
    rng = random.Random(r)
    rows, K, N = 4, 8, 6
    wt = _ints((K, N), 11)
    names = ("direct", "direct-p2", "ring-p2-g2", "serial", "direct-s2", "push")
    shard = torch.empty(rows, K)  # the graph's buffers: filled before each replay
    a = torch.empty(w * rows, K)
    results = []
    ex = comm.executor
    with ex.capture() as graph:
        for name in names:
            results.append(ctp.all_gather_matmul(shard, wt, 0, comm, schedule=name, return_gathered=True))
            results.append(ctp.matmul_reduce_scatter(a, wt, 0, None, comm, schedule=name))  # push: as direct
    assert comm.seq == 0 and comm.graph_slots == 2 * len(names)
    marks = [rec[-1] for rec in graph]  # each captured pipeline's block of mark words: its own
    assert all(not np.shares_memory(a, b) for i, a in enumerate(marks) for b in marks[i + 1:])
    assert not any(np.shares_memory(m, ex._marks) for m in marks)  # nor the eager calls'
    bad = []
    for step in range(replays):
        shards = [_ints((rows, K), 500 + 10 * step + s) for s in range(w)]
        a_all = [_ints((w * rows, K), 600 + 10 * step + s) for s in range(w)]
        shard.copy_(shards[r])
        a.copy_(a_all[r])
        if jitter:
            time.sleep(rng.random() * 0.01)
        ex.replay(graph)
        full = torch.cat(shards)
        expect_rs = sum(x @ wt for x in a_all)[r * rows:(r + 1) * rows]
        for i, name in enumerate(names):
            A, (y,) = results[2 * i]
            if not (torch.equal(A, full) and torch.equal(y, full @ wt)):
                bad.append(("ag_gemm", name, step))
            if not torch.equal(results[2 * i + 1], expect_rs):
                bad.append(("gemm_rs", name, step))
        # eager pipelines between replays: their marks take sequence numbers >= 1
        _, (y,) = ctp.all_gather_matmul(shards[r].clone(), wt, 0, comm, schedule="direct-p2")
        if not torch.equal(y, full @ wt):
            bad.append(("eager", step))
    return bad


@pytest.mark.parametrize("world,jitter", [(2, False), (3, True)])
def test_captured_pipelines_replay_right_with_new_inputs_and_eager_calls_between(world, jitter):
    assert spawn(world, _captured, 4, jitter) == [[]] * world


def _capture_fails_on_one_rank(comm):
    """A capture that fails on one rank after the peers agreed it breaks the group on every
    rank (they would replay it without that rank), and the slots stay in step."""
    from conccl.errors import CollectiveError

    ex = comm.executor
    if comm.rank == 0:
        def broken(*a, **k):
            raise RuntimeError("no capture here")
        ex.capture_call = broken
    raised = None
    with ex.capture():
        try:
            ctp.all_gather_matmul(torch.ones(2, 8), torch.ones(8, 3), 0, comm, schedule="direct")
        except CollectiveError as e:
            raised = str(e)
    slots = comm.graph_slots
    later = None
    try:  # the next call on every rank: the group is broken (rank 0 at once, the peers from the board)
        ctp.all_gather_matmul(torch.ones(2, 8), torch.ones(8, 3), 0, comm, schedule="direct", timeout=10)
    except CollectiveError as e:
        later = type(e).__name__
    return raised, slots, later


def test_a_capture_failing_on_one_rank_breaks_the_group():
    results = spawn(2, _capture_fails_on_one_rank)
    # rank 1 raises at its capture here (the reference executor's capture of a staged call meets
    # the peers) or, on CUDA, at its next call
    assert "no capture here" in results[0][0]
    assert [r[1] for r in results] == [1, 1]
    assert all(r[2] is not None for r in results), results


def _push_whole_among_double_buffered(comm, rows):
    """A push pipeline taking the whole workspace (a shard above 64 MiB / world), between
    double-buffered calls that push into the same workspace (reduce-scatters, a small push
    pipeline): each equals the serial result across processes. (Whether the whole call's
    release must wait for its GEMM steps, which this executor runs right after the control
    stream, the interleaving model shows: tests/unit/test_protocol_interleavings.py.)"""
    w, r = comm.world, comm.rank
    K, N = 1024, 3
    wt = _ints((K, N), 5)
    bad = []
    for step in range(2):
        shards = [_ints((rows, K), 40 + 10 * step + s) for s in range(w)]
        _, (y,) = ctp.all_gather_matmul(shards[r].clone(), wt, 0, comm, schedule="push")
        if not torch.equal(y, torch.cat(shards) @ wt):
            bad.append(("whole", step))
        x = [_ints((w * 4, 8), 70 + s) for s in range(w)]
        out = torch.empty(4, 8)
        comm.reduce_scatter_tensor(out, x[r])
        if not torch.equal(out, sum(x)[r * 4:(r + 1) * 4]):
            bad.append(("reduce-scatter", step))
        small = [_ints((3, 8), 90 + s) for s in range(w)]
        _, (z,) = ctp.all_gather_matmul(small[r].clone(), torch.ones(8, 2), 0, comm, schedule="push-s2")
        if not torch.equal(z, torch.cat(small) @ torch.ones(8, 2)):
            bad.append(("double", step))
    return bad


def test_a_push_pipeline_over_the_whole_workspace_among_double_buffered_calls():
    rows = (64 << 20) // (2 * 1024 * 4) + 8  # 2 shards of fp32 rows of 1024: just above 64 MiB
    assert spawn(2, _push_whole_among_double_buffered, rows) == [[]] * 2


def _push_pipeline_beside_a_flat_staged_push(comm, captured):
    """One rank runs the push pipeline, the other the same agreed flat call as a plain
    all-gather with Algorithm.STAGED_PUSH (eagerly and captured, replayed with new inputs):
    their protocols must be one, or the call hangs."""
    from conccl.schedule.base import Algorithm

    w, r = comm.world, comm.rank
    rows, K, N = 4, 8, 3
    wt = _ints((K, N), 21)
    shard, out = torch.empty(rows, K), torch.empty(w * rows, K)

    def call():
        if r == 0:
            comm.all_gather_into_tensor(out, shard, algorithm=Algorithm.STAGED_PUSH)
            return out, None
        A, (y,) = ctp.all_gather_matmul(shard, wt, 0, comm, schedule="push", return_gathered=True)
        return A, y

    bad = []
    ex = comm.executor
    if captured:
        with ex.capture() as graph:
            A, y = call()
    for step in range(3):
        shards = [_ints((rows, K), 60 + 10 * step + s) for s in range(w)]
        shard.copy_(shards[r])
        if captured:
            ex.replay(graph)
        else:
            A, y = call()
        full = torch.cat(shards)
        if not torch.equal(A, full) or (y is not None and not torch.equal(y, full @ wt)):
            bad.append(step)
    return bad


@pytest.mark.parametrize("captured", [False, True])
def test_a_push_pipeline_and_a_flat_staged_push_all_gather_run_one_protocol(captured):
    assert spawn(2, _push_pipeline_beside_a_flat_staged_push, captured) == [[]] * 2
