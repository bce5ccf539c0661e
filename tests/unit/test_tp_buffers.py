"""No-device tier: what conccl.tp's GEMM steps tell the executor they touch (``compute.buffers``,
the key of a settled pipeline's graph, conccl.executors.cuda_ce): the same tensors give the same
key, and any tensor the steps read or write moved, reshaped or retyped gives another, so a
graph never replays GEMMs on buffers a call no longer uses."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl.integrations.tp import ops  # noqa: E402


class _Group:
    world, rank = 2, 0

    class executor:  # noqa: N801
        @staticmethod
        def capturing():
            return False


@pytest.fixture
def handed(monkeypatch):
    seen = []
    monkeypatch.setattr(ops, "_group", lambda g: _Group)
    monkeypatch.setattr(ops, "all_gather_then_compute", lambda g, out, inp, tp, rows, rb, compute, *a, **k:
                        seen.append(compute.buffers))
    monkeypatch.setattr(ops, "compute_then_reduce_scatter", lambda g, out, inp, op, tp, rows, rb, compute, *a, **k:
                        seen.append(compute.buffers))
    return seen


def test_the_same_tensors_give_the_same_key_and_any_other_tensor_another(handed):
    a, w, w2 = torch.ones(8, 16), torch.ones(16, 32), torch.ones(16, 32)
    ops.all_gather_matmul(a, w, schedule="direct")
    ops.all_gather_matmul(a, w, schedule="direct")
    ops.all_gather_matmul(a, w2, schedule="direct")  # another weight, same shape
    ops.all_gather_matmul(a, [w, w2], schedule="direct")  # two outputs
    ops.all_gather_matmul(torch.ones(8, 16), w, schedule="direct")  # another activation
    same, other_w, two, other_a = handed[1], handed[2], handed[3], handed[4]
    # the outputs are fresh tensors each call (the allocator may or may not hand the same memory
    # back): compare the keys' parts that name the caller's tensors
    assert handed[0][0] == same[0] and handed[0][2] == same[2]  # a2, the weight
    assert other_w[2] != same[2] and other_a[0] != same[0] and len(two) == len(same) + 2
    x, wr = torch.ones(8, 16), torch.ones(16, 32)
    ops.matmul_reduce_scatter(x, wr, schedule="direct")
    ops.matmul_reduce_scatter(x, wr.t().contiguous().t(), schedule="direct")  # same shape, other strides
    assert handed[5][0] == handed[6][0] and handed[5][1] != handed[6][1]
    assert handed[5][1][2] != handed[6][1][2]  # the strides differ
