"""GPU tier: push all-gathers whose own chunk is read back from a peer's output
(``set_options(own_chunk_via_peer=True)``) against NCCL bit for bit, eager in every stream
mode and captured into a CUDA graph, and proof that no same-GPU copy runs: the profiler sees
only peer copies with it, and a same-GPU copy or kernel without it (the counter-check). One
process per GPU (skipping: conftest.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _via_peer(rank, world):
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import conccl

    S = conccl.StreamMode
    g = conccl.get_group()
    gen = torch.Generator(device="cuda").manual_seed(rank)
    bad = []

    def same(a, b):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))

    def check(out, inp, what):
        ref = torch.empty_like(out)
        dist.all_gather_into_tensor(ref, inp)
        torch.cuda.synchronize()
        if not same(out, ref):
            bad.append(what)

    conccl.set_options(own_chunk_via_peer=True)
    for dtype in (torch.bfloat16, torch.float32):
        for n in (1, 7, 4097, (1 << 20) + 3):
            inp = torch.empty(n, dtype=dtype, device="cuda")  # any input: a push reads it on this GPU
            out = conccl.empty(world * n, dtype=dtype)
            for mode in (S.BATCH, S.PER_PEER, S.SINGLE):
                for step in range(3):
                    inp.copy_(torch.randn(n, device="cuda", generator=gen).to(dtype))
                    out.view(torch.uint8).fill_(0xAB)
                    g.all_gather_into_tensor(out, inp, stream_mode=mode)
                    check(out, inp, ("eager", str(dtype), n, mode.value, step))
            conccl.release(out)
    # captured: replayed with new inputs
    n = 32768
    inp, out = torch.empty(n, dtype=torch.bfloat16, device="cuda"), conccl.empty(world * n, dtype=torch.bfloat16)
    conccl.all_gather_into_tensor(out, inp)  # eagerly first, as graph capture wants
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        conccl.all_gather_into_tensor(out, inp)
    for step in range(5):
        inp.copy_(torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16))
        out.view(torch.uint8).fill_(0xAB)
        graph.replay()
        torch.cuda.synchronize()
        check(out, inp, ("graph", step))

    def names(fn):
        dist.barrier()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})

    # settled calls on conccl.empty tensors (the same buffers from the third call on) run as
    # one CUDA graph launch each (docs/design.md): the read-back rides in that graph too
    sym_in = conccl.empty(n, dtype=torch.bfloat16)
    launches = g.executor.graph_launches
    for step in range(5):
        sym_in.copy_(torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16))
        out.view(torch.uint8).fill_(0xAB)
        conccl.all_gather_into_tensor(out, sym_in)
        check(out, sym_in, ("settled", step))
    settled = g.executor.graph_launches - launches
    settled_names = names(lambda: conccl.all_gather_into_tensor(out, sym_in))
    with_it = names(lambda: (conccl.all_gather_into_tensor(out, inp), graph.replay()))
    conccl.set_options(own_chunk_via_peer=False)
    without = names(lambda: conccl.all_gather_into_tensor(out, inp))
    check(out, inp, "without")
    return bad, with_it, without, settled, settled_names


def test_own_chunk_read_back_from_a_peer_equals_nccl_and_runs_no_same_gpu_copy():
    from conccl.launch import run_per_gpu

    for bad, with_it, without, settled, settled_names in run_per_gpu(_via_peer):
        assert bad == [], bad
        assert with_it and all(k.startswith("Memcpy PtoP") for k in with_it), with_it
        assert settled >= 2, settled  # the settled calls did run as graph launches
        assert settled_names and all(k.startswith("Memcpy PtoP") for k in settled_names), settled_names
        # the counter-check: the same call with its own copy on this GPU shows it
        assert any(not k.startswith("Memcpy PtoP") for k in without), without
