"""CPU multi-process tier: the reference dispatcher's backward (conccl.bench.moe_reference, over
gloo) against conccl.ep's (over the reference executor): the gradients of the tokens, of the
dispatched rows, of the expert outputs and of the top-k weights equal bit for bit (compared as
integers: a -0 against a +0 fails), on random routing with masked slots and a token routed twice
to one expert, with a rank that has no tokens, and with every token sent to one expert."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from conccl.bench.moe_reference import reference_combine, reference_dispatch  # noqa: E402
from conccl import ep  # noqa: E402
from conccl.launch import free_port
from conccl.testing import spawn  # noqa: E402

H = 24
CASES = ("random", "a rank without tokens", "every token to one expert")
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def _inputs(case, rank, world, experts, k, dtype):
    g = torch.Generator().manual_seed(31 * rank + 7 * CASES.index(case) + world)
    tokens = 0 if case == CASES[1] and rank == 1 else 6 + 5 * rank
    x = torch.randn(tokens, H, generator=g).to(dtype)
    idx = torch.randint(0, experts, (tokens, k), generator=g)
    if case == CASES[2]:
        idx[:] = experts - 1
    elif tokens:
        idx[torch.rand(tokens, k, generator=g) < 0.15] = -1
        idx[0, -1] = idx[0, 0]  # a token routed twice to one expert
    w = torch.rand(tokens, k, generator=g)
    grad = torch.randn(tokens, H, generator=g).to(dtype)
    return x, idx, w, grad


def _step(dispatch, combine, x, idx, w, grad, experts, rank, world):
    """Dispatch, the experts (y = x * scale[expert] * x, a nonlinear map), combine, backward."""
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    ex, counts, handle = dispatch(x, idx, w)
    ex.retain_grad()
    epr = experts // world
    scale = torch.repeat_interleave(torch.tensor([0.25 * (rank * epr + e + 1) for e in range(epr)]),
                                    torch.tensor(counts)).to(ex.dtype)[:, None]
    y = ex * scale * ex
    y.retain_grad()
    out = combine(y, handle, w)
    (out.float() * grad.float()).sum().backward()
    return out.detach(), x.grad, ex.grad, y.grad, w.grad


def _same_bits(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(BITS[a.dtype]), b.contiguous().view(BITS[b.dtype]))


def _both(comm, port, experts, k, dtype):
    r, world = comm.rank, comm.world
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=world)
    try:
        bad, moved = [], 0.0
        for case in CASES:
            x, idx, w, grad = _inputs(case, r, world, experts, k, dtype)
            mine = _step(lambda x, i, w: ep.dispatch(x, i, w, experts, group=comm), ep.combine,
                         x, idx, w, grad, experts, r, world)
            ref = _step(lambda x, i, w: reference_dispatch(x, i, w, experts), reference_combine,
                        x, idx, w, grad, experts, r, world)
            for name, a, b in zip(("out", "x.grad", "expert_x.grad", "expert_out.grad", "w.grad"), mine, ref):
                if not _same_bits(a, b):
                    bad.append(f"{case}: {name}")
            moved += float(mine[1].float().abs().sum()) + float(mine[4].abs().sum())
        return bad, moved
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world,experts,k", [(2, 4, 2), (3, 6, 4), (4, 8, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_backward_equals_conccl_ep(world, experts, k, dtype):
    results = spawn(world, _both, free_port(), experts, k, dtype)
    for rank, (bad, _) in enumerate(results):
        assert bad == [], (rank, bad)
    assert sum(m for _, m in results) > 0  # gradients reached the tokens and the weights
