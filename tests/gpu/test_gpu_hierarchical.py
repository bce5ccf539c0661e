"""GPU tier: a group spanning (simulated) hosts of one GPU each, NCCL between them.

With one process per GPU and ``CONCCL_SIMULATED_HOSTS=<world>x1`` read where the group is
made, every GPU is a pretend host: the node-local steps run on each GPU's own copy engine and
the cross-node steps on NCCL, the backend real multi-node jobs use (the shared-GPU rig's
pretend hosts talk gloo through host copies). What this proves that the CPU tier cannot: the
hand-offs between NCCL's stream and conccl's copies are ordered (a missing wait shows as a
wrong result, as every case runs right after a GEMM that delays the stream). Every result
against NCCL's flat collective on the same inputs, bit for bit (small whole numbers, so every
order of summation is exact).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _hosts_of_one_gpu(rank, world):
    import os

    import torch.distributed as dist
    from torch.distributed import ReduceOp

    import conccl
    from conccl.group.hierarchical import HierarchicalGroup
    from conccl.group.topology import SIMULATED_HOSTS_ENV

    pg = dist.new_group(list(range(world)))
    os.environ[SIMULATED_HOSTS_ENV] = f"{world}x1"
    try:
        group = conccl.get_group(pg)  # read here, once
    finally:
        del os.environ[SIMULATED_HOSTS_ENV]
    cases = [("hierarchical", isinstance(group, HierarchicalGroup))]
    gen = torch.Generator(device="cuda").manual_seed(7 + rank)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def ints(n, dtype):
        return torch.randint(-8, 8, (n,), device="cuda", generator=gen).to(dtype)

    def bits(t):
        return t.view(torch.int16 if t.element_size() == 2 else torch.int32)

    for dtype in (torch.bfloat16, torch.float32):
        for n in (1, 4099, (1 << 22) + 3):
            x = ints(n, dtype)
            out, ref = torch.empty(world * n, dtype=dtype, device="cuda"), torch.empty(world * n, dtype=dtype, device="cuda")
            dist.all_gather_into_tensor(ref, x)
            a @ a  # the stream is busy when the call is queued
            conccl.all_gather_into_tensor(out, x, group=pg)
            cases.append((f"all_gather {dtype} n={n}", torch.equal(bits(out), bits(ref))))
            x = ints(world * n, dtype)
            dist.all_to_all_single(ref, x)
            a @ a
            conccl.all_to_all_single(out, x, group=pg)
            cases.append((f"all_to_all {dtype} n={n}", torch.equal(bits(out), bits(ref))))
            # AVG only where 1/world is exact: otherwise the hosts' partial sums round differently
            for op in (ReduceOp.SUM, ReduceOp.AVG) if world & (world - 1) == 0 else (ReduceOp.SUM,):
                got, want = torch.empty(n, dtype=dtype, device="cuda"), torch.empty(n, dtype=dtype, device="cuda")
                dist.reduce_scatter_tensor(want, x, op=op)
                a @ a
                conccl.reduce_scatter_tensor(got, x, op=op, group=pg)
                cases.append((f"reduce_scatter {dtype} {op} n={n}", torch.equal(bits(got), bits(want))))
                t, want = x.clone(), x.clone()
                dist.all_reduce(want, op=op)
                a @ a
                conccl.all_reduce(t, op=op, group=pg)
                cases.append((f"all_reduce {dtype} {op} n={world * n}", torch.equal(bits(t), bits(want))))
    # a persistent all-gather, started after a GEMM each time with new contents
    n = 1 << 20
    shard, out = torch.empty(n, device="cuda"), torch.empty(world * n, device="cuda")
    op = conccl.persistent_all_gather_into_tensor(out, shard, group=pg)
    for step in range(3):
        shard.copy_(ints(n, torch.float32))
        ref = torch.empty_like(out)
        dist.all_gather_into_tensor(ref, shard)
        a @ a
        op.start()
        cases.append((f"persistent all_gather start {step}", torch.equal(out, ref)))
    op.close()
    torch.cuda.synchronize()
    return [(name, bool(ok)) for name, ok in cases]


def test_hosts_of_one_gpu_each_with_nccl_between_them_equal_nccl_flat():
    from conccl.launch import run_per_gpu

    results = run_per_gpu(_hosts_of_one_gpu)
    for rank, cases in enumerate(results):
        print(f"rank {rank}: {sum(ok for _, ok in cases)}/{len(cases)} right")
        assert cases and all(ok for _, ok in cases), (rank, [name for name, ok in cases if not ok])
