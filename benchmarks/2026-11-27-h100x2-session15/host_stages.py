"""Where a settled eager call's host time goes (issue 38: conccl.tp <= 0.15 ms, collectives
<= 20 us): per case, host us per call of a loop of settled calls (free, and queued behind a GPU
sleep so that the GPU cannot hold the host back), then inclusive host us per call of each stage
(wrapped functions, ~0.2 us per wrapper), the graph launch's driver calls split out. Both
ranks; the JSON holds every rank's figures.

    OUT=... PYTHONPATH=src torchrun --nproc-per-node 2 benchmarks/2026-11-27-h100x2-session15/host_stages.py
"""
import collections
import functools
import importlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

CALLS = 300

STAGES = (
    ("tp op", "conccl.integrations.tp.ops", "matmul_reduce_scatter"),
    ("tp op", "conccl.integrations.tp.ops", "all_gather_matmul"),
    ("group call", "conccl.group.group", "Group.call"),
    ("persistent start", "conccl.persistent", "PersistentCollective.start"),
    ("resolve schedule", "conccl.integrations.tp.ops", "resolve_schedule"),
    ("buffers key", "conccl.integrations.tp.ops", "_buffers"),
    ("load kernels", "conccl.integrations.tp.ops", "_load_kernels"),
    ("torch.empty", "torch", "empty"),
    ("local step", "conccl.group.group", "Group._local_step"),
    ("call key", "conccl.group.group", "Group._remembered"),
    ("agree", "conccl.group.group", "Group._agree"),
    ("board post", "conccl.board", "HostBoard.post"),
    ("board wait", "conccl.board", "HostBoard._wait"),
    ("moved", "conccl.group.pipelined", "_moved"),
    ("execute", "conccl.group.group", "Group._execute"),
    ("executor run", "conccl.executors.cuda_ce", "CudaCopyEngineExecutor.run"),
    ("program lookup", "conccl.executors.cuda_ce", "CudaCopyEngineExecutor._program"),
    ("settled pipeline", "conccl.executors.cuda_ce", "CudaCopyEngineExecutor._settled_pipeline"),
    ("settled graph", "conccl.executors.cuda_ce", "CudaCopyEngineExecutor._settled_graph"),
    ("driver calls", "conccl.executors.cuda_program", "CompiledProgram.launch_slot"),
    ("graph launch", "conccl.executors.cuda_graph_launch", "SettledGraph.launch"),
    ("watchdog track", "conccl.watchdog", "Watchdog.track"),
)
LABELS = tuple(dict.fromkeys(s[0] for s in STAGES)) + ("node set (driver)", "cuGraphLaunch (driver)")


def stages(run, iters):
    totals = collections.defaultdict(int)
    patched = []

    def timer(fn, label):
        @functools.wraps(fn)
        def timed(*a, **k):
            t = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                totals[label] += time.perf_counter_ns() - t
        return timed

    def launch(self, stream, seq):  # SettledGraph.launch with its driver calls timed apart
        exe = self._exec
        for node, _, ref, values, _ in self._updates:
            for value, delta in values:
                value.value = (seq + delta) & 0xFFFFFFFF
            t = time.perf_counter_ns()
            err = self._set(exe, node, ref)
            totals["node set (driver)"] += time.perf_counter_ns() - t
            assert not err
        t = time.perf_counter_ns()
        err = self._launch(exe, stream)
        totals["cuGraphLaunch (driver)"] += time.perf_counter_ns() - t
        assert not err

    try:
        for label, module, attr in STAGES:
            owner = importlib.import_module(module)
            *path, name = attr.split(".")
            for part in path:
                owner = getattr(owner, part)
            original = owner.__dict__[name]
            setattr(owner, name, timer(launch if attr == "SettledGraph.launch" else original, label))
            patched.append((owner, name, original))
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
    finally:
        for owner, name, fn in reversed(patched):
            setattr(owner, name, fn)
    return {k: round(totals[k] / 1e3 / iters, 2) for k in LABELS}


def loop(run, iters, gate_s=0.0):
    torch.cuda.synchronize()
    dist.barrier()
    if gate_s:
        torch.cuda._sleep(int(gate_s * 1.8e9))
    t = time.perf_counter()
    for _ in range(iters):
        run()
    host = (time.perf_counter() - t) / iters * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / iters * 1e6
    dist.barrier()
    return round(host, 1), round(wall, 1)


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    import conccl
    from conccl.api import get_group
    g = get_group(None)
    ex = g.executor
    torch.manual_seed(rank)
    dev = "cuda"
    a_ag = torch.randn(1024 // world, 8192, dtype=torch.bfloat16, device=dev) / 8
    w_ag = torch.randn(8192, 7168, dtype=torch.bfloat16, device=dev) / 8
    a_rs = torch.randn(1024, 3584, dtype=torch.bfloat16, device=dev) / 8
    w_rs = torch.randn(3584, 8192, dtype=torch.bfloat16, device=dev) / 8
    n = 32768  # 64 KiB of bf16 output
    ag_in = torch.randn(n // world, dtype=torch.bfloat16, device=dev)
    ag_out = torch.empty(n, dtype=torch.bfloat16, device=dev)
    rs_in = torch.randn(n, dtype=torch.bfloat16, device=dev)
    rs_out = torch.empty(n // world, dtype=torch.bfloat16, device=dev)
    pers = g.persistent_all_gather_into_tensor(ag_out, ag_in)
    nccl_out = torch.empty_like(ag_out)
    cases = {
        "tp gemm_rs 1024x3584x8192 direct": lambda: conccl.tp.matmul_reduce_scatter(a_rs, w_rs, schedule="direct"),
        "tp ag_gemm 1024x8192x7168 auto": lambda: conccl.tp.all_gather_matmul(a_ag, w_ag, schedule="auto"),
        "all_gather 64K": lambda: conccl.all_gather_into_tensor(ag_out, ag_in),
        "reduce_scatter 64K": lambda: conccl.reduce_scatter_tensor(rs_out, rs_in),
        "persistent all_gather 64K start": lambda: pers.start(),
        "nccl all_gather 64K": lambda: dist.all_gather_into_tensor(nccl_out, ag_in),
    }
    res = {"rank": rank, "world": world, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "commit": os.environ.get("CONCCL_COMMIT"), "cases": {}}
    for name, fn in cases.items():
        for _ in range(20):
            fn()
        rec = {"free": [], "gated": []}
        for _ in range(3):
            rec["free"].append(loop(fn, CALLS))
            rec["gated"].append(loop(fn, CALLS, gate_s=0.2))
        dist.barrier()
        rec["stages"] = stages(fn, CALLS)
        dist.barrier()
        rec["median_free_host_us"] = statistics.median(h for h, _ in rec["free"])
        rec["median_gated_host_us"] = statistics.median(h for h, _ in rec["gated"])
        res["cases"][name] = rec
        if rank == 0:
            print(name, "free", rec["free"], "gated", rec["gated"], flush=True)
            print("   ", {k: v for k, v in rec["stages"].items() if v}, flush=True)
    res["counters"] = {k: getattr(ex, k, None) for k in ("programs_graphed", "pipelines_graphed", "graph_launches",
                                                          "graph_failures", "programs_compiled")}
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, f"host_stages_r{rank}.json"), "w") as f:
        json.dump(res, f, indent=1)
    if rank == 0:
        print("counters", res["counters"])
    pers.close()
    conccl.destroy() if hasattr(conccl, "destroy") else None
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
