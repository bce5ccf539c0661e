"""GPU tier: persistent collectives (agreed once, started many times) on real GPUs.

Proves the intended path: starts make no host exchange with the peers (the board is not
touched), run no kernel (profiler), and every start's output equals NCCL's bit for bit,
interleaved with one-shot calls and with producers and consumers on the caller's stream.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _persistent_on_gpu(rank, world):
    import torch.distributed as dist
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    import conccl

    comm = conccl.get_group()
    report = {"wrong": 0}
    n = (1 << 19) + 3  # 1 MiB of bf16 per rank and an odd tail
    sym_in = conccl.empty(n * world, dtype=torch.bfloat16)
    sym_out = conccl.empty(n * world, dtype=torch.bfloat16)
    plain_in = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    plain_out = torch.empty(n * world, dtype=torch.bfloat16, device="cuda")
    in_splits = [(rank + 2 * d) % 5 * 1000 for d in range(world)]  # uneven, zeros included
    out_splits = [(s + 2 * rank) % 5 * 1000 for s in range(world)]
    a2a_out = sym_out[:sum(out_splits)]
    ops = {
        "all_gather push": (conccl.persistent_all_gather_into_tensor(sym_out, sym_in[:n]), sym_in[:n], sym_out),
        "all_gather staged pull": (conccl.persistent_all_gather_into_tensor(plain_out, plain_in), plain_in, plain_out),
        "all_to_all uneven push": (conccl.persistent_all_to_all_single(a2a_out, sym_in[:sum(in_splits)], out_splits,
                                                                       in_splits), sym_in[:sum(in_splits)], a2a_out),
    }
    report["pushes"] = sorted(k for k, (op, _, _) in ops.items() if op._schedule.algorithm.value == "push")

    exchanges = {"n": 0}
    exchange = comm.board.exchange

    def counted(*a, **k):
        exchanges["n"] += 1
        return exchange(*a, **k)

    g = torch.Generator(device="cuda").manual_seed(rank)
    for label, (op, inp, out) in ops.items():
        op.start()  # a first start outside the counts grows the staging workspace (collective)
        torch.cuda.synchronize()
        comm.board.exchange = counted
        ref = torch.empty_like(out)
        for i in range(30):
            torch.cuda._sleep(100_000)
            inp.copy_(torch.randint(0, 1 << 15, inp.shape, device="cuda", generator=g, dtype=torch.int16).view(torch.bfloat16))  # producer
            op.start()
            result = out.clone()  # consumer on the caller's stream, right after the start
            comm.board.exchange = exchange  # the reference (and a one-shot call) may exchange
            if "all_gather" in label:
                dist.all_gather_into_tensor(ref, inp)
            else:
                dist.all_to_all_single(ref, inp, out_splits, in_splits)
            if i % 3 == 0:  # a one-shot call between starts shares the sequence numbers
                conccl.all_gather_into_tensor(plain_out, plain_in)
            comm.board.exchange = counted
            report["wrong"] += int((result.view(torch.int16) != ref.view(torch.int16)).sum())
        comm.board.exchange = exchange
        inp.copy_(torch.randint(0, 1 << 15, inp.shape, device="cuda", generator=g, dtype=torch.int16).view(torch.bfloat16))
        if "all_gather" in label:
            dist.all_gather_into_tensor(ref, inp)
        else:
            dist.all_to_all_single(ref, inp, out_splits, in_splits)
        torch.cuda._sleep(50_000_000)  # ~25 ms: the async start cannot be complete at once
        work = op.start(async_op=True)
        early = work.is_completed()
        work.wait()
        result = out.clone()
        torch.cuda.synchronize()
        report.setdefault("async", []).append((early, work.is_completed()))
        report["wrong"] += int((result.view(torch.int16) != ref.view(torch.int16)).sum())
    report["exchanges_in_starts"] = exchanges["n"]

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for op, _, _ in ops.values():
            for _ in range(3):
                op.start()
        torch.cuda.synchronize()
    gpu = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    report["kernels"] = sorted({x for x in gpu if "memcpy" not in x.lower() and "memset" not in x.lower()})
    report["memcpy"] = sum("memcpy" in x.lower() for x in gpu)

    # conccl.overlap runs a persistent op where its plan picks conccl, and NCCL on the op's
    # tensors where it picks NCCL; both equal the serial result.
    a = torch.randn(2048, 2048, dtype=torch.bfloat16, device="cuda", generator=g)
    op, inp, out = ops["all_to_all uneven push"]
    inp.copy_(torch.randint(0, 1 << 15, inp.shape, device="cuda", generator=g, dtype=torch.int16).view(torch.bfloat16))
    ref = torch.empty_like(out)
    dist.all_to_all_single(ref, inp, out_splits, in_splits)
    report["overlap"] = {}
    for plan in ("conccl", "c3_sp", "conccl", "c3_sp"):  # the first of each warms up (NCCL group, streams)
        out.zero_()
        torch.cuda.synchronize()
        comm.board.exchange = counted
        exchanges["n"] = 0
        with conccl.overlap(plan=plan) as c3:
            c3.matmul(a, a)
            c3.start(op)
        result = out.clone()
        comm.board.exchange = exchange
        torch.cuda.synchronize()
        report["overlap"][plan] = (c3.plan.impl, exchanges["n"],
                                   int((result.view(torch.int16) != ref.view(torch.int16)).sum()))
    for op, _, _ in ops.values():
        op.close()
    return report


def test_persistent_starts_equal_nccl_with_no_exchange_and_no_kernel():
    from conccl.launch import run_per_gpu

    for r in run_per_gpu(_persistent_on_gpu):
        assert r["wrong"] == 0, r
        assert r["pushes"] == ["all_gather push", "all_to_all uneven push"], r
        assert r["exchanges_in_starts"] == 0, r  # only the one-shot calls met the peers
        assert r["kernels"] == [] and r["memcpy"] >= 9, r
        assert r["async"] == [(False, True)] * 3, r
        assert r["overlap"] == {"conccl": ("conccl", 0, 0), "c3_sp": ("nccl", 0, 0)}, r
