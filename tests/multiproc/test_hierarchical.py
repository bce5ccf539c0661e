"""CPU multi-process tier: groups that span (simulated) hosts, served hierarchically
(:mod:`conccl.group.hierarchical`): a reference group per host, gloo between hosts
(:func:`conccl.testing.spawn_hosts`). Every collective, dtype and op at 2x2, 3x2 and 2x4
(hosts x ranks) against the registry's flat reference; a mismatch anywhere refused on every
rank before anything moves; a rank dying on another host raises on every survivor."""
from __future__ import annotations

import os
import time
import warnings
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from conccl import Algorithm  # noqa: E402
from conccl.collectives import REGISTRY  # noqa: E402
from conccl.errors import CollectiveError, GroupBroken, InvalidArgument  # noqa: E402
from conccl.testing import spawn_hosts  # noqa: E402

SPECS = ["2x2", "3x2", "2x4"]
GATHER_DTYPES = (torch.float32, torch.bfloat16, torch.int32)
REDUCE_DTYPES = (torch.float32, torch.bfloat16)


def _ints(n, seed, dtype, lo=-4, hi=5):
    """Small integers: every partial sum is exact in fp32 and bf16, whatever the order."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def _ops():
    return (("SUM", dist.ReduceOp.SUM), ("AVG", dist.ReduceOp.AVG), ("PREMUL_SUM(0.5)", dist._make_nccl_premul_sum(0.5)))


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _exact_scale(name, world) -> bool:
    """Whether the op's scale is a power of two (then the hierarchical sum is exact, so bit for bit)."""
    return name != "AVG" or world & (world - 1) == 0


def _every_case(comm):
    """(case, right) for every collective x dtype x op x size on this rank."""
    w, r = comm.world, comm.rank
    cases, seed = [], 0
    for n in (1, 7, 40):  # 7: the all-reduce's count no host's rank count divides (padded path)
        for dtype in GATHER_DTYPES:
            seed += 1
            every = [_ints(n, 1000 * seed + q, dtype) for q in range(w)]
            out = torch.full((w * n,), 99, dtype=dtype)
            comm.all_gather_into_tensor(out, every[r])
            cases.append((f"all_gather {dtype} n={n}", _same(out, REGISTRY["all_gather"].reference(every, r))))
            # in place: the input is the output's own chunk
            out = torch.full((w * n,), 99, dtype=dtype)
            out[r * n:(r + 1) * n] = every[r]
            comm.all_gather_into_tensor(out, out[r * n:(r + 1) * n])
            cases.append((f"all_gather in place {dtype} n={n}", _same(out, REGISTRY["all_gather"].reference(every, r))))
            seed += 1
            every = [_ints(w * n, 1000 * seed + q, dtype).view(w * n, 1) for q in range(w)]
            out = torch.full((w * n, 1), 99, dtype=dtype)
            comm.all_to_all_single(out, every[r])
            cases.append((f"all_to_all {dtype} n={n}",
                          _same(out.view(-1), REGISTRY["all_to_all"].reference(every, r).view(-1))))
        for dtype in REDUCE_DTYPES:
            for name, op in _ops():
                seed += 1
                every = [_ints(w * n, 1000 * seed + q, dtype) for q in range(w)]
                args = [(op,)] * w
                out = torch.full((n,), float("nan"), dtype=dtype)
                comm.reduce_scatter_tensor(out, every[r], op)
                want = REGISTRY["reduce_scatter"].reference(every, r, args)
                cases.append((f"reduce_scatter {dtype} {name} n={n}", _check(out, want, name, w)))
                t = every[r].clone()
                comm.all_reduce(t, t, op)
                want = REGISTRY["all_reduce"].reference(every, r, args)
                cases.append((f"all_reduce {dtype} {name} n={w * n}", _check(t, want, name, w)))
                seed += 1
                every = [_ints(n, 1000 * seed + q, dtype) for q in range(w)]
                t = every[r].clone()
                comm.all_reduce(t, t, op)
                cases.append((f"all_reduce {dtype} {name} n={n}",
                              _check(t, REGISTRY["all_reduce"].reference(every, r, args), name, w)))
    # in-place reduce-scatter: the output is the input's own chunk
    every = [_ints(w * 5, 77 + q, torch.float32) for q in range(w)]
    x = every[r].clone()
    comm.reduce_scatter_tensor(x[r * 5:(r + 1) * 5], x)
    cases.append(("reduce_scatter in place", _same(x[r * 5:(r + 1) * 5], REGISTRY["reduce_scatter"].reference(every, r))))
    return cases


def _check(got, want, name, world) -> bool:
    if _exact_scale(name, world):
        return _same(got, want)
    # AVG over a world that is no power of two: 1/world is inexact, and the hosts' partial
    # sums round where the flat sum does not (design.md, "Beyond one node")
    # sum differently (cancellation near zero makes it absolute: a few ulps of the largest value)
    scale = max(1.0, want.float().abs().max().item())
    return bool(torch.allclose(got.float(), want.float(), rtol=0, atol=4 * torch.finfo(got.dtype).eps * scale))


@pytest.mark.parametrize("spec", SPECS)
def test_every_collective_dtype_and_op_equals_the_flat_reference(spec):
    results = spawn_hosts(spec, _every_case)
    wrong = [(r, case) for r, cases in enumerate(results) for case, ok in cases if not ok]
    assert not wrong, wrong
    assert len(results[0]) == 3 * (3 * len(GATHER_DTYPES) + 3 * len(REDUCE_DTYPES) * 3) + 1


def _bits_case(comm):
    """AVG at 3x2 is the one case above not bit for bit: say how far it is, and that SUM of
    random (non-integer) fp32 data differs from the flat order only by rounding."""
    w, r = comm.world, comm.rank
    every = [torch.randn(w * 64, generator=torch.Generator().manual_seed(5 + q)) for q in range(w)]
    out = torch.empty(64)
    comm.reduce_scatter_tensor(out, every[r])
    want = REGISTRY["reduce_scatter"].reference(every, r)
    return bool(torch.allclose(out, want, rtol=1e-5, atol=1e-6))


def test_random_fp32_sums_within_rounding_of_the_flat_order():
    assert spawn_hosts("3x2", _bits_case) == [True] * 6


def _mismatches(comm, culprit, how):
    """Rank ``culprit`` calls with another dtype or size; then everyone makes a right call."""
    w, r = comm.world, comm.rank
    n = 4 if (r != culprit or how != "size") else 5
    dtype = torch.bfloat16 if (r == culprit and how == "dtype") else torch.float32
    inp = torch.full((n,), float(r), dtype=dtype)
    out = torch.full((w * n,), -1.0, dtype=dtype)
    try:
        comm.all_gather_into_tensor(out, inp)
        msg = None
    except CollectiveError as e:
        msg = str(e)
    untouched = bool((out == -1).all())
    every = [torch.full((4,), float(q)) for q in range(w)]
    out = torch.empty(4 * w)
    comm.all_gather_into_tensor(out, every[r])
    return msg, untouched, _same(out, REGISTRY["all_gather"].reference(every, r))


def _mismatched_default_algorithm(comm, culprit):
    """Rank ``culprit`` defaults to another algorithm (set_options is per rank): the node-local
    steps read it, so every host must agree on it; then everyone calls alike again."""
    w, r = comm.world, comm.rank
    if r == culprit:
        comm.options.algorithm = Algorithm.PULL
    out = torch.full((w * 4,), -1.0)
    try:
        comm.all_gather_into_tensor(out, torch.full((4,), float(r)))
        msg = None
    except CollectiveError as e:
        msg = str(e)
    return msg, bool((out == -1).all())


def test_a_default_algorithm_that_differs_on_any_host_is_refused_on_every_rank():
    for msg, untouched in spawn_hosts("2x2", _mismatched_default_algorithm, 3):
        assert msg is not None and "nothing was moved" in msg and "algorithm" in msg, msg
        assert untouched


@pytest.mark.parametrize("culprit,how", [(3, "dtype"), (1, "size"), (5, "size")])
def test_a_mismatch_on_any_host_is_refused_on_every_rank_before_anything_moves(culprit, how):
    # 2x4: rank 1 is on host 0 with rank 0; ranks 3 and 5 are on different hosts from rank 0
    for msg, untouched, after in spawn_hosts("2x4", _mismatches, culprit, how):
        assert msg is not None and "nothing was moved" in msg, msg
        assert f"rank {culprit}" in msg or "another host" in msg, msg
        assert untouched and after


def _bad_calls(comm):
    w = comm.world
    names = []
    for call in (lambda: comm.all_gather_into_tensor(torch.empty(w * 3 + 1), torch.empty(3)),
                 lambda: comm.reduce_scatter_tensor(torch.empty(3, dtype=torch.int32), torch.empty(3 * w, dtype=torch.int32)),
                 lambda: comm.all_reduce(torch.empty(3), torch.empty(3), dist.ReduceOp.MAX),
                 lambda: comm.persistent_all_gather_into_tensor(torch.empty(w * 3 + 1), torch.empty(3))):
        try:
            call()
            names.append(None)
        except InvalidArgument as e:
            names.append(type(e).__name__)
    return names, comm.seq


def test_bad_calls_raise_before_anything_moves():
    assert spawn_hosts("2x2", _bad_calls) == [(["InvalidArgument"] * 4, 0)] * 4


def _uneven_all_to_all(comm):
    w, r = comm.world, comm.rank
    send = [(r + d) % 3 for d in range(w)]  # rows rank r sends rank d
    recv = [(s + r) % 3 for s in range(w)]
    inp = torch.arange(sum(send), dtype=torch.float32) + 100 * r
    out = torch.empty(sum(recv))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        work = comm.all_to_all_single(out, inp, recv, send)
        comm.all_to_all_single(out, inp, recv, send)
    mine = [torch.arange(sum((q + d) % 3 for d in range(w)), dtype=torch.float32) + 100 * q for q in range(w)]
    want = torch.cat([mine[q][sum((q + d) % 3 for d in range(r)):][:(q + r) % 3] for q in range(w)])
    ours = [str(c.message) for c in caught if "conccl" in str(c.message)]
    return torch.equal(out, want), len(ours), work.path


def test_uneven_all_to_all_runs_flat_on_the_backend_with_one_warning():
    assert spawn_hosts("2x2", _uneven_all_to_all) == [(True, 1, "nccl")] * 4


def _dies_inside_a_flat_call(comm, victim):
    w, r = comm.world, comm.rank
    sizes = [1 + (r + d) % 2 for d in range(w)]  # uneven: the flat path
    recv = [1 + (s + r) % 2 for s in range(w)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        comm.all_to_all_single(torch.empty(sum(recv)), torch.ones(sum(sizes)), recv, sizes)  # all alive
        if r == victim:  # agree on the next call with everyone, then die inside the backend's call
            class _Exits:
                @staticmethod
                def all_to_all_single(*args, **kwargs):
                    os._exit(1)

            comm.fallback = (_Exits, comm.fallback[1])
        start = time.monotonic()
        try:
            comm.all_to_all_single(torch.empty(sum(recv)), torch.ones(sum(sizes)), recv, sizes)
            return "no error", 0.0, None
        except CollectiveError as e:
            first, waited = type(e).__name__, time.monotonic() - start
    try:
        comm.all_gather_into_tensor(torch.empty(w), torch.ones(1))
        later = "no error"
    except GroupBroken:
        later = "GroupBroken"
    except CollectiveError as e:
        later = type(e).__name__
    return first, waited, later


def test_a_rank_dying_inside_a_flat_call_breaks_the_group_on_every_survivor():
    timeout, victim = 3.0, 1
    results = spawn_hosts("2x2", _dies_inside_a_flat_call, victim, timeout=timedelta(seconds=timeout),
                          allow_missing=(victim,), join_timeout_s=60)
    for rank, res in enumerate(results):
        if rank != victim:
            kind, waited, later = res
            assert kind in ("CollectiveTimeout", "GroupBroken") and waited < timeout + 1.0, (rank, res)
            assert later == "GroupBroken", (rank, res)


def _dies(comm, victim):
    every = [torch.full((8,), float(q)) for q in range(comm.world)]
    out = torch.empty(8 * comm.world)
    comm.all_gather_into_tensor(out, every[comm.rank])  # all alive: fine
    if comm.rank == victim:
        os._exit(1)
    start = time.monotonic()
    try:
        comm.all_gather_into_tensor(out, every[comm.rank])
        return "no error", 0.0, None
    except CollectiveError as e:
        waited, first = time.monotonic() - start, type(e).__name__
    try:
        comm.all_gather_into_tensor(out, every[comm.rank])
        later = "no error"
    except GroupBroken:
        later = "GroupBroken"
    except CollectiveError as e:  # the backend noticed first: still an error, never a hang
        later = type(e).__name__
    return first, waited, later


def test_a_rank_dying_on_another_host_raises_on_every_survivor_within_the_timeout():
    timeout = 5.0
    victim = 3  # host 1; ranks 0 and 1 are on host 0
    results = spawn_hosts("2x2", _dies, victim, timeout=timedelta(seconds=timeout), allow_missing=(victim,),
                          join_timeout_s=60)
    for rank, res in enumerate(results):
        if rank == victim:
            continue
        kind, waited, later = res
        # CollectiveTimeout where this rank found the peer gone; GroupBroken where a rank of its
        # host had already posted the abort when it arrived
        assert kind in ("CollectiveTimeout", "GroupBroken") and waited < timeout + 1.0, (rank, res)
        assert later == "GroupBroken", (rank, res)


@pytest.mark.parametrize("spec,words", [("0,0,0,1", "unequal numbers of ranks"), ("0,1,0,1", "not 0..1")])
def test_a_layout_the_hierarchy_cannot_serve_is_refused_with_one_clear_error(spec, words):
    with pytest.raises(InvalidArgument, match=words) as e:
        spawn_hosts(spec, _bad_calls)
    assert "\n" not in str(e.value)


def _hangs(comm, victim, hang_s):
    every = [torch.full((8,), float(q)) for q in range(comm.world)]
    out = torch.empty(8 * comm.world)
    if comm.rank == victim:
        time.sleep(hang_s)  # alive, never calls: only the timeouts end the others' wait
        return None
    start = time.monotonic()
    try:
        comm.all_gather_into_tensor(out, every[comm.rank])
        return "no error", 0.0
    except CollectiveError as e:
        return type(e).__name__, time.monotonic() - start


def test_a_rank_hanging_on_another_host_raises_on_every_survivor_within_the_timeout_plus_a_second():
    timeout = 2.0
    results = spawn_hosts("2x2", _hangs, 3, timeout + 1.5, timeout=timedelta(seconds=timeout), join_timeout_s=60)
    for rank, res in enumerate(results[:3]):
        kind, waited = res
        assert kind in ("CollectiveTimeout", "GroupBroken") and waited < timeout + 1.0, (rank, res)


def _async_call(comm):
    w, r = comm.world, comm.rank
    every = [torch.full((3,), float(q)) for q in range(w)]
    out = torch.empty(3 * w)
    work = comm.all_gather_into_tensor(out, every[r], async_op=True, timeout=5.0)
    done = work.is_completed()  # blocking underneath: complete when returned (design.md says so)
    work.wait()
    return done, _same(out, REGISTRY["all_gather"].reference(every, r)), comm.seq


def test_async_op_returns_a_completed_work_with_the_output_in_place():
    assert spawn_hosts("2x2", _async_call) == [(True, True, 1)] * 4
