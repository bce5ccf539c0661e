"""Which captured copies a CUDA graph replays as a kernel (``memcpy*_post``) and which as a
copy-engine record ("Memcpy ..."): a settled call's graph (conccl.executors.cuda_graph_launch)
showed a ``memcpy32_post`` kernel for a plain-tensor all-gather (run2). Two ranks, one per GPU;
every copy 64 KiB, captured alone with cuMemcpyAsync, replayed under the profiler:
plain -> plain (same GPU), plain -> symmetric (own, VMM-mapped), symmetric -> plain,
peer symmetric -> plain (a pull), plain -> peer symmetric (a push), symmetric -> symmetric (own).

    PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session7/graph_copy_kinds.py
"""
from __future__ import annotations

import torch


def _probe(rank, world):
    import torch.distributed as dist
    from torch.distributed import _symmetric_memory as symm_mem
    from torch.profiler import ProfilerActivity, profile

    from conccl._driver import check, driver

    cu = driver()
    n = 1 << 20
    sym = symm_mem.empty(2 * n, dtype=torch.uint8, device="cuda")
    handle = symm_mem.rendezvous(sym, dist.group.WORLD.group_name)
    own, peer = handle.buffer_ptrs[rank], handle.buffer_ptrs[1 - rank]
    plain_a = torch.zeros(n, dtype=torch.uint8, device="cuda")
    plain_b = torch.zeros(n, dtype=torch.uint8, device="cuda")
    cases = {"plain->plain": (plain_b.data_ptr(), plain_a.data_ptr()),
             "plain->own symmetric": (own, plain_a.data_ptr()),
             "own symmetric->plain": (plain_b.data_ptr(), own),
             "peer symmetric->plain (pull)": (plain_b.data_ptr(), peer),
             "plain->peer symmetric (push)": (peer + n * rank // 2, plain_a.data_ptr()),
             "own symmetric->own symmetric": (own + n, own)}
    for size in (4096, 32768, 1 << 20):  # sizes of copies between this GPU's own buffers
        cases[f"plain->plain {size}"] = (plain_b.data_ptr(), plain_a.data_ptr(), size)
        cases[f"plain->own symmetric {size}"] = (own, plain_a.data_ptr(), size)
        cases[f"own symmetric->plain {size}"] = (plain_b.data_ptr(), own, size)
    out = {}
    stream = torch.cuda.Stream()
    for name, (dst, src, *size) in cases.items():
        nbytes = size[0] if size else (4096 if "push" in name else n)
        dist.barrier()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            check(cu.cuMemcpyAsync(cu.CUdeviceptr(dst), cu.CUdeviceptr(src), nbytes,
                                   cu.CUstream(torch.cuda.current_stream().cuda_stream)))
        g.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            g.replay()
            torch.cuda.synchronize()
        graph_names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            with torch.cuda.stream(stream):
                check(cu.cuMemcpyAsync(cu.CUdeviceptr(dst), cu.CUdeviceptr(src), nbytes,
                                       cu.CUstream(stream.cuda_stream)))
            torch.cuda.synchronize()
        eager_names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        out[name] = {"graph": graph_names, "eager": eager_names}
    dist.barrier()
    return out


if __name__ == "__main__":
    from conccl.launch import run_per_gpu

    for rank, r in enumerate(run_per_gpu(_probe, nprocs=2)):
        for name, v in r.items():
            print(f"rank {rank} {name:32s} graph {v['graph']}  eager {v['eager']}")
