"""GPU tier: calls whose buffers and sizes change on every call (a MoE layer's new routing, an
FSDP step's new parameters) re-address a compiled program of their shape instead of compiling
one (conccl.executors.cuda.executor: programs_readdressed), and every result still equals NCCL's bit
for bit. Each test starts one process per GPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _changing_calls(rank, world):
    import torch.distributed as dist

    import conccl

    ex = conccl.get_group().executor
    g = torch.Generator(device="cuda").manual_seed(3)  # the same on every rank: the splits agree
    ok, compiled, readdressed = [], [], []
    for i in range(16):
        # uneven splits, none empty (an empty chunk drops a copy: another shape), new every call
        sizes = (torch.randint(1, 300, (world, world), generator=g, device="cuda") * 8).tolist()
        send = sizes[rank]  # rows this rank sends to each
        recv = [sizes[s][rank] for s in range(world)]
        x = torch.randn(sum(send), 24, device="cuda").to(torch.bfloat16)
        out, want = torch.empty(sum(recv), 24, dtype=x.dtype, device="cuda"), torch.empty(sum(recv), 24, dtype=x.dtype,
                                                                                              device="cuda")
        before = (ex.programs_compiled, ex.programs_readdressed)
        conccl.all_to_all_single(out, x, recv, send)
        dist.all_to_all_single(want, x, recv, send)
        ag_in = torch.randn(1000 + 8 * i, device="cuda")  # a new size every call
        ag_out, ag_want = torch.empty(world * ag_in.numel(), device="cuda"), torch.empty(world * ag_in.numel(),
                                                                                          device="cuda")
        conccl.all_gather_into_tensor(ag_out, ag_in)
        dist.all_gather_into_tensor(ag_want, ag_in)
        torch.cuda.synchronize()
        ok.append(torch.equal(out.view(torch.int16), want.view(torch.int16)) and torch.equal(ag_out, ag_want))
        compiled.append(ex.programs_compiled - before[0])
        readdressed.append(ex.programs_readdressed - before[1])
    return ok, compiled, readdressed


def test_changing_buffers_and_sizes_readdress_and_equal_nccl():
    from conccl.launch import run_per_gpu

    for ok, compiled, readdressed in run_per_gpu(_changing_calls):
        assert all(ok), ok
        assert sum(compiled[8:]) == 0, compiled  # steady state: nothing compiled
        assert sum(readdressed[8:]) >= 16, readdressed  # both calls of every step re-addressed
