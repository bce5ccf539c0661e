"""The rig's expert-parallel part: ``ep`` (conccl.ep's dispatch and combine, forward and
dispatch's backward, against the module doc's arithmetic applied to every rank's inputs, bit for
bit; the combine's sums are the gathered-sum kernel's on CUDA).

conccl is imported inside the part: the harness also serves scripts/launch_path_bench.py run
against another checkout's conccl, which may lack what a part uses."""
from __future__ import annotations

import torch

from rig.common import bits_equal

H = 40  # 80 bytes a bf16 row: the kernel's vector rows (fp32: 160)


def _inputs(src, experts, k, dtype):
    g = torch.Generator().manual_seed(500 + src)
    tokens = 6 + 5 * src
    idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    idx[torch.rand(tokens, k, generator=g) < 0.15] = -1
    return (torch.randn(tokens, H, generator=g).to(dtype), idx, torch.rand(tokens, k, generator=g),
            torch.randn(tokens, H, generator=g).to(dtype))


def _expected(every, rank, world, experts, k, dtype, scale):
    """Dispatch's rows, combine's output and x's gradient on ``rank``, by loops on the CPU."""
    epr = experts // world
    rows = [every[s][0][t] for e in range(epr) for s in range(world) for t in range(every[s][1].shape[0])
            for j in range(k) if every[s][1][t, j] == rank * epr + e]
    x, idx, w, grad = every[rank]
    out, gx = torch.empty_like(x), torch.empty_like(x)
    for t in range(x.shape[0]):
        acc, gacc = torch.zeros(H), torch.zeros(H)
        for d in range(world):
            held = [j for j in range(k) if idx[t, j] >= 0 and idx[t, j] // epr == d]
            if not held:
                continue
            part, gpart = torch.zeros(H), torch.zeros(H)
            for j in held:
                y = (x[t].float() * scale(int(idx[t, j]))).to(dtype)
                part = part + w[t, j] * y.float()
                gpart = gpart + ((w[t, j] * grad[t].float()).to(dtype).float() * scale(int(idx[t, j]))).to(dtype).float()
            acc, gacc = acc + part.to(dtype).float(), gacc + gpart.to(dtype).float()
        out[t], gx[t] = acc.to(dtype), gacc.to(dtype)
    return (torch.stack(rows) if rows else torch.empty(0, H, dtype=dtype)), out, gx


def ep(rank, world, cases, report):
    """conccl.ep on ranks sharing one GPU: dispatch's rows, combine's output and x's gradient."""
    from conccl import ep as cep

    for dtype in (torch.bfloat16, torch.float32):
        for experts, k in ((2 * world, 2), (4 * world, 3)):
            epr = experts // world
            scale = lambda e: (e + 1) * 0.25  # noqa: E731 - expert e's output: its rows times this
            every = [_inputs(s, experts, k, dtype) for s in range(world)]
            x, idx, w, grad = (t.cuda() for t in every[rank])
            x.requires_grad_()
            ex, counts, handle = cep.dispatch(x, idx, w, experts)
            factors = torch.repeat_interleave(torch.tensor([scale(rank * epr + e) for e in range(epr)]),
                                              torch.tensor(counts)).cuda()[:, None]
            y = (ex.float() * factors).to(dtype)
            out = cep.combine(y, handle)
            (out.float() * grad.float()).sum().backward()
            torch.cuda.synchronize()
            want_rows, want_out, want_gx = _expected(every, rank, world, experts, k, dtype, scale)
            name = f"ep {dtype} {experts} experts top-{k}"
            cases.append((f"{name} dispatch", bits_equal(ex.detach().cpu(), want_rows)))
            cases.append((f"{name} combine", bits_equal(out.detach().cpu(), want_out)))
            cases.append((f"{name} dispatch backward", bits_equal(x.grad.cpu(), want_gx)))
    # the layer over micro-batches, overlapped on two streams, against the same chunks in turn
    experts, k = 2 * world, 2
    x, idx, w, grad = (t.cuda() for t in _inputs(rank, experts, k, torch.bfloat16))
    weight = (torch.randn(H, H, generator=torch.Generator().manual_seed(3)) * 0.2).to(torch.bfloat16).cuda()
    runs = []
    for overlap in (True, False):
        xr = x.clone().requires_grad_()
        out = cep.moe_layer(xr, idx, w, experts, lambda rows, counts: rows @ weight, chunks=3, overlap=overlap)
        (out.float() * grad.float()).sum().backward()
        torch.cuda.synchronize()
        runs.append((out.detach(), xr.grad))
    cases.append(("ep moe_layer overlapped on two streams equals its chunks in turn, forward and backward",
                  all(bits_equal(a, b) for a, b in zip(*runs))))
    # fixed sizes, captured into a CUDA graph and replayed with new tokens and routings, against
    # the normal mode run eagerly on the same inputs (the token count is every rank's alike)
    experts, k, tokens = 2 * world, 2, 9
    epr = experts // world
    cep_fixed_graph(rank, world, cases, cep, experts, k, tokens, epr)


def _expert_rows(ex, counts, rank, epr):
    """The part's experts on device counts (no host sync): row i of expert e times (rank*epr+e+1)/4."""
    ends = torch.as_tensor(counts, device=ex.device).to(torch.int64).cumsum(0)
    e = torch.searchsorted(ends, torch.arange(ex.shape[0], device=ex.device), right=True)
    return (ex.float() * ((rank * epr + e + 1).float() * 0.25)[:, None]).to(ex.dtype)


def cep_fixed_graph(rank, world, cases, cep, experts, k, tokens, epr):
    import conccl

    def inputs(step):
        x, idx, w, _ = _inputs(world * step + rank + 1, experts, k, torch.bfloat16)  # >= 11 tokens
        return x[:tokens].cuda(), idx[:tokens].cuda(), w[:tokens].cuda()

    sx, sidx, sw = (t.clone() for t in inputs(0))
    with torch.no_grad():
        cep.dispatch(sx, sidx, sw, experts, fixed_sizes=True)  # eager warm-up: kernels loaded
        torch.cuda.synchronize()
        conccl.reserve_graph_workspace(1 << 20)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ex, counts, handle = cep.dispatch(sx, sidx, sw, experts, fixed_sizes=True)
            out = cep.combine(_expert_rows(ex, counts, rank, epr), handle)
        ok = []
        for step in range(1, 4):
            for dst, src in zip((sx, sidx, sw), inputs(step)):
                dst.copy_(src)
            graph.replay()
            wex, wcounts, wh = cep.dispatch(sx, sidx, sw, experts)
            wout = cep.combine(_expert_rows(wex, wcounts, rank, epr), wh)
            torch.cuda.synchronize()
            n = sum(wcounts)
            ok.append(bits_equal(ex[:n].cpu(), wex.cpu()) and counts.tolist() == wcounts
                      and bits_equal(out.cpu(), wout.cpu()))
    cases.append(("ep fixed sizes captured in a CUDA graph, 3 replays with new routings, equal the normal mode",
                  ok == [True] * 3))
