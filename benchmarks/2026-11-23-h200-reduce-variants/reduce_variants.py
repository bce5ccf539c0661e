"""Variants of the reduction kernel's vector loads and stores, side by side on one GPU.

A copy-engine reduce-scatter's only SM work is its sum (``executors/cuda_reduce.py``), and what
that sum costs a GEMM beside it is the figure issue 20 sets a goal on. The kernel reads its
operands once and writes the result once, so caching them in L2 only evicts what a GEMM beside
it keeps there. Each variant here recompiles the kernel with other ``LDV``/``STV`` macros (and
optionally other ``UNROLL``/``UNROLL_MANY`` and CTA sizes), checks its bits against the stated arithmetic (the
reference executor's ``reduce_chunks``), then times it alone and beside a bf16 GEMM loop
(``reduce_beside_gemm.beside_gemm``: in turns, CUDA events, median of ``--runs``), with
``torch.add`` as the full-grid yardstick.

    PYTHONPATH=src python benchmarks/2026-11-23-h200-reduce-variants/reduce_variants.py [--mib 1024] [--runs 15] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "2026-11-23-h200-reduce-beside-gemm")]
from reduce_beside_gemm import beside_gemm  # noqa: E402
from reduce_kernel import bits_right, sum_ms  # noqa: E402

from conccl._driver import driver  # noqa: E402
from conccl.executors import cuda_reduce  # noqa: E402

_ASM = r"""
__device__ __forceinline__ uint4 ld_cs(const uint4* p) {
    uint4 v; asm("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ void st_cs(uint4* p, uint4 v) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
"""

# name -> (macros put before the kernel source, threads of the pair kernels, of the general ones)
PLAIN = "#define LDV(p) (*(p))\n#define STV(p, v) (*(p) = (v))\n"
VARIANTS = {
    "current": ("", None, None),
    "plain ld/st": (PLAIN, None, None),
    "plain ld/st, UNROLL 8, 512 threads (the session's start)": (PLAIN + "#define UNROLL 8\n", 512, 512),
    "ld/st.cs": ("#define LDV(p) ld_cs(p)\n#define STV(p, v) st_cs(p, v)\n", None, None),
    "all at 1024 threads x 2": ("#define UNROLL_MANY 2\n", 1024, 1024),
}


def build(source: str, prefix: str, threads: int, threads_many: int):
    """The kernel module recompiled with ``prefix`` and these CTA sizes (``cuda_reduce``'s
    cache cleared; a ReduceLaunch made after it launches the new kernels)."""
    cuda_reduce._SOURCE = _ASM + prefix + source if prefix else source  # the helpers before the macros
    cuda_reduce.THREADS, cuda_reduce.THREADS_MANY = threads, threads_many
    cuda_reduce._module.cache_clear()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="reduce-scatter size (input bytes per rank)")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--gemm", type=int, default=8192)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-gemm", action="store_true", help="only the sums alone (2, 4 and 8 operands)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU visible")
        return 2
    device = torch.cuda.current_device()
    source, threads0 = cuda_reduce._SOURCE, (cuda_reduce.THREADS, cuda_reduce.THREADS_MANY)
    n = (a.mib << 20) // 2 // 2  # bf16 elements of each operand: half the input, 2 ranks' chunks
    x, y, out = (torch.randn(n, device="cuda").to(torch.bfloat16) for _ in range(3))
    cu = driver()
    sums, checks, alone = {}, {}, {}
    for name, (prefix, threads, threads_many) in VARIANTS.items():
        try:
            build(source, prefix, threads or threads0[0], threads_many or threads0[1])
            checks[name] = bits_right(sizes=(7, 4099, (1 << 20) + 13), shifts=(0,), scales=(0.37,))
        except Exception as e:  # a variant the compiler refuses is a result, not the end of the run
            checks[name] = f"failed: {e}"
            print(f"{name}: {checks[name]}")
            continue
        red = cuda_reduce.ReduceLaunch(device, out.data_ptr(), (x.data_ptr(), y.data_ptr()), n * 2, "bfloat16", 1.0)
        alone[name] = {k: sum_ms(k, 256)[0] for k in (2, 4, 8)}
        print(f"{name}: bits right {checks[name]}, {red.grid} CTAs x {red.threads} threads; alone, 256 MiB operands: "
              + ", ".join(f"{k} operands {t:.3f} ms ({(k + 1) * 256 * 2**20 / t / 1e6:.0f} GB/s)"
                          for k, t in alone[name].items()))
        sums[name] = lambda red=red: red.launch(cu, torch.cuda.current_stream().cuda_stream)
    build(source, "", *threads0)
    sums["torch.add (full grid)"] = lambda: torch.add(x, y, out=out)
    rows = {} if a.no_gemm else beside_gemm(sums, n, a.gemm, 20, a.runs)
    rows.update(mib=a.mib, bits_right=checks, grid=cuda_reduce.grid_bound(device), alone_256mib_ms=alone)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(v is True for v in checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
