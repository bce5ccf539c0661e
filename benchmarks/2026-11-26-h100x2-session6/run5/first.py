
# torchrun --nproc-per-node 2 first.py   (from a checkout: PYTHONPATH=src)
import os, torch, torch.distributed as dist, conccl

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))        # torchrun: one process per GPU
dist.init_process_group("nccl")
shard = conccl.empty(1 << 20, dtype=torch.bfloat16)         # peer-reachable memory: enables push
out = conccl.empty(dist.get_world_size() << 20, dtype=torch.bfloat16)
conccl.all_gather_into_tensor(out, shard)                   # stream-ordered, copy engines, no SM
op = conccl.persistent_all_gather_into_tensor(out, shard)   # agree with the peers once ...
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
with conccl.overlap(plan="auto") as c3:                     # a GEMM and a collective together
    y = c3.matmul(x, x)                                     # the computation
    c3.start(op)                                            # ... then only queue the copies

torch.cuda.synchronize(); print('first example ok on rank', dist.get_rank(), y.shape, out.shape)
dist.destroy_process_group()
