"""CPU multi-process tier: one-shot calls (conccl.collectives.one_shot) on the reference
executor, which runs their ops one by one with the same signals as the CUDA kernel: every
collective right, mixed with copy-engine calls in any order, and the path taken the one asked
for (a one-shot schedule below ``Options.one_shot_below``, copy engines above and with 0), as
the returned ``Work.path`` says."""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from torch.distributed import ReduceOp  # noqa: E402

from conccl.collectives.all_gather import ALL_GATHER  # noqa: E402
from conccl.collectives.all_reduce import ALL_REDUCE  # noqa: E402
from conccl.collectives.all_to_all import ALL_TO_ALL  # noqa: E402
from conccl.collectives.reduce_scatter import REDUCE_SCATTER  # noqa: E402
from conccl.testing import spawn  # noqa: E402
from conccl.schedule.base import StreamMode  # noqa: E402

LIMIT = 4096  # output bytes per rank up to which the test's group runs one-shot calls


def _mixed(comm, steps, seed):
    w, r = comm.world, comm.rank
    ran = []  # (collective, one_shot) of every schedule the executor ran
    real_run = comm.executor.run

    def run(schedule, *args, **kwargs):
        ran.append((schedule.collective, schedule.one_shot))
        return real_run(schedule, *args, **kwargs)
    comm.executor.run = run
    rng = random.Random(seed)  # alike on every rank: the same calls
    bad = []
    for step in range(steps):
        comm.options.one_shot_below = rng.choice((LIMIT, LIMIT, 0))
        n = rng.choice((1, 3, 64, 500, 3000))  # elements per rank's piece: 4 bytes each
        what = rng.choice(("ag", "a2a", "rs", "ar"))
        g = torch.Generator().manual_seed(seed * 100 + step)
        ins = [torch.randn(w * n if what in ("a2a", "rs") else n, generator=g) for _ in range(w)]
        ins = [x.to(torch.bfloat16) for x in ins] if what in ("rs", "ar") and step % 2 else ins
        x = ins[r].clone()
        if what == "ag":
            coll, out, args = ALL_GATHER, torch.empty(w * n), ()
        elif what == "a2a":
            coll, out, args = ALL_TO_ALL, torch.empty(w * n), (None, None)
        elif what == "rs":
            coll, out, args = REDUCE_SCATTER, torch.empty(n, dtype=x.dtype), (ReduceOp.SUM,)
        else:
            coll, out, args = ALL_REDUCE, x, (ReduceOp.AVG,)
        work = comm.call(coll, out, x, args, route=True)  # as the public functions call (only they may go one-shot)
        expected = coll.reference(ins, r, [args] * w)
        out_bytes = out.numel() * out.element_size()
        want = 0 < out_bytes < comm.options.one_shot_below
        if not torch.equal(out.view(torch.uint8), expected.view(torch.uint8)):
            bad.append((step, what, n, "wrong"))
        if ran[-1] != (coll.name, want):
            bad.append((step, what, n, f"ran {ran[-1]}, expected one_shot={want}"))
        if work.path != ("one_shot" if want else "copy_engines"):  # what the caller is told ran it
            bad.append((step, what, n, f"Work.path {work.path}, expected one_shot={want}"))
    return bad, sum(o for _, o in ran)


@pytest.mark.parametrize("world", [2, 3])
def test_one_shot_calls_are_right_and_mix_with_copy_engine_calls(world):
    for bad, one_shots in spawn(world, _mixed, 60, 5):
        assert bad == [], bad[:5]
        assert one_shots > 10  # the path under test ran


def _ranks_disagree(comm):
    """What a rank alone decides must not split the group between the two protocols (found in
    review): one rank asking for a stream mode, ranks with different limits, calls that are
    not the public functions'. Each such call runs on copy engines on every rank, right."""
    w, r = comm.world, comm.rank
    ran = []
    real_run = comm.executor.run

    def run(schedule, *args, **kwargs):
        ran.append(schedule.one_shot)
        return real_run(schedule, *args, **kwargs)
    comm.executor.run = run
    ok = []
    x = torch.full((64,), float(r))
    expected = torch.arange(w).repeat_interleave(64).float()
    for limit, mode, route in ((LIMIT, StreamMode.SINGLE if r == 0 else None, True),  # one rank names a mode
                               (LIMIT if r == 0 else 0, None, True),  # different limits
                               (LIMIT, None, False),  # not a public function's call (overlap, FSDP hooks)
                               (LIMIT, None, True)):  # the control: every rank would
        comm.options.one_shot_below = limit
        out = torch.empty(w * 64)
        comm.call(ALL_GATHER, out, x, (), stream_mode=mode, route=route)
        ok.append(torch.equal(out, expected))
    return ok, ran


@pytest.mark.parametrize("world", [2, 3])
def test_a_call_runs_one_shot_only_where_every_rank_would(world):
    for ok, ran in spawn(world, _ranks_disagree):
        assert ok == [True] * 4
        assert ran == [False, False, False, True]
