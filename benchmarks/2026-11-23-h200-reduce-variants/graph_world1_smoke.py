"""Captured conccl calls on a group of one GPU: the capture plumbing (graph slots, the graph
workspace, persistent ops) without peers. The protocol between ranks needs 2 GPUs
(tests/gpu/test_gpu_graphs.py).

    PYTHONPATH=src python3 benchmarks/2026-11-23-h200-reduce-variants/graph_world1_smoke.py
"""
import os

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29531")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
import conccl  # noqa: E402

x = torch.randn(12345, device="cuda").to(torch.bfloat16)
inp, out = torch.randn(4099, device="cuda"), torch.empty(4099, device="cuda")
rs_out = torch.empty(4099, device="cuda")
pers = conccl.persistent_all_gather_into_tensor(out, inp)
conccl.all_reduce(x); conccl.reduce_scatter_tensor(rs_out, inp); pers.start()  # noqa: E702
torch.cuda.synchronize()
conccl.reserve_graph_workspace(1 << 20)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    conccl.all_reduce(x)
    conccl.reduce_scatter_tensor(rs_out, inp)
    pers.start()
ok = []
for i in range(4):
    inp.normal_()
    ref = x.clone()
    g.replay()
    torch.cuda.synchronize()
    ok.append(torch.equal(x, ref) and torch.equal(rs_out, inp) and torch.equal(out, inp))
print("world-1 captured calls replay right:", ok, "graph slots", conccl.get_group().graph_slots, flush=True)
try:
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        conccl.all_reduce(torch.empty(1 << 20, device="cuda"))
except Exception as e:  # noqa: BLE001
    print("too little graph workspace:", type(e).__name__, str(e)[:160], flush=True)
conccl.destroy()
dist.destroy_process_group()
