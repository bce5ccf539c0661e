"""GPU tier: the MoE routing kernel (conccl.kernels.moe_route) against the torch form
conccl.ep uses on the CPU (layout.route and layout.send_layout), exactly: the table (rows,
pairs per expert, the bad-input flag), every sent row's token, slots and weight bits. Worlds
2-8, 8-256 experts, top-1 to top-8, more tokens than the CTA has threads. One GPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpus(1)


@pytest.mark.parametrize("world,experts,k,tokens", [(2, 8, 2, 4099), (3, 12, 3, 100), (4, 64, 8, 2500),
                                                    (8, 256, 4, 3000), (8, 8, 1, 1), (2, 4, 2, 0)])
@pytest.mark.parametrize("weighted", [True, False])
def test_kernel_equals_the_torch_form(world, experts, k, tokens, weighted):
    from conccl.kernels.moe_route import route as route_kernel
    from conccl.ep.layout import rank_rows, route, send_layout

    g = torch.Generator(device="cuda").manual_seed(world * 1000 + k)
    idx = torch.randint(0, experts, (tokens, k), device="cuda", generator=g)
    idx[torch.rand(tokens, k, device="cuda", generator=g) < 0.1] = -1
    w = torch.rand(tokens, k, device="cuda", generator=g) if weighted else None
    table, order, meta, rank_row = route_kernel(idx, w, experts, world)
    rt = route(idx, experts, world)
    want_table = torch.cat([rt.table, rt.bad.clamp(max=1).expand(world, 1)], dim=1)
    assert torch.equal(table, want_table)
    counts = want_table[:, 0].tolist()
    send = send_layout(rt, idx, w, counts, experts)
    rows = sum(counts)
    assert torch.equal(order[:rows], send.order)
    assert torch.equal(meta[:rows, :k], send.slots)
    assert torch.equal(meta[:rows, k:], send.weights.contiguous().view(torch.int32))
    assert torch.equal(rank_row, rank_rows(counts, send.order, tokens))
    if tokens:  # a bad expert number sets the flag on every row of the table
        idx[0, 0] = experts
        assert route_kernel(idx, w, experts, world)[0][:, -1].tolist() == [1] * world


@pytest.mark.parametrize("rows,k,experts", [(3000, 2, 4), (700, 8, 128), (5, 3, 320), (1, 1, 1), (0, 2, 4)])
def test_expansion_kernel_equals_the_stable_sort(rows, k, experts):
    from conccl.kernels.moe_route import expand
    from conccl.ep.layout import plan_expansion

    g = torch.Generator(device="cuda").manual_seed(rows + k)
    slots = torch.randint(-1, experts, (rows, k), device="cuda", generator=g, dtype=torch.int32)
    packed = torch.zeros((rows, 3 * k + 1), dtype=torch.int32, device="cuda")  # rows strided as they arrive
    packed[:, 1:k + 1] = slots
    view = packed[:, 1:k + 1]
    want = plan_expansion(slots, experts)
    position, expanded = expand(view, experts, sum(want.counts))
    assert torch.equal(position, want.position)
    assert torch.equal(expanded, want.rows)


@pytest.mark.parametrize("h,dtype", [(1000, torch.bfloat16), (7, torch.float32), (6, torch.float16)])
def test_pack_equals_gather_and_concatenation(h, dtype):
    from conccl.kernels.moe_route import pack

    g = torch.Generator(device="cuda").manual_seed(h)
    x = torch.randn(50, h, device="cuda", generator=g).to(dtype)
    order = torch.randint(0, 50, (77,), device="cuda", generator=g)
    meta = torch.randint(-5, 5, (77, 4), device="cuda", generator=g, dtype=torch.int32)
    want = torch.cat([x[order].view(torch.uint8), meta.view(torch.uint8)], dim=1)
    assert torch.equal(pack(x, order, meta), want)
    assert pack(x, order[:0], meta[:0]).shape == (0, want.shape[1])
