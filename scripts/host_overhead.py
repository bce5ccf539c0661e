"""Where a small conccl call spends its host time: cProfile of 300 all-gathers of 1 MiB on
rank 0 of all visible GPUs. Run on a GPU machine: PYTHONPATH=src python3 scripts/host_overhead.py"""
import cProfile
import io
import pstats

import torch

from conccl.launch import run_per_gpu


def work(rank, world):
    import conccl

    inp = torch.randn(1 << 18, device="cuda")
    out = torch.empty(world << 18, device="cuda")
    for _ in range(20):
        conccl.all_gather_into_tensor(out, inp)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        conccl.all_gather_into_tensor(out, inp)
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    return s.getvalue()


if __name__ == "__main__":
    print(run_per_gpu(work)[0])
