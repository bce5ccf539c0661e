"""CPU multi-process tier: conccl.ep (over the reference executor) against the torchtitan-style
reference dispatcher (conccl.bench.moe_reference, over gloo): the same rows in the same expert
groups, the same counts, the same combined outputs, bit for bit; the reference sends more rows
where a token has two experts on one rank."""
from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from conccl.bench.moe_reference import reference_combine, reference_dispatch  # noqa: E402
from conccl import ep  # noqa: E402
from conccl.testing import spawn  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _both(comm, port, experts, k, dtype):
    r, w_ = comm.rank, comm.world
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=w_)
    try:
        g = torch.Generator().manual_seed(7 + r)
        tokens = 9 + 4 * r
        x = torch.randn(tokens, 32, generator=g).to(dtype)
        idx = torch.randint(0, experts, (tokens, k), generator=g)
        wts = torch.rand(tokens, k, generator=g)
        ex, counts, handle = ep.dispatch(x, idx, wts, experts, group=comm)
        rx, rcounts, rhandle = reference_dispatch(x, idx, wts, experts)
        epr = experts // w_
        scale = torch.repeat_interleave(torch.tensor([(r * epr + e + 1) * 0.5 for e in range(epr)]),
                                        torch.tensor(counts)).to(dtype)[:, None]
        out = ep.combine(ex * scale, handle, wts)
        rout = reference_combine(rx * scale, rhandle)
        return (torch.equal(ex, rx), counts == rcounts, torch.equal(out, rout), sum(handle.send.counts),
                sum(rhandle.send_counts))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world,experts,k", [(2, 4, 2), (3, 6, 3), (4, 16, 4), (8, 64, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conccl_ep_equals_the_reference_dispatcher(world, experts, k, dtype):
    results = spawn(world, _both, _free_port(), experts, k, dtype)
    for rank, (rows, counts, out, sent, ref_sent) in enumerate(results):
        assert rows and counts and out, (rank, rows, counts, out)
        assert sent <= ref_sent  # one row per (token, rank), not per (token, expert)
    assert sum(r[3] for r in results) < sum(r[4] for r in results)  # some token had two experts on one rank


def _fast(comm, port):
    r, w_ = comm.rank, comm.world
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=w_)
    try:
        from conccl.bench.moe_reference import scatter_add_combine

        g = torch.Generator().manual_seed(3 + r)
        x = torch.randn(11, 16, generator=g)
        idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(11)])
        wts = torch.rand(11, 2, generator=g)
        rx, _, rh = reference_dispatch(x, idx, wts, 8)
        return torch.allclose(scatter_add_combine(rx * 3, rh), reference_combine(rx * 3, rh), rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()


def test_the_scatter_add_combine_is_the_reference_within_rounding():
    assert all(spawn(2, _fast, _free_port()))
