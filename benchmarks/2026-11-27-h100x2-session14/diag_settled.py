"""Where a settled pipeline's graph hangs (run1 of session 14 hung in the GPU TP tests, the rig
and the host bench once pipelines were graphed): each rank calls one pipeline again and again
on the same tensors, synchronising and printing after each call, with a faulthandler dump
after 40 s; CONCCL_DIAG_SYNC=1 synchronises the device before a graph is made.

    OUT=... PYTHONPATH=src python3 benchmarks/2026-11-27-h100x2-session14/diag_settled.py SCHEDULE OP
"""
import faulthandler
import os
import sys

import torch


def _rank(rank, world, out_dir):
    faulthandler.dump_traceback_later(40, exit=True, file=sys.stderr)
    from conccl.api import get_group
    from conccl.executors import cuda_graph_launch as sg
    from conccl.integrations import tp as ctp

    ex = get_group(None).executor
    name, op = sys.argv[1], sys.argv[2]
    print(f"rank {rank}: graphs available {sg.available()}", flush=True)
    if os.environ.get("CONCCL_DIAG_SYNC") == "1":
        made = ex._settled_pipeline

        def synced(*a, **k):
            torch.cuda.synchronize()
            return made(*a, **k)
        ex._settled_pipeline = synced
    a = torch.randn(512, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 768, dtype=torch.bfloat16, device="cuda")
    a_rs = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    for call in range(6):
        if op == "ag":
            _, (y,) = ctp.all_gather_matmul(a, w, 0, schedule=name)
        else:
            y = ctp.matmul_reduce_scatter(a_rs, w, 0, schedule=name)
        print(f"rank {rank} call {call}: queued, graphed {ex.pipelines_graphed} launches {ex.graph_launches} "
              f"failures {ex.graph_failures}", flush=True)
        torch.cuda.synchronize()
        print(f"rank {rank} call {call}: done", flush=True)
        del y
    faulthandler.cancel_dump_traceback_later()
    return ex.graph_launches


def main():
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    from conccl.launch import run_per_gpu
    print(run_per_gpu(_rank, os.environ.get("OUT", ".")), flush=True)


if __name__ == "__main__":
    main()
