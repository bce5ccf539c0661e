"""GPU tier: conccl.ep's MoE dispatch and combine against the NCCL reference dispatcher
(conccl.bench.moe_reference, torchtitan's transport) bit for bit, on random, skewed and edge
routings (a rank with no tokens, every token to one expert); the profiler shows that no NCCL
kernel ran and that the rows crossed as copies. Each test starts one process per GPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

EXPERTS, K, H = 8, 2, 1000  # H not a multiple of 16: odd row sizes for the copies


def _cases(rank, world, dev):
    from conccl.bench.moe import routing

    tokens = 777 + 131 * rank
    g = torch.Generator(device=dev).manual_seed(5 + rank)
    x = torch.randn(tokens, H, device=dev, generator=g).to(torch.bfloat16)
    for kind in ("random", "skewed"):
        idx, w = routing(torch, kind, tokens, EXPERTS, K, 40 + rank, dev)
        yield kind, x, idx, w
    idx, w = routing(torch, "random", tokens, EXPERTS, K, 60 + rank, dev)
    yield "rank 1 has no tokens", (x[:0] if rank == 1 else x), (idx[:0] if rank == 1 else idx), \
        (w[:0] if rank == 1 else w)
    one = torch.zeros_like(idx)
    one[:, 1] = -1  # every token to expert 0 only
    yield "every token to expert 0", x, one, w


def _against_reference(rank, world):
    from torch.profiler import ProfilerActivity, profile

    from conccl.bench.moe_reference import reference_combine, reference_dispatch
    from conccl import ep

    dev = torch.device("cuda", torch.cuda.current_device())
    bad = []
    for name, x, idx, w in _cases(rank, world, dev):
        ex, counts, handle = ep.dispatch(x, idx, w, EXPERTS)
        rx, rcounts, rhandle = reference_dispatch(x, idx, w, EXPERTS)
        scale = torch.repeat_interleave(torch.arange(1, len(counts) + 1, device=dev, dtype=torch.float32),
                                        torch.tensor(counts, device=dev, dtype=torch.int64))[:, None]
        y = (ex.float() * scale).to(ex.dtype)
        out = ep.combine(y, handle)
        rout = reference_combine((rx.float() * scale).to(rx.dtype), rhandle)
        torch.cuda.synchronize()
        if not (torch.equal(ex, rx) and counts == rcounts and torch.equal(out, rout)):
            bad.append(name)
    x, idx, w = next(_cases(rank, world, dev))[1:]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ex, counts, handle = ep.dispatch(x, idx, w, EXPERTS)
        ep.combine(ex, handle)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return bad, names


def test_dispatch_and_combine_equal_the_nccl_reference_and_move_rows_by_copies():
    from conccl.launch import run_per_gpu

    for bad, names in run_per_gpu(_against_reference):
        assert bad == [], bad
        assert not any(("nccl" in n.lower() and "conccl" not in n.lower()) for n in names), names
        assert any("memcpy" in n.lower() for n in names), names  # the rows, the counts and metadata: copies
