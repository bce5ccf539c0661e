"""No-device tier: what conccl.tp's GEMM steps tell the executor they touch (``compute.buffers``,
the key of a settled pipeline's graph, conccl.executors.cuda.executor): the same tensors give the same
key, and any tensor the steps read or write moved, reshaped or retyped gives another, so a
graph never replays GEMMs on buffers a call no longer uses."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl.tp import ops  # noqa: E402


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
    assert handed[5][0] == handed[6][0] and handed[5][1][1:] == (wr.shape, (32, 1), wr.dtype)
    assert handed[6][1][2] == (1, 16)  # the same shape, other strides: another key
    assert len(handed[5]) == 3  # the activation, the weight and the full product (before the sum)
    ops.matmul_reduce_scatter(x.to(torch.float16), wr.to(torch.float16), schedule="direct")  # another dtype
    ops.matmul_reduce_scatter(x.view(4, 2, 16), wr, schedule="direct")  # another shape, same memory
    assert handed[7][0][3] == handed[7][1][3] == torch.float16 and handed[7][1] != handed[5][1]
    assert handed[8][0][0] == handed[5][0][0] and handed[8][0] == handed[5][0]  # a2: the rows x K view
