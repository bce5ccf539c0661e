"""GPU tier: the gathered-sum kernel (conccl.kernels.gather_sum) against the torch form
conccl.ep uses on the CPU, bit for bit: fp32, bf16, fp16, vector and scalar rows, weighted and
not, missing operands (-1), rows with none. One GPU (this process)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpus(1)


def _torch_form(src, index, weights, dtype):
    acc = torch.zeros((index.shape[0], src.shape[1]), dtype=torch.float32, device=src.device)
    for j in range(index.shape[1]):
        pos = index[:, j]
        v = src[pos.clamp(min=0)].float()
        if weights is not None:
            v = weights[:, j, None] * v
        acc = acc + torch.where((pos >= 0)[:, None], v, torch.zeros_like(v))
    return acc.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("h", [1024, 1000, 7])  # vector rows, then scalar ones
@pytest.mark.parametrize("weighted", [True, False])
def test_kernel_equals_the_torch_form(dtype, h, weighted):
    from conccl.kernels.gather_sum import gather_sum

    g = torch.Generator(device="cuda").manual_seed(h)
    src = (torch.randn(300, h, device="cuda", generator=g) * 3).to(dtype)
    index = torch.randint(-1, 300, (257, 4), device="cuda", generator=g)
    index[5] = -1  # a row with no operand: zeros
    weights = torch.rand(257, 4, device="cuda", generator=g) if weighted else None
    out = gather_sum(torch.empty(257, h, dtype=dtype, device="cuda"), src, index, weights)
    want = _torch_form(src, index, weights, dtype)
    assert torch.equal(out.view(torch.uint8) if dtype != torch.float32 else out.view(torch.int32),
                       want.view(torch.uint8) if dtype != torch.float32 else want.view(torch.int32))
    assert not out[5].any() and out.abs().sum() > 0


def test_bad_arguments_are_refused():
    from conccl.kernels.gather_sum import gather_sum

    src = torch.zeros(4, 8, device="cuda")
    with pytest.raises(ValueError, match="dtype|share"):
        gather_sum(torch.empty(2, 8, dtype=torch.bfloat16, device="cuda"), src, torch.zeros(2, 1, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="index"):
        gather_sum(torch.empty(2, 8, device="cuda"), src, torch.zeros(2, 1, dtype=torch.int32, device="cuda"))
