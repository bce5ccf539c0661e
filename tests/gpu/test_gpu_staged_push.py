"""GPU tier: the all-gather's Algorithm.STAGED_PUSH (pushes into the peers' workspace, copied
out there) against NCCL, eager and captured into a CUDA graph, and proof that it runs on copy
engines only. One process per GPU (skipping: conftest.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _staged_push(rank, world):
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import conccl

    A, S = conccl.Algorithm, conccl.StreamMode
    g = conccl.get_group()
    gen = torch.Generator(device="cuda").manual_seed(rank)
    bad = []

    def same(a, b):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))

    # eager: sizes from one element to 2 MiB, plain and peer-reachable tensors, two stream modes
    for dtype in (torch.bfloat16, torch.float32):
        for n in (1, 7, 4097, (1 << 20) + 3):
            for sym in (False, True):
                for mode in (S.BATCH, S.PER_PEER):
                    inp = conccl.empty(n, dtype=dtype) if sym else torch.empty(n, dtype=dtype, device="cuda")
                    out = conccl.empty(world * n, dtype=dtype) if sym else torch.empty(world * n, dtype=dtype,
                                                                                        device="cuda")
                    for step in range(3):  # back to back: the workspace halves in turn
                        inp.copy_(torch.randn(n, device="cuda", generator=gen).to(dtype))
                        out.view(torch.uint8).fill_(0xAB)
                        g.all_gather_into_tensor(out, inp, algorithm=A.STAGED_PUSH, stream_mode=mode)
                        ref = torch.empty_like(out)
                        dist.all_gather_into_tensor(ref, inp)
                        torch.cuda.synchronize()
                        if not same(out, ref):
                            bad.append(("eager", str(dtype), n, sym, mode.value, step))
                    if sym:
                        for t in (inp, out):
                            conccl.release(t)
    # captured: one graph of a plain and a peer-reachable call, replayed with new inputs
    n = 32768
    conccl.reserve_graph_workspace(4 * world * (n * 2 + 512))
    ins = [torch.empty(n, dtype=torch.bfloat16, device="cuda"), conccl.empty(n, dtype=torch.bfloat16)]
    outs = [torch.empty(world * n, dtype=torch.bfloat16, device="cuda"), conccl.empty(world * n, dtype=torch.bfloat16)]
    for i, o in zip(ins, outs):  # eager first, as graph capture wants
        g.all_gather_into_tensor(o, i, algorithm=A.STAGED_PUSH)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i, o in zip(ins, outs):
            g.all_gather_into_tensor(o, i, algorithm=A.STAGED_PUSH)
    for step in range(5):
        for i in ins:
            i.copy_(torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        for k, (i, o) in enumerate(zip(ins, outs)):
            ref = torch.empty_like(o)
            dist.all_gather_into_tensor(ref, i)
            torch.cuda.synchronize()
            if not same(o, ref):
                bad.append(("graph", k, step))
    # what runs: copies only (no kernel), eager and in a replay
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.all_gather_into_tensor(outs[1], ins[1], algorithm=A.STAGED_PUSH)
        graph.replay()
        torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    return bad, names


def test_staged_push_all_gather_equals_nccl_eager_and_captured_on_copy_engines():
    from conccl.launch import run_per_gpu

    for bad, names in run_per_gpu(_staged_push):
        assert bad == [], bad
        # copies only; a same-GPU copy of a small captured call may replay as the driver's
        # memcpy kernel (conccl.schedule.captured), never a reduction or an NCCL kernel
        assert any("Memcpy" in k for k in names), names
        assert not [k for k in names if "Memcpy" not in k and "Memset" not in k and not k.startswith("memcpy")], names
