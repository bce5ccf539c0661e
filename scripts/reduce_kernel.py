"""The reduction kernel alone on one GPU: bits against the stated arithmetic (the reference
executor's reduce_chunks) for every dtype, aligned (vector kernel) and misaligned (scalar),
and its time and bandwidth at a few sizes and operand counts.
Run: python3 scripts/reduce_kernel.py"""
from __future__ import annotations

import statistics

import torch

from conccl._driver import driver
from conccl.collectives.reduce_scatter import reduce_chunks
from conccl.executors.cuda_reduce import ReduceLaunch


def launch(dst, srcs, dtype, scale):
    r = ReduceLaunch(torch.cuda.current_device(), dst.data_ptr(), tuple(s.data_ptr() for s in srcs),
                     dst.numel() * dst.element_size(), dtype, scale)
    err = r.launch(driver(), torch.cuda.current_stream().cuda_stream)
    assert not err[0], err
    return r


def main():
    names = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
    ok = True
    for dtype, name in names.items():
        for n in (1, 7, 4099, 1 << 20, (1 << 22) + 13):
            for nsrc in (1, 2, 3, 8):  # 1: a group of one rank
                for shift in (0, 1):  # 1: every pointer one element off 16-byte alignment
                    srcs = [torch.randn(n + shift, device="cuda").to(dtype)[shift:] for _ in range(nsrc)]
                    dst = torch.empty(n + shift, dtype=dtype, device="cuda")[shift:]
                    for scale in (1.0, 0.5, 0.37):
                        r = launch(dst, srcs, name, scale)
                        want = reduce_chunks(srcs, scale).to(dtype)
                        torch.cuda.synchronize()
                        same = torch.equal(dst.view(torch.int16 if dtype != torch.float32 else torch.int32),
                                           want.view(torch.int16 if dtype != torch.float32 else torch.int32))
                        ok &= same
                        if not same:
                            print("MISMATCH", name, n, nsrc, shift, scale, r.vectorized)
    print("bits equal to the stated arithmetic in every case:", ok)
    for nsrc in (2, 8):
        for mib in (64, 256):
            n = (mib << 20) // 2
            srcs = [torch.randn(n, device="cuda").to(torch.bfloat16) for _ in range(nsrc)]
            dst = torch.empty(n, dtype=torch.bfloat16, device="cuda")
            for vec in (True, False):
                d = dst if vec else torch.empty(n + 1, dtype=torch.bfloat16, device="cuda")[1:]
                ts = []
                for i in range(13):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    r = launch(d, srcs, "bfloat16", 1.0)
                    b.record()
                    b.synchronize()
                    if i >= 3:
                        ts.append(a.elapsed_time(b))
                med = statistics.median(ts)
                gbs = (nsrc + 1) * mib * 2**20 / (med / 1e3) / 1e9
                print(f"bf16 {nsrc} operands x {mib} MiB, {'vector' if r.vectorized else 'scalar'} kernel, "
                      f"{r.grid} CTAs: {med:.3f} ms, {gbs:.0f} GB/s")


if __name__ == "__main__":
    main()
