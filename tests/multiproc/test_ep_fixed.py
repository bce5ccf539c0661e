"""CPU multi-process tier: conccl.ep's fixed-size dispatch and combine (``fixed_sizes=True``, no
host sync: what a CUDA graph captures) over the reference executor, against the normal mode on
the same inputs: the expert rows (the first ``counts.sum()``), the counts, combine's output and
every gradient bit for bit; and what the fixed mode refuses or flags."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl import ep  # noqa: E402
from conccl.testing import spawn  # noqa: E402

H = 16


def _inputs(rank, tokens, experts, k, dtype, hidden=H):
    g = torch.Generator().manual_seed(300 + rank)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    idx = torch.randint(0, experts, (tokens, k), generator=g)
    idx[torch.rand(tokens, k, generator=g) < 0.1] = -1
    if k > 1 and tokens:
        idx[0, 1] = idx[0, 0]  # a token routed twice to one expert
    w = torch.rand(tokens, k, generator=g)
    grad = torch.randn(tokens, hidden, generator=g).to(dtype)
    return x, idx, w, grad


def _layer(comm, x, idx, w, grad, experts, fixed):
    """dispatch, an expert per group (rows times its number + 1, halved), combine, backward."""
    epr = experts // comm.world
    x = x.clone().requires_grad_()
    w = w.clone().requires_grad_()
    ex, counts, handle = ep.dispatch(x, idx, w, experts, group=comm, fixed_sizes=fixed)
    n = [int(c) for c in counts]
    scale = torch.zeros(ex.shape[0], 1, dtype=torch.float32)  # rows past the counts: times 0
    start = 0
    for e, c in enumerate(n):
        scale[start:start + c] = (comm.rank * epr + e + 1) * 0.5
        start += c
    out = ep.combine((ex.float() * scale).to(ex.dtype), handle, w)
    (out.float() * grad.float()).sum().backward()
    return ex.detach()[:sum(n)], n, out.detach(), x.grad, w.grad, handle, ex.shape[0]


def _against_normal(comm, tokens, experts, k, dtype, hidden):
    x, idx, w, grad = _inputs(comm.rank, tokens, experts, k, dtype, hidden)
    fixed = _layer(comm, x, idx, w, grad, experts, True)
    normal = _layer(comm, x, idx, w, grad, experts, False)
    h = fixed[5]
    bad = [name for name, a, b in zip(("rows", "counts", "combine", "x grad", "w grad"), fixed[:5], normal[:5])
           if not (a == b if isinstance(a, list) else torch.equal(a, b))]
    room = tokens * comm.world * k
    return bad, sum(normal[1]), (h.fixed, isinstance(h.counts, list), int(h.bad_input), room == fixed[6])


@pytest.mark.parametrize("world,experts,k,tokens", [(2, 4, 2, 9), (2, 8, 1, 5), (3, 6, 4, 7), (4, 8, 8, 6),
                                                    (8, 16, 2, 5), (2, 4, 2, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fixed_sizes_equal_the_normal_mode_bit_for_bit(world, experts, k, tokens, dtype):
    results = spawn(world, _against_normal, tokens, experts, k, dtype, H)
    for rank, (bad, _, (fixed, listed, flagged, room)) in enumerate(results):
        assert bad == [], (rank, bad)
        assert fixed and not listed and not flagged and room  # counts a tensor; the worst case's rows
    if tokens:
        assert sum(n for _, n, _ in results) > 0  # rows moved


def test_fixed_sizes_with_rows_whose_bytes_are_not_a_multiple_of_4():
    for bad, n, _ in spawn(2, _against_normal, 6, 4, 2, torch.bfloat16, 7):
        assert bad == [] and n > 0, bad


def _expert_out_of_range(comm):
    x, idx, w, _ = _inputs(comm.rank, 6, 4, 2, torch.float32)
    if comm.rank == 1:
        idx[2, 1] = 9  # 4 experts: 0..3, ignored and flagged (no host check without a sync)
    _, counts, h = ep.dispatch(x, idx, w, 4, group=comm, fixed_sizes=True)
    return int(h.bad_input), int(counts.sum())


def test_an_expert_out_of_range_is_flagged_on_its_rank():
    flags = [f for f, _ in spawn(2, _expert_out_of_range)]
    assert flags == [0, 1]


def _differing(comm, what):
    tokens = 6 + (comm.rank if what == "tokens" else 0)
    x, idx, w, _ = _inputs(comm.rank, tokens, 4, 2, torch.float32)
    if what == "shape" and comm.rank == 1:
        w = w[:, :1]
    try:
        ep.dispatch(x, idx, w, 4, group=comm, fixed_sizes=True)
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("what", ["tokens", "shape"])
def test_ranks_that_differ_or_pass_bad_shapes_stop_alike(what):
    says = spawn(2, _differing, what, join_timeout_s=60)
    assert all(says), says
    if what == "tokens":
        assert all("token count" in s for s in says), says
    else:
        assert "topk_weights" in says[1] and "rank(s) [1]" in says[0], says


def _layer_fixed(comm, chunks):
    x, idx, w, grad = _inputs(comm.rank, 8, 4, 2, torch.bfloat16)
    runs = []
    for fixed in (True, False):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        seen = []

        def experts(rows, counts):
            seen.append(torch.is_tensor(counts))
            return rows * 0.5 + 1.0  # row by row: the same bits at any row count

        out = ep.moe_layer(xr, idx, wr, 4, experts, chunks=chunks, group=comm, fixed_sizes=fixed)
        (out.float() * grad.float()).sum().backward()
        runs.append((out.detach(), xr.grad, wr.grad, seen))
    (a, gx, gw, seen_fixed), (b, ngx, ngw, seen_normal) = runs
    return torch.equal(a, b) and torch.equal(gx, ngx) and torch.equal(gw, ngw), seen_fixed, seen_normal


@pytest.mark.parametrize("chunks", [1, 3])
def test_moe_layer_with_fixed_sizes_equals_the_normal_mode(chunks):
    for same, seen_fixed, seen_normal in spawn(2, _layer_fixed, chunks):
        assert same
        assert seen_fixed == [True] * chunks and seen_normal == [False] * chunks  # device counts with fixed sizes


def _weighted_expert(comm):
    """An expert with a weight: its gradient sums over the rows dispatch returned, so the rows
    past the counts (fixed sizes) must carry no gradient."""
    x, idx, w, grad = _inputs(comm.rank, 7, 4, 2, torch.float32)
    grads = []
    for fixed in (True, False):
        weight = (torch.arange(H * H, dtype=torch.float32).view(H, H) % 7 - 3).div(8).requires_grad_()
        ex, counts, h = ep.dispatch(x, idx, w, 4, group=comm, fixed_sizes=fixed)
        out = ep.combine(ex @ weight, h, None)
        (out * grad).sum().backward()
        grads.append(weight.grad)
    # the fixed mode's GEMM has more rows (zero rows of gradient): the same sum to fp32 rounding
    return torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-5), float((grads[0] - grads[1]).abs().max())


def test_rows_past_the_counts_carry_no_gradient_to_an_experts_weight():
    for close, diff in spawn(2, _weighted_expert):
        assert close, diff


def _dtypes_differ(comm):
    x, idx, w, _ = _inputs(comm.rank, 6, 4, 2, torch.float32)
    try:
        ep.dispatch(x.double() if comm.rank else x, idx, w, 4, group=comm, fixed_sizes=True)
    except ValueError as e:
        return str(e)
    return None


def test_ranks_passing_different_dtypes_stop_alike():
    says = spawn(2, _dtypes_differ, join_timeout_s=60)
    assert all(s and "different dtypes" in s for s in says), says


def _short_expert_out(comm):
    x, idx, w, _ = _inputs(comm.rank, 6, 4, 2, torch.float32)
    ex, _, h = ep.dispatch(x, idx, w, 4, group=comm, fixed_sizes=True)
    try:
        ep.combine(ex[:-1], h)  # every rank alike: each raises before anything moves
    except ValueError as e:
        return str(e)
    return None


def test_combine_refuses_expert_rows_that_are_not_dispatchs():
    says = spawn(2, _short_expert_out, join_timeout_s=60)
    assert all(s and "dispatch returned" in s for s in says), says
