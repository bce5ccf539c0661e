"""Probe: NCCL's and conccl's reduce-scatter with PREMUL_SUM(0.37) on small known inputs, each dtype
(2026-11-23, nvidia-h200-x2, torch 2.11 / NCCL 2.28: NCCL's bf16 result was ~1e30; fp16 rounds in half)."""
import torch, torch.distributed as dist
from conccl.launch import run_per_gpu
import conccl

def probe(rank, world):
    out = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        inp = torch.tensor([1.0, 2.0, 3.0, -1.5] * world, dtype=dtype, device="cuda") * (rank + 1)
        ref = torch.empty(4, dtype=dtype, device="cuda"); mine = torch.empty_like(ref)
        op = dist._make_nccl_premul_sum(0.37)
        dist.reduce_scatter_tensor(ref, inp.clone(), op=op)
        conccl.reduce_scatter_tensor(mine, inp.clone(), op=dist._make_nccl_premul_sum(0.37))
        torch.cuda.synchronize()
        out[str(dtype)] = (ref.float().tolist(), mine.float().tolist(), str(op.__getstate__()))
    return out

if __name__ == '__main__':
    for r in run_per_gpu(probe):
        for k, v in r.items(): print(k, v)
