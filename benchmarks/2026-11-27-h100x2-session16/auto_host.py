"""Host time of an eager call under ``set_eager_path("auto")`` routed to NCCL, against NCCL's
own call (issue 38: ``auto`` <= 1.05x NCCL at every size): per collective at 64 KiB, loops of
300 calls in turns (NCCL, auto, NCCL, auto, ...), then the host time of each layer of the
routed call (wrapped functions, inclusive, ~0.2 us per wrapper) and a cProfile of it on rank 0.

    OUT=... PYTHONPATH=src torchrun --nproc-per-node 2 benchmarks/2026-11-27-h100x2-session16/auto_host.py
"""
import collections
import cProfile
import functools
import importlib
import io
import json
import os
import pstats
import statistics
import time

import torch
import torch.distributed as dist

CALLS, TURNS = 300, 4
LAYERS = (
    ("api function", "conccl.api", "all_gather_into_tensor"),
    ("api function", "conccl.api", "reduce_scatter_tensor"),
    ("api function", "conccl.api", "all_reduce"),
    ("get_group", "conccl.api", "get_group"),
    ("Group.call", "conccl.group.group", "Group.call"),
    ("routes to fallback", "conccl.group.group", "Group._routes_to_fallback"),
    ("call fallback", "conccl.group.group", "Group._call_fallback"),
    ("executor run_fallback", "conccl.executors.cuda_ce", "CudaCopyEngineExecutor.run_fallback"),
    ("capturing", "conccl.executors.cuda_ce", "CudaCopyEngineExecutor.capturing"),
    ("control stream", "conccl.executors.cuda_ce", "CudaCopyEngineExecutor._control_stream"),
    ("current stream", "conccl.executors.cuda_ce", "CudaCopyEngineExecutor._current_stream"),
    ("call_with", "conccl.collectives.base", "Collective.call_with"),
    ("torch.distributed function", "torch.distributed", "all_gather_into_tensor"),
    ("torch.distributed function", "torch.distributed", "reduce_scatter_tensor"),
    ("torch.distributed function", "torch.distributed", "all_reduce"),
    ("event record", "torch.cuda", "Event.record"),
)
LABELS = tuple(dict.fromkeys(label for label, _, _ in LAYERS))


def layers(run, iters):
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

    try:
        for label, module, attr in LAYERS:
            owner = importlib.import_module(module)
            *path, name = attr.split(".")
            for part in path:
                owner = getattr(owner, part)
            original = owner.__dict__.get(name)
            if original is None:
                continue
            setattr(owner, name, timer(original, label))
            patched.append((owner, name, original))
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
    finally:
        for owner, name, fn in reversed(patched):
            setattr(owner, name, fn)
    return {k: round(totals[k] / 1e3 / iters, 2) for k in LABELS}


def loop(run, iters):
    torch.cuda.synchronize()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        run()
    host = (time.perf_counter() - t) / iters * 1e6
    torch.cuda.synchronize()
    dist.barrier()
    return round(host, 1)


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    import conccl
    conccl.set_eager_path("auto")
    dev, n = "cuda", 32768  # 64 KiB of bf16 output per rank
    ag_in = torch.randn(n // world, dtype=torch.bfloat16, device=dev)
    ag_out = torch.empty(n, dtype=torch.bfloat16, device=dev)
    rs_in = torch.randn(n, dtype=torch.bfloat16, device=dev)
    rs_out = torch.empty(n // world, dtype=torch.bfloat16, device=dev)
    ar = torch.randn(n, dtype=torch.bfloat16, device=dev)
    pairs = {
        "all_gather": (lambda: dist.all_gather_into_tensor(ag_out, ag_in),
                       lambda: conccl.all_gather_into_tensor(ag_out, ag_in)),
        "reduce_scatter": (lambda: dist.reduce_scatter_tensor(rs_out, rs_in),
                           lambda: conccl.reduce_scatter_tensor(rs_out, rs_in)),
        "all_reduce": (lambda: dist.all_reduce(ar), lambda: conccl.all_reduce(ar)),
    }
    micro = {
        "torch.cuda.is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "Event.record()": torch.cuda.Event().record,
        "dist.group.WORLD": lambda: dist.group.WORLD,
        "conccl get_group(None)": lambda: conccl.api.get_group(None),
    }
    res = {"rank": rank, "world": world, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "commit": os.environ.get("CONCCL_COMMIT"), "cases": {}, "micro_us": {}}
    for name, fn in micro.items():
        for _ in range(100):
            fn()
        t = time.perf_counter()
        for _ in range(10000):
            fn()
        res["micro_us"][name] = round((time.perf_counter() - t) / 10000 * 1e6, 3)
    for name, (nccl, auto) in pairs.items():
        for _ in range(30):
            nccl(), auto()
        path = getattr(auto(), "path", None)
        rec = {"nccl": [], "auto": [], "path": path}
        for _ in range(TURNS):
            rec["nccl"].append(loop(nccl, CALLS))
            rec["auto"].append(loop(auto, CALLS))
        rec["layers"] = layers(auto, CALLS)
        dist.barrier()
        if rank == 0:
            prof = cProfile.Profile()
            prof.enable()
        for _ in range(CALLS):
            auto()
        torch.cuda.synchronize()
        if rank == 0:
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
            rec["cprofile"] = s.getvalue()
        dist.barrier()
        rec["nccl_median_us"] = statistics.median(rec["nccl"])
        rec["auto_median_us"] = statistics.median(rec["auto"])
        rec["ratio"] = round(rec["auto_median_us"] / rec["nccl_median_us"], 3)
        res["cases"][name] = rec
        if rank == 0:
            print(name, "path", path, "nccl", rec["nccl"], "auto", rec["auto"], "ratio", rec["ratio"], flush=True)
            print("   ", {k: v for k, v in rec["layers"].items() if v}, flush=True)
    if rank == 0:
        print("micro", res["micro_us"])
    with open(os.path.join(os.environ.get("OUT", "."), f"auto_host_r{rank}.json"), "w") as f:
        json.dump(res, f, indent=1)
    conccl.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
