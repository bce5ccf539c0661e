"""CPU multi-process tier: persistent collectives on groups that span (simulated) hosts
(:class:`conccl.group.persistent.HierarchicalPersistent`): agreed across hosts once, each start
equal to the flat reference with the buffers' new contents, no cross-node descriptor exchange
per start, mixed with ordinary calls, and refused where they cannot run."""
from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from conccl.collectives import REGISTRY  # noqa: E402
from conccl.errors import CollectiveError, GroupBroken, InvalidArgument  # noqa: E402
from conccl.testing import spawn_hosts  # noqa: E402

STARTS = 3


def _ints(n, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, (n,), generator=g).to(dtype)


def _same(a, b) -> bool:
    return a.dtype == b.dtype and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _persistent_every_collective(comm):
    w, r, n = comm.world, comm.rank, 6
    exchanges = []
    real_exchange = comm.cross.exchange
    comm.cross.exchange = lambda row: exchanges.append(row) or real_exchange(row)
    half = dist._make_nccl_premul_sum(0.5)
    ag_in, ag_out = torch.empty(n), torch.empty(w * n)
    rs_in, rs_out = torch.empty(w * n), torch.empty(n)
    ar = torch.empty(w * n + 1)  # a count no host's rank count divides: the padded path
    a2a_in, a2a_out = torch.empty(w * n), torch.empty(w * n)
    ops = {"all_gather": comm.persistent_all_gather_into_tensor(ag_out, ag_in),
           "reduce_scatter": comm.persistent_reduce_scatter_tensor(rs_out, rs_in, half),
           "all_reduce": comm.persistent_all_reduce(ar, ar),
           "all_to_all": comm.persistent_all_to_all_single(a2a_out, a2a_in)}
    made = len(exchanges)
    right = []
    for step in range(STARTS):
        seed = 100 * step
        every = {"all_gather": [_ints(n, seed + q) for q in range(w)],
                 "reduce_scatter": [_ints(w * n, seed + 10 + q) for q in range(w)],
                 "all_reduce": [_ints(w * n + 1, seed + 20 + q) for q in range(w)],
                 "all_to_all": [_ints(w * n, seed + 30 + q) for q in range(w)]}
        ag_in.copy_(every["all_gather"][r])
        rs_in.copy_(every["reduce_scatter"][r])
        ar.copy_(every["all_reduce"][r])
        a2a_in.copy_(every["all_to_all"][r])
        for name, op in ops.items():
            work = op.start(async_op=step == 1)
            work.wait()
        # an ordinary call between starts: sequence numbers stay in step on every rank
        out = torch.empty(w * 2)
        comm.all_gather_into_tensor(out, torch.full((2,), float(r + step)))
        right.append(_same(out, torch.arange(w).float().add(step).repeat_interleave(2)))
        want = {name: REGISTRY[name].reference(every[name], r, [(half,)] * w if name == "reduce_scatter" else None)
                for name in ops}
        got = {"all_gather": ag_out, "reduce_scatter": rs_out, "all_reduce": ar, "all_to_all": a2a_out}
        right += [_same(got[name], want[name]) for name in ops]
    starts_exchanged = len(exchanges) - made - STARTS  # minus the ordinary calls' own exchanges
    # a tensor resized in place (same address, fewer elements) is refused before anything moves
    rs_in.resize_(w * n - 1)
    try:
        ops["reduce_scatter"].start()
        resized = "started"
    except InvalidArgument as e:
        resized = "refused" if "size" in str(e) else str(e)
    closed = []
    comm.close()
    for op in ops.values():
        closed.append(op.closed and op.input is None)  # the group closed its ops, not only itself
        try:
            op.start()
            closed.append("started")
        except InvalidArgument as e:
            closed.append("closed" if "closed" in str(e) else str(e))
    return right, made, starts_exchanged, closed, resized


@pytest.mark.parametrize("spec", ["2x2", "3x2"])
def test_persistent_ops_equal_the_flat_reference_start_after_start_without_a_cross_node_exchange(spec):
    for right, made, starts_exchanged, closed, resized in spawn_hosts(spec, _persistent_every_collective):
        assert right and all(right), right
        assert made == 4  # one cross-node agreement per op, when it was made
        assert starts_exchanged == 0  # ... and none per start
        assert resized == "refused"
        assert closed == [True, "closed"] * 4  # closing the group closes its ops


def _mismatched_persistent(comm, culprit):
    w, r = comm.world, comm.rank
    size = 5 if r == culprit else 4
    out = torch.full((w * size,), -1.0)
    try:
        comm.persistent_all_gather_into_tensor(out, torch.ones(size))
        msg = None
    except CollectiveError as e:
        msg = str(e)
    # the group is still usable, and in step: an ordinary call after the refusal is right
    res = torch.empty(w * 3)
    comm.all_gather_into_tensor(res, torch.full((3,), float(r)))
    return msg, bool((out == -1).all()), _same(res, torch.arange(w).float().repeat_interleave(3))


def test_a_persistent_op_that_ranks_on_other_hosts_make_differently_is_refused_on_every_rank():
    for msg, untouched, after in spawn_hosts("2x2", _mismatched_persistent, 3):
        assert msg is not None and "nothing was moved" in msg, msg
        assert untouched and after


def _dies_between_starts(comm, victim):
    w, r = comm.world, comm.rank
    out = torch.empty(w * 8)
    op = comm.persistent_all_gather_into_tensor(out, torch.full((8,), float(r)))
    op.start()
    if r == victim:
        os._exit(1)
    start = time.monotonic()
    try:
        op.start()
        return "no error", 0.0, None
    except CollectiveError as e:
        first, waited = type(e).__name__, time.monotonic() - start
    try:
        op.start()  # the group is broken: refused before anything moves
        later = "no error"
    except GroupBroken:
        later = "GroupBroken"
    except CollectiveError as e:
        later = type(e).__name__
    return first, waited, later


def test_a_rank_dying_on_another_host_between_starts_raises_on_every_survivor_within_the_timeout():
    timeout, victim = 3.0, 2
    results = spawn_hosts("2x2", _dies_between_starts, victim, timeout=timedelta(seconds=timeout),
                          allow_missing=(victim,), join_timeout_s=60)
    for rank, res in enumerate(results):
        if rank != victim:
            kind, waited, later = res
            assert kind in ("CollectiveTimeout", "GroupBroken") and waited < timeout + 1.0, (rank, res)
            assert later == "GroupBroken", (rank, res)
