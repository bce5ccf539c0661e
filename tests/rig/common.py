"""What every part of the shared-GPU rig uses: seeded inputs every rank can regenerate, a
bitwise comparison, the kernels a profile saw."""
from __future__ import annotations

import torch

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def seeded(tag: int, rank: int, step: int, n: int, dtype):
    g = torch.Generator(device="cuda").manual_seed(1_000_003 * tag + 1009 * rank + step)
    return torch.randn(n, device="cuda", generator=g).to(dtype)


def bits_equal(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def sm_kernels(prof) -> list[str]:
    """Kernels (SM work) the profiler saw; copy-engine records ("Memcpy DtoD ...") are not."""
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(("Memcpy ", "Memset "))})


def small_ints(shape, seed, dtype):
    """Small whole numbers: every GEMM of them accumulates exactly in fp32, so a GEMM cut into
    other row blocks rounds to the same bits, and "the serial result" is one exact answer."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-3, 4, shape, device="cuda", generator=g).to(dtype)



class RankLeaves(BaseException):
    """Raised by a part whose rank leaves the group on purpose (``hier_faults``' victim): the
    harness reports the rank's cases and ends its process at once, with no teardown, as a
    crashed rank would."""
