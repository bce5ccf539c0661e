"""The reduction kernel alone on one GPU: bits against the stated arithmetic (the reference
executor's reduce_chunks) for every dtype, aligned (vector kernel) and misaligned (scalar),
and its time and bandwidth at a few sizes and operand counts. ``bits_right`` and ``sum_ms``
are reused by reduce_variants.py beside it.
Run: PYTHONPATH=src python3 benchmarks/2026-11-23-h200-reduce-variants/reduce_kernel.py"""
from __future__ import annotations

import statistics

import torch

from conccl._driver import driver
from conccl.collectives.reduce_scatter import reduce_chunks
from conccl.executors.cuda_reduce import ReduceLaunch

_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def launch(dst, srcs, dtype, scale):
    """A ReduceLaunch built now (the kernel module as currently compiled) and launched."""
    r = ReduceLaunch(torch.cuda.current_device(), dst.data_ptr(), tuple(s.data_ptr() for s in srcs),
                     dst.numel() * dst.element_size(), dtype, scale)
    err = r.launch(driver(), torch.cuda.current_stream().cuda_stream)
    assert not err[0], err
    return r


def bits_right(sizes=(1, 7, 4099, 1 << 20, (1 << 22) + 13), shifts=(0, 1), scales=(1.0, 0.5, 0.37)) -> bool:
    """Every dtype, size, operand count (1: a group of one rank), alignment (shift 1: every
    pointer one element off 16 bytes) and scale bit-equal to the stated arithmetic; prints
    each mismatch."""
    ok = True
    for dtype, name in _NAMES.items():
        view = torch.int32 if dtype == torch.float32 else torch.int16
        for n in sizes:
            for nsrc in (1, 2, 3, 8):
                for shift in shifts:
                    srcs = [torch.randn(n + shift, device="cuda").to(dtype)[shift:] for _ in range(nsrc)]
                    dst = torch.empty(n + shift, dtype=dtype, device="cuda")[shift:]
                    for scale in scales:
                        r = launch(dst, srcs, name, scale)
                        want = reduce_chunks(srcs, scale).to(dtype)
                        torch.cuda.synchronize()
                        if not torch.equal(dst.view(view), want.view(view)):
                            ok = False
                            print("MISMATCH", name, n, nsrc, shift, scale, r.vectorized)
    return ok


def sum_ms(nsrc: int, mib: int, aligned: bool = True):
    """(median ms of 10 after 3 warm-ups, the launch) of one bf16 sum of ``nsrc`` operands of
    ``mib`` MiB each; ``aligned`` False: the destination one element off (the scalar kernel)."""
    n = (mib << 20) // 2
    srcs = [torch.randn(n, device="cuda").to(torch.bfloat16) for _ in range(nsrc)]
    dst = torch.empty(n + (not aligned), dtype=torch.bfloat16, device="cuda")[(not aligned):]
    r = launch(dst, srcs, "bfloat16", 1.0)  # built once: the timed launches are the GPU's alone
    ts = []
    for i in range(13):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        assert not r.launch(driver(), torch.cuda.current_stream().cuda_stream)[0]
        b.record()
        b.synchronize()
        if i >= 3:
            ts.append(a.elapsed_time(b))
    return statistics.median(ts), r


def main():
    print("bits equal to the stated arithmetic in every case:", bits_right())
    for nsrc in (2, 8):
        for mib in (64, 256):
            for aligned in (True, False):
                med, r = sum_ms(nsrc, mib, aligned)
                gbs = (nsrc + 1) * mib * 2**20 / (med / 1e3) / 1e9
                print(f"bf16 {nsrc} operands x {mib} MiB, {'vector' if r.vectorized else 'scalar'} kernel, "
                      f"{r.grid} CTAs: {med:.3f} ms, {gbs:.0f} GB/s")


if __name__ == "__main__":
    main()
