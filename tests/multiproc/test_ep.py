"""CPU multi-process tier: conccl.ep's dispatch and combine over the reference executor, every
rank's result against what the module doc's arithmetic gives from every rank's inputs (each rank
regenerates all of them from seeds), forward and backward, bit for bit (the weights' gradient,
a sum over the hidden size, to fp32 rounding)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl import ep  # noqa: E402
from conccl.testing import spawn  # noqa: E402

H = 16


def _inputs(src, experts, k, dtype):
    g = torch.Generator().manual_seed(100 + src)
    tokens = 5 + 3 * src
    x = torch.randn(tokens, H, generator=g).to(dtype)
    idx = torch.randint(0, experts, (tokens, k), generator=g)
    idx[torch.rand(tokens, k, generator=g) < 0.1] = -1  # masked slots
    if k > 1:
        idx[0, 1] = idx[0, 0]  # a token routed twice to one expert
    w = torch.rand(tokens, k, generator=g)
    grad = torch.randn(tokens, H, generator=g).to(dtype)
    return x, idx, w, grad


def _scale(expert):
    return (expert + 1) * 0.5  # the test's expert: y = x * scale, in the dtype


def _run(comm, experts, k, dtype):
    w_, r = comm.world, comm.rank
    epr = experts // w_
    every = [_inputs(s, experts, k, dtype) for s in range(w_)]
    x, idx, w, grad = every[r]
    x = x.clone().requires_grad_()
    w = w.clone().requires_grad_()
    expert_x, counts, handle = ep.dispatch(x, idx, w, experts, group=comm)
    # the experts: each group of rows times its expert's scale
    outs, start = [], 0
    for e, n in enumerate(counts):
        outs.append(expert_x[start:start + n] * _scale(r * epr + e))
        start += n
    expert_out = torch.cat(outs) if outs else expert_x[:0]
    out = ep.combine(expert_out, handle, w)
    (out.float() * grad.float()).sum().backward()
    bad = []
    # dispatch: rows grouped by local expert, then source rank, token, slot
    want_rows = [every[s][0][t] for e in range(epr) for s in range(w_) for t in range(every[s][1].shape[0])
                 for j in range(k) if every[s][1][t, j] == r * epr + e]
    want = torch.stack(want_rows) if want_rows else torch.empty(0, H, dtype=dtype)
    if not torch.equal(expert_x.detach(), want):
        bad.append("dispatch")
    # combine: per rank holding the token, its slots in order (w * y, fp32), rounded; ranks in order, rounded
    z = lambda: torch.zeros(H, dtype=torch.float32)  # noqa: E731
    want_out = torch.empty_like(x)
    want_gx = torch.empty_like(x)
    want_gw = torch.zeros(x.shape[0], k)
    for t in range(x.shape[0]):
        acc, gacc = z(), z()
        for d in range(w_):
            held = [j for j in range(k) if idx[t, j] >= 0 and idx[t, j] // epr == d]
            if not held:
                continue
            part, gpart = z(), z()
            for j in held:
                y = x.detach()[t] * _scale(int(idx[t, j]))
                part = part + w.detach()[t, j] * y.float()
                g_out = (w.detach()[t, j] * grad[t].float()).to(dtype)
                gpart = gpart + (g_out * _scale(int(idx[t, j]))).float()
                want_gw[t, j] = (grad[t].float() * y.float()).sum()
            acc = acc + part.to(dtype).float()
            gacc = gacc + gpart.to(dtype).float()
        want_out[t], want_gx[t] = acc.to(dtype), gacc.to(dtype)
    if not torch.equal(out.detach(), want_out):
        bad.append("combine")
    if not torch.equal(x.grad, want_gx):
        bad.append("dispatch backward")
    if not torch.allclose(w.grad, want_gw, rtol=1e-5, atol=1e-6):
        bad.append("weights' gradient")
    return bad, sum(counts)


@pytest.mark.parametrize("world,experts,k", [(2, 4, 2), (2, 8, 1), (3, 6, 4), (3, 12, 2), (4, 8, 8), (8, 16, 2), (8, 256, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dispatch_and_combine_forward_and_backward(world, experts, k, dtype):
    results = spawn(world, _run, experts, k, dtype)
    for rank, (bad, _) in enumerate(results):
        assert bad == [], (rank, bad)
    assert sum(n for _, n in results) > 0  # rows moved


def _bad_input(comm, which):
    r = comm.rank
    x = torch.randn(6, H)
    idx = torch.randint(0, 4, (6, 2))
    if r == 1 and which == "expert":
        idx[2, 1] = 4  # 4 experts: 0..3
    if r == 1 and which == "shape":
        idx = idx[:5]
    try:
        ep.dispatch(x, idx, None, 4, group=comm)
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("which", ["expert", "shape"])
def test_bad_input_on_one_rank_stops_every_rank_without_a_hang(which):
    says = spawn(2, _bad_input, which, join_timeout_s=60)
    assert all(says), says  # both ranks raised
    assert ("outside" in says[1]) if which == "expert" else ("with x's 6 tokens" in says[1])
    assert "rank(s) [1]" in says[0]


def _edges(comm, case):
    w_, r = comm.world, comm.rank
    tokens = 0 if (case == "empty rank" and r == 1) else 7
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(r))
    idx = torch.zeros(tokens, 2, dtype=torch.int64)
    idx[:, 1] = 1 if case == "one rank" else -1  # "one rank": experts 0 and 1, both on rank 0
    ex, counts, handle = ep.dispatch(x, idx, None, 4, group=comm)
    out = ep.combine(ex * 2, handle)
    want = x * 2 * (2 if case == "one rank" else 1)  # exact: powers of two
    return torch.equal(out, want), counts


@pytest.mark.parametrize("case", ["empty rank", "one expert", "one rank"])
def test_empty_ranks_and_all_tokens_to_one_expert_or_rank(case):
    results = spawn(2, _edges, case)
    assert all(ok for ok, _ in results), results
    assert results[1][1] == [0, 0]  # rank 1's experts (2, 3) got nothing
    rows_to_0 = {"empty rank": 7, "one expert": 14, "one rank": 14}[case]
    assert results[0][1] == ([rows_to_0, 0] if case != "one rank" else [14, 14])


def _odd_rows(comm):
    r = comm.rank
    x = (torch.randint(-4, 5, (5, 7)) * 0.5).to(torch.bfloat16)  # 14-byte rows: slots and weights sent apart
    idx = torch.tensor([[0, 3], [1, -1], [2, 3], [3, 0], [1, 2]]) if r == 0 else torch.tensor([[3, 2]] * 5)
    ex, counts, handle = ep.dispatch(x, idx, None, 4, group=comm)
    out = ep.combine(ex, handle)
    want = x * (idx >= 0).sum(dim=1, keepdim=True).to(torch.bfloat16)  # exact: small multiples of 0.5
    return torch.equal(out, want), counts


def test_rows_whose_bytes_are_not_a_multiple_of_4():
    results = spawn(2, _odd_rows)
    assert all(ok for ok, _ in results), results
    assert results[0][1] == [2, 2] and results[1][1] == [7, 8]


def _layer(comm, chunks):
    """moe_layer over chunks equals the same chunks run by hand (dispatch, experts, combine),
    bit for bit, forward and backward; and the unchunked layer within rounding."""
    torch.manual_seed(comm.rank)
    experts, k = 4, 2
    x = torch.randn(7 + 2 * comm.rank, H)
    idx = torch.stack([torch.randperm(experts)[:k] for _ in range(x.shape[0])])
    wts = torch.rand(x.shape[0], k)
    weight = torch.nn.Parameter(torch.randn(H, H, generator=torch.Generator().manual_seed(9)) * 0.1)

    def run(fn):
        xr, wr = x.clone().requires_grad_(), wts.clone().requires_grad_()
        weight.grad = None
        out = fn(xr, wr)
        out.square().sum().backward()
        return out.detach(), xr.grad, wr.grad, weight.grad.clone()

    def ffn(rows, counts):
        return torch.tanh(rows @ weight)

    def by_hand(xr, wr):
        outs, step = [], -(-x.shape[0] // chunks)
        for s in range(0, chunks * step, step):
            e = min(s + step, x.shape[0])
            s = min(s, e)
            rows, counts, h = ep.dispatch(xr[s:e], idx[s:e], wr[s:e], experts, group=comm)
            outs.append(ep.combine(ffn(rows, counts), h, wr[s:e]))
        return torch.cat(outs)

    layer = run(lambda xr, wr: ep.moe_layer(xr, idx, wr, experts, ffn, chunks=chunks, group=comm))
    hand = run(by_hand)
    whole = run(lambda xr, wr: ep.moe_layer(xr, idx, wr, experts, ffn, chunks=1, group=comm))
    return (all(torch.equal(a, b) for a, b in zip(layer, hand)),
            all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(layer, whole)))


@pytest.mark.parametrize("chunks", [2, 3, 16])  # 16: more chunks than a rank has tokens
def test_moe_layer_over_chunks_equals_the_chunks_by_hand(chunks):
    for same, close in spawn(2, _layer, chunks):
        assert same and close


def _values(comm, n):
    got = comm.exchange_values([comm.rank * 1000 + i for i in range(n)], "test")
    return got == [[r * 1000 + i for i in range(n)] for r in range(comm.world)], comm.board.row_len


@pytest.mark.parametrize("n", [1, 50, 300])  # 300: many board rows
def test_exchange_values_returns_every_ranks_values(n):
    for same, row_len in spawn(3, _values, n):
        assert same
    assert n == 1 or n > row_len  # several board rows (the piecing) are exercised


def _experts_differ(comm):
    try:
        ep.dispatch(torch.randn(4, H), torch.zeros(4, 1, dtype=torch.int64), None, 4 + 2 * comm.rank, group=comm)
    except ValueError as e:
        return str(e)
    return None


def test_ranks_passing_different_expert_counts_stop_alike():
    says = spawn(2, _experts_differ, join_timeout_s=60)
    assert all(s and "different num_experts" in s for s in says), says


def _absent_peer(comm):
    from datetime import timedelta

    from conccl.errors import CollectiveTimeout, GroupBroken

    if comm.rank == 1:
        return "absent"
    try:
        comm.exchange_values([1, 2, 3], "test", timeout=timedelta(seconds=1))
    except CollectiveTimeout as e:
        try:
            comm.exchange_values([1], "test")
        except GroupBroken:
            return f"timeout then broken: {e}"
    return "no error"


def test_exchange_values_with_an_absent_peer_times_out_and_breaks_the_group():
    says = spawn(2, _absent_peer, join_timeout_s=60)
    assert says[0].startswith("timeout then broken") and "rank" in says[0].lower(), says
