"""CPU multi-process tier: the reference executor runs the real schedules and signal protocol
across processes over shared memory, for world sizes 1 to 8."""
from __future__ import annotations

from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from conccl import Algorithm, StreamMode  # noqa: E402
from conccl.errors import CollectiveError, CollectiveTimeout  # noqa: E402
from conccl.testing import spawn  # noqa: E402

MODES = [(a, m) for a in (Algorithm.PULL, Algorithm.PUSH) for m in StreamMode]
# the all-gather also pushes into the peers' workspace
GATHER_MODES = MODES + [(Algorithm.STAGED_PUSH, m) for m in StreamMode]


def _gather_all_modes(comm, n):
    w, r = comm.world, comm.rank
    ex = comm.executor
    results = []
    for algo, mode in GATHER_MODES:
        for sym_in in (False, True):
            if algo is Algorithm.PUSH:
                out = ex.empty((w * n,), torch.int32)
            else:
                out = ex.empty((w * n,), torch.int32) if sym_in else torch.empty(w * n, dtype=torch.int32)
            inp = ex.empty((n,), torch.int32) if sym_in else torch.empty(n, dtype=torch.int32)
            inp.copy_(torch.arange(n, dtype=torch.int32) + 1000 * r)
            out.fill_(-1)
            comm.all_gather_into_tensor(out, inp, algorithm=algo, stream_mode=mode)
            expected = torch.cat([torch.arange(n, dtype=torch.int32) + 1000 * k for k in range(w)])
            results.append(bool(torch.equal(out, expected)))
    return results


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_all_gather_every_mode(world):
    for per_rank in spawn(world, _gather_all_modes, 37):
        assert all(per_rank), per_rank


def _gather_in_place(comm, n):
    w, r = comm.world, comm.rank
    ok = []
    sym = comm.executor.empty((w * n,), torch.float32), comm.executor.empty((w * n,), torch.float32)
    for algo, out in ((None, sym[0]), (Algorithm.STAGED_PUSH, torch.empty(w * n)), (Algorithm.STAGED_PUSH, sym[1])):
        out.fill_(-1)
        out[r * n:(r + 1) * n] = r + 0.5
        comm.all_gather_into_tensor(out, out[r * n:(r + 1) * n], algorithm=algo)
        ok.append(bool(torch.equal(out, torch.arange(w).float().add(0.5).repeat_interleave(n))))
    return all(ok)


def _staged_push_back_to_back(comm, calls):
    """Eager staged-push all-gathers, new inputs every call, the ranks drifting apart (random
    sleeps; settled calls post and run ahead): a push into a peer's workspace half must wait
    until the peer has copied out what the call before last left there."""
    import random
    import time

    w, r = comm.world, comm.rank
    rng = random.Random(r)
    inp, out = torch.empty(300), torch.empty(300 * w)
    ok = []
    for step in range(calls):
        inp.copy_(torch.arange(300).float() + 1000 * r + 7 * step)
        time.sleep(rng.random() * 0.003)
        comm.all_gather_into_tensor(out, inp, algorithm=Algorithm.STAGED_PUSH)
        ok.append(bool(torch.equal(out, torch.cat([torch.arange(300).float() + 1000 * k + 7 * step for k in range(w)]))))
    return ok


@pytest.mark.parametrize("world", [2, 3])
def test_staged_push_all_gathers_back_to_back_with_drifting_ranks(world):
    for ok in spawn(world, _staged_push_back_to_back, 30):
        assert ok == [True] * 30, ok


@pytest.mark.parametrize("world", [2, 4])
def test_all_gather_in_place(world):
    assert all(spawn(world, _gather_in_place, 16))


def _a2a(comm, rows, uneven):
    w, r = comm.world, comm.rank
    ok = []
    for algo, mode in MODES:
        if uneven:
            in_splits = [(r * 3 + d * 5) % 4 for d in range(w)]  # zeros included
            out_splits = [(s * 3 + r * 5) % 4 for s in range(w)]
        else:
            in_splits = out_splits = [rows] * w
        ex = comm.executor
        inp = ex.empty((sum(in_splits), 3), torch.int16) if algo is Algorithm.PULL else torch.empty(sum(in_splits), 3, dtype=torch.int16)
        out = ex.empty((sum(out_splits), 3), torch.int16)
        inp.copy_(torch.tensor([[100 * r + d, k, 7] for d in range(w) for k in range(in_splits[d])], dtype=torch.int16).view(-1, 3))
        out.fill_(-1)
        comm.all_to_all_single(out, inp, out_splits if uneven else None, in_splits if uneven else None,
                               algorithm=algo, stream_mode=mode)
        expected = torch.tensor([[100 * s + r, k, 7] for s in range(w) for k in range(out_splits[s])], dtype=torch.int16)
        ok.append(bool(torch.equal(out, expected.view(-1, 3))))
    return ok


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("uneven", [False, True])
def test_all_to_all(world, uneven):
    for per_rank in spawn(world, _a2a, 5, uneven):
        assert all(per_rank), per_rank


def _one_way(comm, piece):
    """Every rank sends to rank 0 only: rank 0's input and its peers' outputs are empty views
    of peer-reachable buffers (an empty view's data_ptr() is 0; it must not move the others)."""
    w, r = comm.world, comm.rank
    ex = comm.executor
    ok = []
    for algo, mode in MODES:
        in_splits = [piece if (r != 0 and d == 0) else 0 for d in range(w)]
        out_splits = [piece if (r == 0 and s != 0) else 0 for s in range(w)]
        inp = ex.empty((w * piece,), torch.int16)[:sum(in_splits)]
        out = ex.empty((w * piece,), torch.int16)[:sum(out_splits)]
        inp.fill_(r)
        out.fill_(-1)
        comm.all_to_all_single(out, inp, out_splits, in_splits, algorithm=algo, stream_mode=mode)
        ok.append(bool(torch.equal(out, torch.tensor([s for s in range(w) for _ in range(out_splits[s])],
                                                      dtype=torch.int16))))
    return ok


@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_one_way_with_empty_views(world):
    for per_rank in spawn(world, _one_way, 8):
        assert all(per_rank), per_rank


def _views_at_rank_offsets(comm, n):
    """Each rank passes views that start at a different offset of its peer-reachable buffers:
    peers are reached at their own view, not at this rank's offset."""
    w, r = comm.world, comm.rank
    ex = comm.executor
    ok = []
    for algo, mode in MODES:
        big_out = ex.empty((w * n + 3 * w,), torch.int32)
        big_in = ex.empty((n + 5 * w,), torch.int32)
        big_out.fill_(-1)
        out = big_out[3 * r:3 * r + w * n]
        inp = big_in[5 * (w - 1 - r):5 * (w - 1 - r) + n]
        inp.copy_(torch.arange(n, dtype=torch.int32) + 1000 * r)
        comm.all_gather_into_tensor(out, inp, algorithm=algo, stream_mode=mode)
        expected = torch.cat([torch.arange(n, dtype=torch.int32) + 1000 * k for k in range(w)])
        untouched = bool((big_out[:3 * r] == -1).all() and (big_out[3 * r + w * n:] == -1).all())
        ok.append(bool(torch.equal(out, expected)) and untouched)
        a2a_out = big_out[3 * r:3 * r + w * (n // w)]
        a2a_out.fill_(-1)
        a2a_in = big_in[5 * (w - 1 - r):5 * (w - 1 - r) + w * (n // w)]
        a2a_in.copy_((torch.arange(w, dtype=torch.int32) + 100 * r).repeat_interleave(n // w))
        comm.all_to_all_single(a2a_out, a2a_in, algorithm=algo, stream_mode=mode)
        ok.append(bool(torch.equal(a2a_out, (torch.arange(w, dtype=torch.int32) * 100 + r).repeat_interleave(n // w))))
    return ok


@pytest.mark.parametrize("world", [2, 3, 4])
def test_views_at_different_offsets_on_each_rank(world):
    for per_rank in spawn(world, _views_at_rank_offsets, 12):
        assert all(per_rank), per_rank


def _back_to_back(comm, calls):
    w, r = comm.world, comm.rank
    wrong = 0
    for i in range(calls):
        n = 1 + (i * 7) % 64  # sizes change between calls: the workspace grows as needed
        if i % 2:
            inp = torch.full((n,), i * 10 + r, dtype=torch.int64)
            out = torch.empty(w * n, dtype=torch.int64)
            comm.all_gather_into_tensor(out, inp)
            wrong += int((out != (i * 10 + torch.arange(w)).repeat_interleave(n)).sum())
        else:
            inp = (i * 100 + r * 10 + torch.arange(w)).repeat_interleave(n)
            out = torch.empty(w * n, dtype=torch.int64)
            comm.all_to_all_single(out, inp)
            wrong += int((out != (i * 100 + torch.arange(w) * 10 + r).repeat_interleave(n)).sum())
    return wrong, comm.seq


def test_back_to_back_calls_of_both_kinds():
    results = spawn(4, _back_to_back, 200)
    assert results == [(0, 200)] * 4


def _peer_moves_its_view(comm, n):
    """Rank 0 passes the same tensors every call; rank 1 moves its output view on call 3 and
    changes its input size on call 5. Rank 0's remembered call must follow the peers' rows."""
    w, r = comm.world, comm.rank
    ex = comm.executor
    inp = ex.empty((2 * n,), torch.int32)
    big = ex.empty((w * n + 3 * n,), torch.int32)
    results = []
    for call in range(6):
        shift = n if (r == 1 and call >= 2) else 0  # rank 1's view starts elsewhere from call 3
        m = n + 1 if (r == 1 and call == 4) else n
        out = big[shift:shift + w * m]
        src = inp[:m]
        src.copy_(torch.arange(m, dtype=torch.int32) + 1000 * r + 100 * call)
        big.fill_(-1)  # before the call: peers write only after this rank's READY
        try:
            comm.all_gather_into_tensor(out, src, algorithm=Algorithm.PUSH)
        except CollectiveError as e:
            results.append(("error", "nothing was moved" in str(e), bool((out == -1).all())))
            continue
        expected = torch.cat([torch.arange(n, dtype=torch.int32) + 1000 * k + 100 * call for k in range(w)])
        results.append(bool(torch.equal(out, expected)) and bool((big[:shift] == -1).all()))
    return results


def test_a_remembered_call_follows_peers_that_change_their_arguments():
    for per_rank in spawn(3, _peer_moves_its_view, 6):
        assert per_rank[:4] == [True] * 4 and per_rank[5] is True, per_rank
        assert per_rank[4] == ("error", True, True), per_rank


def _same_address_new_metadata(comm):
    """The same memory, passed again with other strides or dtype, is validated again."""
    w = comm.world
    base = torch.zeros(4, 4 * w)
    inp = torch.zeros(4, 4)
    errors = []
    for bad_out, bad_in in ((base.view(-1), inp.t()), (base.view(-1).view(torch.int32), inp)):
        comm.all_gather_into_tensor(base.view(-1), inp)  # remembered: same address and shape as the bad call
        try:
            comm.all_gather_into_tensor(bad_out, bad_in)
            errors.append("no error")
        except ValueError as e:
            errors.append(str(e))
    return errors


def test_the_same_memory_with_other_metadata_is_validated_again():
    for non_contiguous, dtype in spawn(2, _same_address_new_metadata):
        assert "contiguous" in non_contiguous and "dtype mismatch" in dtype


def _algorithm_after_set_options(comm):
    seen = []
    run = comm.executor.run
    comm.executor.run = lambda schedule, *a, **k: (seen.append(schedule.algorithm.value), run(schedule, *a, **k))[1]
    out, inp = comm.executor.empty((comm.world * 4,), torch.float32), comm.executor.empty((4,), torch.float32)
    comm.all_gather_into_tensor(out, inp)
    comm.options.algorithm = Algorithm.PULL
    comm.all_gather_into_tensor(out, inp)
    comm.options.algorithm = None
    comm.all_gather_into_tensor(out, inp)
    return seen


def test_changed_options_apply_to_a_remembered_call():
    assert spawn(2, _algorithm_after_set_options) == [["push", "pull", "push"]] * 2


def _staged_push_default(comm):
    """STAGED_PUSH as the group's default: the all-gather's; the collectives without one run as
    if no default were set (an all-to-all, here), the reductions push as they always do."""
    w, r = comm.world, comm.rank
    seen = []
    run = comm.executor.run
    comm.executor.run = lambda schedule, *a, **k: (seen.append(schedule.algorithm.value), run(schedule, *a, **k))[1]
    comm.options.algorithm = Algorithm.STAGED_PUSH
    out = torch.empty(4 * w)
    comm.all_gather_into_tensor(out, torch.full((4,), float(r)))
    ok = torch.equal(out, torch.arange(w).float().repeat_interleave(4))
    a2a = torch.empty(2 * w)
    comm.all_to_all_single(a2a, torch.full((2 * w,), float(r)))
    ok = ok and torch.equal(a2a, torch.arange(w).float().repeat_interleave(2))
    rs = torch.empty(3)
    comm.reduce_scatter_tensor(rs, torch.ones(3 * w))
    return seen, ok and torch.equal(rs, torch.full((3,), float(w)))


def test_a_staged_push_default_serves_the_all_gather_and_leaves_the_others_be():
    assert spawn(2, _staged_push_default) == [(["staged_push", "pull", "push"], True)] * 2


def _mismatched_default_algorithm(comm):
    """Each rank's group default (set_options is per rank) asks for another algorithm: a push on
    one rank and a pull on the other would each wait for signals that say nothing of the other's
    copies, leaving one output silently wrong. Refused on every rank before anything moves."""
    comm.options.algorithm = Algorithm.PUSH if comm.rank == 0 else Algorithm.PULL
    out, inp = comm.executor.empty((comm.world * 4,), torch.float32), comm.executor.empty((4,), torch.float32)
    out.fill_(3.0)
    try:
        comm.all_gather_into_tensor(out, inp)
    except CollectiveError as e:
        return str(e), bool((out == 3.0).all())
    return "no error", False


def test_ranks_whose_default_algorithms_differ_are_refused_everywhere():
    (msg0, untouched0), (msg1, untouched1) = spawn(2, _mismatched_default_algorithm)
    assert "algorithm (pull vs push here; asked per call or by set_options)" in msg0 and "(push vs pull here" in msg1
    assert "nothing was moved" in msg0 and untouched0 and untouched1


def _mismatched_size(comm):
    n = 8 if comm.rank != 1 else 9
    out = torch.full((comm.world * n,), 3.0)
    try:
        comm.all_gather_into_tensor(out, torch.zeros(n))
    except CollectiveError as e:
        return str(e), bool((out == 3.0).all())
    return "no error", False


def test_mismatched_sizes_raise_on_every_rank_and_move_nothing():
    for msg, untouched in spawn(3, _mismatched_size):
        assert "rank 1" in msg and "nothing was moved" in msg and untouched


def _mismatched_dtype(comm):
    dtype = torch.float16 if comm.rank == 0 else torch.bfloat16
    try:
        comm.all_gather_into_tensor(torch.empty(comm.world * 4, dtype=dtype), torch.zeros(4, dtype=dtype))
    except CollectiveError as e:
        return str(e)
    return "no error"


def test_mismatched_dtypes_name_both_sides():
    msgs = spawn(2, _mismatched_dtype)
    assert "torch.float16" in msgs[0] and "torch.bfloat16" in msgs[0]
    assert "dtype" in msgs[1]


def _mismatched_splits(comm):
    w, r = comm.world, comm.rank
    in_splits = [2] * w
    out_splits = [2] * w if r else [3] + [2] * (w - 1)  # rank 0 expects 3 rows from itself
    try:
        comm.all_to_all_single(torch.empty(sum(out_splits)), torch.zeros(sum(in_splits)), out_splits, in_splits)
    except CollectiveError as e:
        return str(e)
    return "no error"


def test_inconsistent_all_to_all_splits_are_refused_everywhere():
    for msg in spawn(3, _mismatched_splits):
        assert "rank 0 sends 8 bytes to rank 0, but rank 0 expects 12" in msg


def _absent_peer(comm):
    import time

    if comm.rank == 1:
        time.sleep(2.0)  # never calls within the others' timeout
        return "absent"
    t0 = time.monotonic()
    try:
        comm.all_gather_into_tensor(torch.empty(comm.world * 4), torch.zeros(4), timeout=timedelta(seconds=0.5))
    except CollectiveTimeout as e:
        return e.missing, round(time.monotonic() - t0, 2)
    return "no error"


def test_a_peer_that_never_calls_times_out_with_its_rank_named():
    results = spawn(3, _absent_peer)
    for r in (0, 2):
        missing, waited = results[r]
        assert missing == [1] and waited < 1.5
    assert isinstance(CollectiveTimeout("x", 1, [1], 0.1), torch.distributed.DistError)


def _splits_changed_in_place(comm):
    """Split sizes given as 0-d tensors are read anew on every call, even the same objects
    with the same tensors: first one row to every rank, then every row to the rank itself."""
    w, r = comm.world, comm.rank
    splits = [torch.tensor(1) for _ in range(w)]
    inp = r * 10 + torch.arange(w)
    out = torch.empty(w, dtype=inp.dtype)
    results = []
    for own_only in (False, True):
        for p, s in enumerate(splits):
            s.fill_((w if p == r else 0) if own_only else 1)
        comm.all_to_all_single(out, inp, splits, splits)
        results.append(out.tolist() == (inp.tolist() if own_only else (torch.arange(w) * 10 + r).tolist()))
    return results


def test_split_sizes_changed_in_place_are_read_again():
    assert spawn(3, _splits_changed_in_place) == [[True, True]] * 3


def _crossed_allocations(comm, n):
    """Rank 0 passes its first symmetric allocation, the others their second: peers' mappings
    would point at the wrong buffer, so the call stages through the workspace instead."""
    ex, w, r = comm.executor, comm.world, comm.rank
    a = ex.empty((w * n,), torch.float32)
    b = ex.empty((w * n,), torch.float32)
    out = a if r == 0 else b
    decoy = b if r == 0 else a
    decoy.fill_(-1.0)
    comm.all_gather_into_tensor(out, torch.full((n,), float(r + 1)))
    crossed_ok = torch.equal(out, torch.arange(1, w + 1, dtype=torch.float32).repeat_interleave(n))
    decoy_kept = bool((decoy == -1.0).all())
    # the same allocation on every rank: reached directly (no workspace growth needed)
    ws = ex.workspace_bytes
    a.zero_()
    comm.all_gather_into_tensor(a, torch.full((n,), float(r + 1)))
    return crossed_ok, decoy_kept, ws, ex.workspace_bytes, torch.equal(a, torch.arange(1, w + 1,
                                                                                     dtype=torch.float32).repeat_interleave(n))


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_naming_different_allocations_stage_instead_of_writing_into_the_wrong_one(world):
    for crossed_ok, decoy_kept, ws_before, ws_after, same_ok in spawn(world, _crossed_allocations, 1000):
        assert crossed_ok and decoy_kept and same_ok
        assert ws_before > 0 and ws_after == ws_before  # the crossed call staged; the agreed one did not grow it
