"""CPU multi-process tier: an eager call below the group's ``nccl_below`` runs on the process
group's own backend (gloo here, NCCL on GPUs), every other call on conccl's executor; both in
one program, in any order, with ``Work.path`` saying which ran."""
from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch.distributed import ReduceOp  # noqa: E402

from conccl.collectives import REGISTRY  # noqa: E402
from conccl.errors import InvalidArgument  # noqa: E402
from conccl.testing import spawn  # noqa: E402

LIMITS = {"all_gather": 4096, "all_to_all": 4096, "reduce_scatter": 1000, "all_reduce": 1 << 14}


def _ints(world, n, seed):
    # small whole numbers: every summation order gives the same bits, gloo's and conccl's
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-50, 50, (n,), generator=g).float() for _ in range(world)]


def _routed(comm, store):
    w, r = comm.world, comm.rank
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=r, world_size=w)
    try:
        comm.fallback = (dist, dist.group.WORLD)
        comm.set_nccl_below(dict(LIMITS))
        seen = []
        # (collective, output elements) small and large for every collective, interleaved
        for step, (name, n) in enumerate([("all_gather", 8), ("all_gather", 4096), ("all_reduce", 64),
                                          ("all_to_all", 8 * w), ("all_reduce", 8192), ("reduce_scatter", 16),
                                          ("all_to_all", 2048 * w), ("reduce_scatter", 1024), ("all_gather", 8)]):
            coll = REGISTRY[name]
            if name == "all_gather":
                inputs = _ints(w, n, step)
                inp, out = inputs[r].clone(), torch.empty(w * n)
                args = ()
            elif name == "all_to_all":
                inputs = _ints(w, n, step)
                inp, out = inputs[r].clone(), torch.empty(n)
                args = (None, None)
            elif name == "reduce_scatter":
                inputs = _ints(w, w * n, step)
                inp, out = inputs[r].clone(), torch.empty(n)
                args = (ReduceOp.SUM,)
            else:
                inputs = _ints(w, n, step)
                inp = out = inputs[r].clone()
                args = (None,)  # what conccl.all_reduce(t) passes: the default op, which the fallback must take
            seq = comm.seq
            async_op = step % 2 == 1
            work = comm.call(coll, out, inp, args, async_op, route=True)
            if async_op:
                work.wait()
            want = coll.reference(inputs, r, [args] * w if args else None)
            seen.append((name, out.numel() * out.element_size(), work.path, comm.seq - seq,
                         torch.equal(out.view(torch.uint8), want.reshape(-1).view(torch.uint8))))
        # explicit split sizes never leave the copy engines (ranks' sizes differ), nor does a call
        # that is not routed (the group's own, as conccl.overlap and the FSDP hooks make)
        inputs = _ints(w, w, 99)
        out = torch.empty(w)
        seq = comm.seq
        work = comm.call(REGISTRY["all_to_all"], out, inputs[r].clone(), ([1] * w, [1] * w), route=True)
        seen.append(("all_to_all splits", 4 * w, work.path, comm.seq - seq,
                     torch.equal(out, REGISTRY["all_to_all"].reference(inputs, r))))
        seq = comm.seq
        out = torch.empty(w * 8)
        work = comm.call(REGISTRY["all_gather"], out, torch.full((8,), float(r)))
        seen.append(("not routed", 32 * w, work.path, comm.seq - seq,
                     torch.equal(out, torch.arange(w).repeat_interleave(8).float())))
        # an async copy-engine call, then a routed one reading its output without a wait in
        # between: the group orders them as it orders its own calls
        big = torch.empty(w * 4096)
        pending = comm.call(REGISTRY["all_gather"], big, torch.full((4096,), float(r + 1)), (), True, route=True)
        head = big[:8]  # rank 0's chunk: all ones once the all-gather ran
        work = comm.call(REGISTRY["all_reduce"], head, head, (ReduceOp.SUM,), route=True)
        pending.wait()
        seen.append(("ordered all_reduce", 32, work.path, 0, torch.equal(head, torch.full((8,), float(w)))))
        # a bad call is refused on either path (below the limit by the backend, as torch's would be)
        try:
            comm.call(REGISTRY["all_gather"], torch.empty(w * 8 + 1), torch.empty(8), route=True)
            refused = None
        except (InvalidArgument, ValueError, RuntimeError) as e:
            refused = str(e)
        # ranks that set differing tables are told so, on every rank, when they set them
        try:
            comm.set_nccl_below(dict(LIMITS, all_gather=0 if r == 0 else LIMITS["all_gather"]))
            tables = None
        except InvalidArgument as e:
            tables = str(e)
        assert comm.options.nccl_below == LIMITS  # the refused table was not installed
        # without a fallback nothing is routed
        comm.fallback = None
        seq = comm.seq
        out = torch.empty(w * 8)
        work = comm.call(REGISTRY["all_gather"], out, torch.full((8,), float(r)), route=True)
        seen.append(("no fallback", 32 * w, work.path, comm.seq - seq,
                     torch.equal(out, torch.arange(w).repeat_interleave(8).float())))
        return {"seen": seen, "refused": refused, "tables": tables}
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_small_calls_go_to_the_fallback_and_large_ones_to_conccl(world):
    with tempfile.TemporaryDirectory() as d:
        for res in spawn(world, _routed, os.path.join(d, "store")):
            for name, nbytes, path, seq_used, right in res["seen"]:
                assert right, (name, nbytes, path)
                base = name.split()[-1]  # a label's last word names the collective when it is routable
                routed = base in LIMITS and name in (base, f"ordered {base}") and nbytes < LIMITS[base]
                assert path == ("nccl" if routed else "copy_engines"), (name, nbytes, path)
                assert seq_used == (0 if routed else 1), (name, seq_used)  # a routed call leaves conccl's sequence
            assert res["refused"], res["refused"]
            assert res["tables"] and "has another nccl_below" in res["tables"], res["tables"]
