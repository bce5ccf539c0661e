"""No-device tier: the reduction's stated arithmetic (``reduce_chunks``, what the CPU reference
and the CUDA kernel compute) is NCCL's for two operands, whatever the op: NCCL premultiplies in
the dtype (``__hmul`` with the scalar held in the dtype) and adds in the dtype (``__hadd``).
torch's CPU half and bfloat16 arithmetic rounds each operation the same way, so it stands in
for NCCL here; tests/gpu compares against NCCL itself."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl.collectives.reduce_scatter import operand_scale, reduce_chunks  # noqa: E402


def _operands(dtype, n=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, generator=g) * torch.logspace(-9, 3, n)  # subnormal fp16 to large values
    tiny = torch.finfo(dtype).smallest_normal
    x[:, :64] = torch.arange(-32, 32).float() * tiny / 8  # subnormals: where rounding the product matters
    return x.to(dtype)


def _nccl_two(a, b, factor):
    """NCCL's premultiplied sum of two operands, in the dtype."""
    if factor == 1.0:
        return a + b
    s = torch.tensor(factor, dtype=a.dtype)
    return a * s + b * s


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("factor", [1.0, 0.5, 0.37, 1 / 3, 0.25])
def test_two_operands_are_nccls_premultiplied_sum_bit_for_bit(dtype, factor):
    a, b = _operands(dtype, seed=int(factor * 100))
    got = reduce_chunks([a, b], factor).to(dtype)
    want = _nccl_two(a, b, factor)
    assert torch.equal(got.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       want.view(torch.int16 if dtype != torch.float32 else torch.int32))


def test_the_old_arithmetic_differs_on_fp16_subnormals_so_this_test_can_fail():
    # products in fp32 without rounding them to fp16 first: not NCCL's AVG at two ranks
    a, b = _operands(torch.float16)
    unrounded = (a.float() * 0.5 + b.float() * 0.5).to(torch.float16)
    assert not torch.equal(unrounded, _nccl_two(a, b, 0.5))


def test_the_scale_is_held_in_the_dtype():
    assert operand_scale(1 / 3, torch.float16) == float(torch.tensor(1 / 3, dtype=torch.float16)) != 1 / 3
    assert operand_scale(0.5, torch.bfloat16) == 0.5 and operand_scale(1.0, torch.float16) == 1.0
