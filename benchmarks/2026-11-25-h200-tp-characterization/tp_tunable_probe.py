"""Does cuBLASLt's algorithm choice (PyTorch TunableOp) lower the decomposition loss?

Times a GEMM cut into c row chunks (as conccl study tp's "rows" variant) with PyTorch's
default cuBLAS choice, then with TunableOp tuning every chunk shape first. One GPU; writes JSON
to the path given. Usage: PYTHONPATH=src python3
benchmarks/2026-11-25-h200-tp-characterization/tp_tunable_probe.py OUT.json
"""
import json
import statistics
import sys

import torch

SHAPES = ((8192, 8192, 7168), (1024, 8192, 7168), (8192, 3584, 8192), (8192, 8192, 14336))
CHUNKS = (1, 4, 8, 16)


def timed(a, w, out, c, runs=15, warmup=3):
    rows = a.shape[0] // c
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for i in range(warmup + runs):
        s.record()
        for j in range(c):
            torch.mm(a[j * rows:(j + 1) * rows], w, out=out[j * rows:(j + 1) * rows])
        e.record()
        e.synchronize()
        if i >= warmup:
            ms.append(s.elapsed_time(e))
    return statistics.median(ms)


def main(path):
    rec = []
    for mode in ("default", "tunable"):
        if mode == "tunable":
            t = torch.cuda.tunable
            t.enable(True)
            t.tuning_enable(True)
            t.set_max_tuning_duration(40)
            t.set_max_tuning_iterations(30)
        for M, K, N in SHAPES:
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            for c in CHUNKS:
                ms = timed(a, w, out, c)
                rec.append({"mode": mode, "M": M, "K": K, "N": N, "chunks": c, "ms": ms})
                print(mode, M, K, N, c, f"{ms:.3f}", flush=True)
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "records": rec}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
