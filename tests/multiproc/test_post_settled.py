"""CPU multi-process tier (reference executor): settled calls post their row and go on without
waiting for the peers' (``Options.post_settled``, ``HostBoard.post``). Results stay right and
the posts happen where a call writes only its own output and the peers' workspaces; a rank
that makes another call than the one its peers posted breaks the group on every rank, never
silently; with the option off, every call waits for every row."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl.errors import CollectiveError, GroupBroken  # noqa: E402
from conccl.group.agreement import POST_AFTER  # noqa: E402
from conccl.testing import spawn  # noqa: E402

CALLS = 6


def _repeat(comm, post: bool):
    comm.options.post_settled = post
    n, w, r = 8, comm.world, comm.rank
    out, inp = torch.empty(w * n), torch.empty(n)  # the same tensors every call: one settled local step
    rs_out, rs_in = torch.empty(n), torch.empty(w * n)
    right = []
    for i in range(CALLS):
        inp.fill_(100.0 * r + i)
        out.fill_(-1.0)
        comm.all_gather_into_tensor(out, inp)
        want = torch.tensor([100.0 * q + i for q in range(w)]).repeat_interleave(n)
        rs_in.copy_(torch.arange(w * n, dtype=torch.float32) * (r + 1) + i)
        comm.reduce_scatter_tensor(rs_out, rs_in)
        full = sum(torch.arange(w * n, dtype=torch.float32) * (q + 1) + i for q in range(w))
        right.append(torch.equal(out, want) and torch.equal(rs_out, full[r * n:(r + 1) * n]))
    comm.exchange_values([0], "end")  # an exchange: every post compared before it returns
    return right, comm.board.posts, comm.board.pending_posts


@pytest.mark.parametrize("world", [2, 3])
def test_settled_calls_post_their_rows_and_stay_right(world):
    for right, posts, pending in spawn(world, _repeat, True, join_timeout_s=60):
        assert all(right), right
        # both collectives: the first POST_AFTER calls exchange, the rest post
        assert posts == 2 * (CALLS - POST_AFTER), posts
        assert pending == 0  # the closing exchange compared every post: all alike


def test_with_the_option_off_every_call_waits_for_every_row():
    for right, posts, _ in spawn(2, _repeat, False, join_timeout_s=60):
        assert all(right) and posts == 0


def _diverge(comm):
    n, w = 8, comm.world
    out, inp = torch.empty(w * n), torch.zeros(n)
    for _ in range(POST_AFTER + 1):  # settled; the last one posted
        comm.all_gather_into_tensor(out, inp)
    seen = []
    try:
        if comm.rank == 0:
            comm.all_gather_into_tensor(out, inp)  # posted again, on rows rank 1 will not have
        else:  # another size: rank 1 exchanges and finds rank 0's posted row
            comm.all_gather_into_tensor(torch.empty(w * 4), torch.zeros(4))
        seen.append("no error")
    except CollectiveError as e:
        seen.append(f"{type(e).__name__}: {e}")
    try:
        comm.all_gather_into_tensor(out, inp)
        seen.append("no error")
    except GroupBroken:
        seen.append("GroupBroken")
    return seen


def test_another_call_after_the_peers_posted_breaks_the_group_on_every_rank():
    (r0, after0), (r1, after1) = spawn(2, _diverge, join_timeout_s=60)
    # rank 1 names the poster, and does not claim that nothing moved: rank 0's call ran
    assert "rank 0" in r1 and "posted" in r1 and "nothing was moved" not in r1, r1
    assert r0 != "no error", r0  # the poster learns too, at once (the abort word), not at its timeout
    assert after0 == after1 == "GroupBroken"


def _peer_moves(comm, rank0_plain: bool):
    """Rank 0 passes the same input every call (peer-reachable, or a plain tensor); the others
    pass theirs from one place in their mapped memory, then from others: a legitimate call
    each time."""
    n, w = 8, comm.world
    pool = comm.executor.empty((3 * n,), torch.float32)  # a collective call: peer-reachable on every rank
    plain = torch.empty(n)
    out = torch.empty(w * n)
    right = []
    for i in range(CALLS):
        at = 0 if comm.rank == 0 or i < 4 else (i - 3) * n
        inp = plain if comm.rank == 0 and rank0_plain else pool[at:at + n]
        inp.fill_(100.0 * comm.rank + i)
        out.fill_(-1.0)
        comm.all_gather_into_tensor(out, inp)
        right.append(torch.equal(out, torch.tensor([100.0 * q + i for q in range(w)]).repeat_interleave(n)))
    return right, comm.board.posts


@pytest.mark.parametrize("rank0_plain", [False, True])
def test_a_call_whose_plan_a_peer_s_moving_tensor_could_change_never_posts(rank0_plain):
    """Where rank 0's own input is peer-reachable, its plan reads the peers' inputs where they
    are: it must wait for their rows at every call (rank 0 repeats itself, the peers do not).
    Where it is a plain tensor, every call stages, whatever the peers pass: it posts once
    settled, and the peers' rows that then differ still ask for the plan it ran."""
    results = spawn(3, _peer_moves, rank0_plain, join_timeout_s=60)
    assert all(all(right) for right, _ in results), results
    # plain: calls 2 and 3 post, call 4 too (its peers moved), and call 5 where rank 0 had not
    # compared call 4's rows yet (the comparison that finds they differ sends the next call
    # to the board again)
    assert (CALLS - POST_AFTER - 1 <= results[0][1] <= CALLS - POST_AFTER) if rank0_plain else results[0][1] == 0
    assert results[1][1] == results[2][1] == 0  # their own inputs are peer-reachable


def _uneven_all_to_all(comm):
    """Uneven splits; from call 4 on, rank w-2 sends itself more (a legitimate change of its
    own row only): the other ranks repeat their rows, but the offsets they read its chunks at
    move (at world 2, rank 1 reads rank 0's chunk after rank 0's own). No call may run on the
    old offsets."""
    r, w = comm.rank, comm.world
    bufs, right = {}, []
    for i in range(CALLS):
        m = [[2] * w for _ in range(w)]
        m[w - 2][0] = 1
        m[w - 2][w - 2] = 1 if i < 4 else 3
        send, recv = m[r], [m[s][r] for s in range(w)]
        if (tuple(send), tuple(recv)) not in bufs:
            bufs[(tuple(send), tuple(recv))] = (torch.empty(sum(recv)), torch.empty(sum(send)))
        out, inp = bufs[(tuple(send), tuple(recv))]
        inp.copy_(torch.cat([torch.full((n,), 1000.0 * r + 10 * d + i) for d, n in enumerate(send)]))
        out.fill_(-1.0)
        comm.all_to_all_single(out, inp, recv, send)
        right.append(torch.equal(out, torch.cat([torch.full((n,), 1000.0 * s + 10 * r + i) for s, n in enumerate(recv)])))
    return right, comm.board.posts


@pytest.mark.parametrize("world", [2, 3])
def test_an_all_to_all_never_posts_its_plan_reads_what_peers_send_each_other(world):
    for right, posts in spawn(world, _uneven_all_to_all, join_timeout_s=60):
        assert all(right) and posts == 0, (right, posts)


def _all_reduces(comm, moves: str):
    """In-place all-reduces of one tensor (one pass at this size) and of one in two passes.
    ``moves``: "none"; "kinds": every rank's tensor plain, rank 1's peer-reachable on even
    calls from call 4 on (other flags in its row); "views": every rank's tensor peer-reachable,
    rank 1's elsewhere in its mapped memory on even calls from call 4 on (other peer views in
    the rows than its posting peer assumed). The plans read no tensor kind: every call stays
    right and no rank breaks the group."""
    from conccl.collectives.all_reduce import ALL_REDUCE
    from conccl.schedule.base import Algorithm

    w, r = comm.world, comm.rank
    sym = comm.executor.empty((80,), torch.float32)  # a collective call: on every rank
    plain = torch.empty(40) if moves != "views" else sym[:40]
    other = sym[40:] if moves == "views" else sym[:40]
    two = torch.empty(4 * w + 3)
    right = []
    for i in range(CALLS):
        buf = other if moves != "none" and r == 1 and i >= 4 and i % 2 == 0 else plain
        buf.copy_(torch.arange(40, dtype=torch.float32) * (r + 1) + i)
        comm.call(ALL_REDUCE, buf, buf, (None,))
        want = sum(torch.arange(40, dtype=torch.float32) * (q + 1) + i for q in range(w))
        two.fill_(float(r + i))
        comm.call(ALL_REDUCE, two, two, (None,), algorithm=Algorithm.PUSH)
        right.append(torch.equal(buf, want) and torch.equal(two, torch.full_like(two, float(sum(range(w)) + w * i))))
    comm.exchange_values([0], "end")
    return right, comm.board.posts, comm.board.pending_posts


@pytest.mark.parametrize("moves", ["none", "kinds", "views"])
def test_settled_in_place_all_reduces_post_and_stay_right_when_a_peer_changes_tensor_kinds(moves):
    """The public all-reduce is in place (a flag that keeps other collectives from posting): its
    plan reads no tensor kind, so once settled it posts, in one pass and in two; a posted call
    whose peer's row then differs in its tensor's kind or place is accepted (same schedule)."""
    for right, posts, pending in spawn(2, _all_reduces, moves, join_timeout_s=60):
        assert all(right), right  # and no rank broke the group: rows that differ ask for the plan it ran
        if moves != "none":  # rank 1's new row is exchanged, and its peer's post on the old one re-checked
            assert CALLS - POST_AFTER <= posts < 2 * (CALLS - POST_AFTER), posts
        else:
            assert posts == 2 * (CALLS - POST_AFTER), posts
        assert pending == 0


def _staged_pushes(comm):
    """All-gathers from peer-reachable tensors: pushed straight into the peers' outputs (the
    plan reads where they are: never posted), and staged pushes (into the peers' workspace:
    no tensor kind read, so they post once settled)."""
    from conccl.schedule.base import Algorithm

    n, w, r = 8, comm.world, comm.rank
    inp = comm.executor.empty((n,), torch.float32)
    out = comm.executor.empty((w * n,), torch.float32)
    posts, right = {}, []
    for algorithm in (Algorithm.PUSH, Algorithm.STAGED_PUSH):
        before = comm.board.posts
        for i in range(CALLS):
            inp.fill_(100.0 * r + i)
            out.fill_(-1.0)
            comm.all_gather_into_tensor(out, inp, algorithm=algorithm)
            right.append(torch.equal(out, torch.tensor([100.0 * q + i for q in range(w)]).repeat_interleave(n)))
        posts[algorithm.value] = comm.board.posts - before
    comm.exchange_values([0], "end")
    return right, posts


@pytest.mark.parametrize("world", [2, 3])
def test_a_staged_push_from_peer_reachable_tensors_posts_and_a_push_into_them_does_not(world):
    for right, posts in spawn(world, _staged_pushes, join_timeout_s=60):
        assert all(right), right
        assert posts == {"push": 0, "staged_push": CALLS - POST_AFTER}, posts
