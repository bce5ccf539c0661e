"""MoE dispatch layouts (conccl.ep.layout) against plain loops: worlds 2-8, 8-256
experts, top-1 to top-8, masked slots and repeated experts included."""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from conccl.ep.layout import experts_per_rank, plan_expansion, plan_send  # noqa: E402


def _routing(rng, tokens, k, experts):
    idx = torch.tensor([[rng.randrange(-1, experts) if rng.random() < 0.1 else rng.randrange(experts)
                         for _ in range(k)] for _ in range(tokens)], dtype=torch.int64).view(tokens, k)
    w = torch.tensor([[rng.random() for _ in range(k)] for _ in range(tokens)]).view(tokens, k)
    return idx, w


CASES = [(w, e, k) for w in (2, 3, 4, 8) for e in (8, 64, 256) for k in (1, 2, 8) if e % w == 0]


@pytest.mark.parametrize("world,experts,k", CASES)
def test_send_layout_sends_each_token_once_per_rank_in_rank_then_token_order(world, experts, k):
    rng = random.Random(world * 1000 + experts + k)
    idx, w = _routing(rng, 37, k, experts)
    epr = experts_per_rank(experts, world)
    lay = plan_send(idx, w, experts, world)
    want_order, want_counts, want_slots, want_w = [], [], [], []
    for d in range(world):
        n = 0
        for t in range(idx.shape[0]):
            held = [j for j in range(k) if idx[t, j] >= 0 and idx[t, j] // epr == d]
            if held:
                n += 1
                want_order.append(t)
                want_slots.append([int(idx[t, j] % epr) if j in held else -1 for j in range(k)])
                want_w.append([float(w[t, j]) if j in held else 0.0 for j in range(k)])
        want_counts.append(n)
    assert lay.order.tolist() == want_order and lay.counts == want_counts
    assert lay.slots.tolist() == (want_slots or [])
    assert torch.equal(lay.weights, torch.tensor(want_w, dtype=torch.float32).view(-1, k))


@pytest.mark.parametrize("world,experts,k", CASES)
def test_expansion_groups_rows_by_expert_then_arrival_then_slot(world, experts, k):
    rng = random.Random(7 + world * experts * k)
    epr = experts_per_rank(experts, world)
    slots = torch.tensor([[rng.randrange(-1, epr) for _ in range(k)] for _ in range(29)], dtype=torch.int32)
    ex = plan_expansion(slots, epr)
    want = [(e, r, j) for e in range(epr) for r in range(29) for j in range(k) if slots[r, j] == e]
    assert ex.rows.tolist() == [r for _, r, _ in want]
    assert ex.counts == [sum(1 for e2, _, _ in want if e2 == e) for e in range(epr)]
    for n, (_, r, j) in enumerate(want):
        assert ex.position[r, j] == n
    assert int((ex.position >= 0).sum()) == len(want)


def test_bad_routing_is_refused():
    with pytest.raises(ValueError, match="split evenly"):
        experts_per_rank(10, 4)
    with pytest.raises(ValueError, match="outside"):
        plan_send(torch.tensor([[0, 8]]), None, 8, 2)
    with pytest.raises(ValueError, match="tokens, k"):
        plan_send(torch.tensor([0, 1]), None, 8, 2)


@pytest.mark.parametrize("world,experts,k", [(2, 8, 2), (4, 64, 8), (8, 256, 1)])
def test_rank_rows_point_at_each_tokens_sent_row(world, experts, k):
    from conccl.ep.layout import rank_rows

    rng = random.Random(world + k)
    idx, w = _routing(rng, 29, k, experts)
    lay = plan_send(idx, w, experts, world)
    got = rank_rows(lay.counts, lay.order, 29)
    want = torch.full((29, world), -1, dtype=torch.int64)
    row = 0
    for d, n in enumerate(lay.counts):
        for t in lay.order[row:row + n].tolist():
            want[t, d] = row
            row += 1
    assert torch.equal(got, want)
