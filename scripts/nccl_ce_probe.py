"""Which buffer placement NCCL's copy-engine all-gather (cta_policy ZERO) accepts here.

    PYTHONPATH=src python3 scripts/nccl_ce_probe.py VARIANT   (out_window | in_place | both_windows)
Prints per rank: correct or the error, and the kernels the profiler saw in one call.
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed import _symmetric_memory as symm_mem
from torch.profiler import ProfilerActivity, profile

from conccl.launch import run_per_gpu


def probe(rank, world, variant):
    symm_mem.set_backend("NCCL")
    opts = dist.ProcessGroupNCCL.Options()
    opts.config.cta_policy = dist.ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO
    group = dist.new_group(backend="nccl", pg_options=opts)
    n = 16 << 20
    with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(torch.device("cuda", torch.cuda.current_device()))):
        out = torch.empty(n * world, dtype=torch.bfloat16, device="cuda")
        win_in = torch.empty(n, dtype=torch.bfloat16, device="cuda") if variant == "both_windows" else None
    symm_mem.rendezvous(out, group.group_name)
    if win_in is not None:
        symm_mem.rendezvous(win_in, group.group_name)
    inp = out[rank * n:(rank + 1) * n] if variant == "in_place" else (win_in if win_in is not None else
                                                                      torch.empty(n, dtype=torch.bfloat16, device="cuda"))
    inp.fill_(rank + 1)
    try:
        dist.all_gather_into_tensor(out, inp, group=group)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            dist.all_gather_into_tensor(out, inp, group=group)
            torch.cuda.synchronize()
        kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA" and "emcpy" not in e.name]
        ok = all(bool((out[r * n:(r + 1) * n] == r + 1).all()) for r in range(world))
        return f"{variant}: correct={ok} kernels={kernels[:3]}"
    except Exception as e:  # noqa: BLE001
        return f"{variant}: {type(e).__name__}: {str(e)[:200]}"


if __name__ == "__main__":
    print(run_per_gpu(probe, sys.argv[1], timeout_s=120))
