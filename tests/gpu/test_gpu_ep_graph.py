"""GPU tier: conccl.ep with fixed sizes (``fixed_sizes=True``, no host sync) captured into a CUDA
graph, dispatch and combine with an expert between, replayed with new tokens and routings (random
and skewed) and checked against the normal mode run eagerly on the same inputs, bit for bit; a
replay's profile shows no NCCL kernel and the rows crossing as copies. Eagerly, forward and
backward of the fixed mode equal the normal mode's (the weights' gradient to fp32 rounding). Each test starts one process per GPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

EXPERTS, K, H, TOKENS = 8, 2, 1000, 640


def _expert(ex, counts, rank, epr):
    """Expert e's rows times (its number + 1) / 4, from the counts on the device (no sync)."""
    ends = torch.as_tensor(counts, device=ex.device).to(torch.int64).cumsum(0)
    e = torch.searchsorted(ends, torch.arange(ex.shape[0], device=ex.device), right=True)
    return (ex.float() * ((rank * epr + e + 1).float() * 0.25)[:, None]).to(ex.dtype)


def _graph_against_eager(rank, world):
    from torch.profiler import ProfilerActivity, profile

    import conccl
    from conccl.bench.moe import routing
    from conccl import ep

    dev = torch.device("cuda", torch.cuda.current_device())
    epr = EXPERTS // world
    g = torch.Generator(device=dev).manual_seed(17 + rank)

    def inputs(step):
        idx, w = routing(torch, "skewed" if step % 2 else "random", TOKENS, EXPERTS, K, 90 + 7 * step + rank, dev)
        return torch.randn(TOKENS, H, device=dev, generator=g).to(torch.bfloat16), idx, w

    sx, sidx, sw = inputs(0)
    results = []
    with torch.no_grad():
        ep.dispatch(sx, sidx, sw, EXPERTS, fixed_sizes=True)  # eager warm-up: kernels loaded
        torch.cuda.synchronize()
        conccl.reserve_graph_workspace(32 << 20)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ex, counts, handle = ep.dispatch(sx, sidx, sw, EXPERTS, fixed_sizes=True)
            out = ep.combine(_expert(ex, counts, rank, epr), handle)
        for step in range(1, 7):
            for dst, src in zip((sx, sidx, sw), inputs(step)):
                dst.copy_(src)
            graph.replay()
            wex, wcounts, wh = ep.dispatch(sx, sidx, sw, EXPERTS)
            wout = ep.combine(_expert(wex, wcounts, rank, epr), wh)
            torch.cuda.synchronize()
            n = sum(wcounts)
            results.append((torch.equal(ex[:n], wex), counts.tolist() == wcounts, torch.equal(out, wout),
                            int(handle.bad_input) == 0))
        torch.cuda.synchronize()
        import torch.distributed as dist

        dist.barrier()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return results, [n for n in names if ("nccl" in n.lower() and "conccl" not in n.lower())], sum("memcpy" in n.lower() for n in names)


def test_fixed_sizes_in_a_cuda_graph_equal_the_normal_mode_eagerly():
    from conccl.launch import run_per_gpu

    for results, nccl, copies in run_per_gpu(_graph_against_eager):
        assert results == [(True, True, True, True)] * 6, results
        assert nccl == [], nccl
        assert copies > 0  # the rows crossed as copies


def _backward_against_normal(rank, world):
    from conccl.bench.moe import routing
    from conccl import ep

    dev = torch.device("cuda", torch.cuda.current_device())
    epr = EXPERTS // world
    idx, w = routing(torch, "random", TOKENS, EXPERTS, K, 5 + rank, dev)
    g = torch.Generator(device=dev).manual_seed(23 + rank)
    x = torch.randn(TOKENS, H, device=dev, generator=g).to(torch.bfloat16)
    grad = torch.randn(TOKENS, H, device=dev, generator=g).to(torch.bfloat16)
    runs = []
    for fixed in (True, False):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        ex, counts, h = ep.dispatch(xr, idx, wr, EXPERTS, fixed_sizes=fixed)
        out = ep.combine(_expert(ex, counts, rank, epr), h, wr)
        (out.float() * grad.float()).sum().backward()
        torch.cuda.synchronize()
        runs.append((out.detach(), xr.grad, wr.grad))
    (out, gx, gw), (nout, ngx, ngw) = runs
    # the weights' gradient is a sum over H per row of an [N, H] product, N the worst case's
    # rows with fixed sizes: torch's reduction may split it otherwise, so to fp32 rounding
    return [torch.equal(out, nout), torch.equal(gx, ngx), torch.allclose(gw, ngw, rtol=1e-5, atol=1e-6)]


def test_fixed_sizes_forward_and_backward_equal_the_normal_mode():
    from conccl.launch import run_per_gpu

    for same in run_per_gpu(_backward_against_normal):
        assert same == [True, True, True], same


def _layer_against_normal(rank, world):
    from conccl.bench.moe import routing
    from conccl import ep

    dev = torch.device("cuda", torch.cuda.current_device())
    idx, w = routing(torch, "skewed", TOKENS, EXPERTS, K, 31 + rank, dev)
    g = torch.Generator(device=dev).manual_seed(41 + rank)
    x = torch.randn(TOKENS, H, device=dev, generator=g).to(torch.bfloat16)
    grad = torch.randn(TOKENS, H, device=dev, generator=g).to(torch.bfloat16)
    runs = []
    for fixed in (True, False):
        xr = x.clone().requires_grad_()
        out = ep.moe_layer(xr, idx, w, EXPERTS, lambda rows, counts: rows * 0.5 + 1.0, chunks=2, fixed_sizes=fixed)
        (out.float() * grad.float()).sum().backward()
        torch.cuda.synchronize()
        runs.append((out.detach(), xr.grad))
    return [torch.equal(a, b) for a, b in zip(*runs)]


def test_moe_layer_with_fixed_sizes_overlapped_equals_the_normal_mode():
    from conccl.launch import run_per_gpu

    for same in run_per_gpu(_layer_against_normal):
        assert same == [True, True], same
