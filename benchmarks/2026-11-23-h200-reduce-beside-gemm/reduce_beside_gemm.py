"""What conccl's reduction kernel costs a GEMM running beside it, on one GPU.

A copy-engine reduce-scatter takes SMs only for its sum (one kernel of at most ``grid_bound``
CTAs, ``executors/cuda_reduce.py``). This times a bf16 GEMM loop alone and with a reduction
looping on another stream the whole time, for the sum a rank of a 2-rank reduce-scatter of
``--mib`` MiB does (two operands of half that size), and, for comparison, the same sum as a
plain ``torch.add`` (a full-grid elementwise kernel, what an SM collective's reduction is
closest to). Both streams start behind one gate (a spin kernel; the GEMMs alone too), CUDA
events, median of ``--runs`` runs after a warm-up, the three cases in turns. It does not
measure the copies' share (copy engines and HBM traffic of the peer writes): that needs two
GPUs (``conccl bench``).

    PYTHONPATH=src python benchmarks/2026-11-23-h200-reduce-beside-gemm/reduce_beside_gemm.py [--mib 1024] [--gemm 8192] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from conccl._driver import driver
from conccl.executors.cuda_reduce import ReduceLaunch, grid_bound


def _timed(fn, stream=None) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s = stream or torch.cuda.current_stream()
    a.record(s)
    fn()
    b.record(s)
    b.synchronize()
    return a.elapsed_time(b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="reduce-scatter size (input bytes per rank)")
    ap.add_argument("--gemm", type=int, default=8192, help="M = N = K of the bf16 GEMM")
    ap.add_argument("--gemms", type=int, default=20, help="GEMMs per timed loop")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--ctas", type=int, nargs="+", default=None,
                    help="grids of the reduction kernel to try (default: conccl's, half the SMs)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU visible")
        return 2
    n = (a.mib << 20) // 2 // 2  # bf16 elements of each operand: half the input, 2 ranks' chunks
    x, y, out = (torch.randn(n, device="cuda").to(torch.bfloat16) for _ in range(3))
    cu = driver()
    default = grid_bound(torch.cuda.current_device())
    sums = {}
    for ctas in a.ctas or [default]:
        red = ReduceLaunch(torch.cuda.current_device(), out.data_ptr(), (x.data_ptr(), y.data_ptr()), n * 2,
                           "bfloat16", 1.0)
        red.grid = ctas  # the kernel is a grid-stride loop: any grid computes the same sum
        name = f"conccl reduction ({ctas} CTAs{', the default' if ctas == default else ''})"
        sums[name] = lambda red=red: red.launch(cu, torch.cuda.current_stream().cuda_stream)
    sums["torch.add (full grid)"] = lambda: torch.add(x, y, out=out)
    rows = beside_gemm(sums, n, a.gemm, a.gemms, a.runs)
    rows["mib"] = a.mib
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def beside_gemm(sums: dict, n: int, gemm: int, gemms_per_loop: int, runs_wanted: int) -> dict:
    """Each of ``sums`` (name -> a launch of a sum over ``n``-element bf16 operands; 3 n
    elements of traffic) alone and looping beside a loop of bf16 GEMMs, in turns; prints and
    returns the rows."""
    side = torch.cuda.Stream()
    A = torch.randn(gemm, gemm, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(gemm, gemm, device="cuda", dtype=torch.bfloat16)
    C = torch.empty_like(A)

    def gemms():
        for _ in range(gemms_per_loop):
            torch.mm(A, B, out=C)

    gemms()
    for fn in sums.values():
        fn()
    torch.cuda.synchronize()
    alone_ms = {name: statistics.median(_timed(fn) for _ in range(runs_wanted)) for name, fn in sums.items()}
    reps = {name: int(2 * _timed(gemms) / t) + 2 for name, t in alone_ms.items()}  # the sum outlasts the GEMMs

    def gated(name):
        """GEMM loop ms (and the sum's ms per launch) with ``name``'s sum looping beside, or alone."""
        gate = torch.cuda.Event()
        torch.cuda._sleep(2_000_000)  # both streams start behind it; the GEMMs alone too
        gate.record()
        s0 = s1 = None
        if name is not None:
            side.wait_event(gate)
            with torch.cuda.stream(side):
                s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s0.record(side)
                for _ in range(reps[name]):
                    sums[name]()
                s1.record(side)
        ms = _timed(gemms)
        if s1 is not None:
            s1.synchronize()
        return ms, None if s0 is None else s0.elapsed_time(s1) / reps[name]

    # In turns (alone, beside each sum, alone, ...), so that clock and power drift fall on all
    # alike, and the order rotated each turn: with a fixed order the first sum read slowest
    # whichever it was (first runs of ../2026-11-23-h200-reduce-variants/reduce_variants.py).
    runs = {name: [] for name in (None, *sums)}
    names = list(sums)
    for turn in range(runs_wanted):
        k = turn % len(names)
        for name in [None, *names[k:], *names[:k]]:
            runs[name].append(gated(name))
    gemm_alone = statistics.median(ms for ms, _ in runs[None])
    rows = {"gemm_ms_per_loop": gemm_alone, "gemm_alone_spread_ms": [min(ms for ms, _ in runs[None]),
                                                                      max(ms for ms, _ in runs[None])],
            "gemms_per_loop": gemms_per_loop, "gemm_mnk": gemm, "operand_mib": n * 2 / 2**20,
            "runs": runs_wanted, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "sums": {}}
    print(f"{torch.cuda.get_device_name(0)}: {gemms_per_loop} x bf16 GEMM {gemm}^3 alone {gemm_alone:.2f} ms")
    for name in sums:
        beside = [ms for ms, _ in runs[name]]
        gemm_beside = statistics.median(beside)
        r = rows["sums"][name] = {
            "sum_alone_ms": alone_ms[name], "sum_beside_ms": statistics.median(t for _, t in runs[name]),
            "gemm_beside_ms_per_loop": gemm_beside, "gemm_slowdown": gemm_beside / gemm_alone - 1,
            "gemm_spread_ms": [min(beside), max(beside)], "sum_GBps_alone": 3 * n * 2 / alone_ms[name] / 1e6}
        # A reduce-scatter call runs its sum once: what one sum costs the GEMMs is the figure
        r["gemm_ms_lost_per_sum"] = (gemm_beside - gemm_alone) / (gemm_beside / r["sum_beside_ms"])
        print(f"  beside {name}: GEMMs {gemm_beside:.2f} ms ({100 * r['gemm_slowdown']:+.1f}%); the sum alone "
              f"{alone_ms[name]:.3f} ms ({r['sum_GBps_alone']:.0f} GB/s), beside the GEMMs {r['sum_beside_ms']:.3f} ms; "
              f"GEMM time lost per sum {r['gemm_ms_lost_per_sum']:.3f} ms")
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
