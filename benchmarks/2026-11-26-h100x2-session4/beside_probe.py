"""Which same-GPU copy and which sum get through while GEMMs hold the SMs (one GPU).

Issue 38 item 6: a collective's own-shard copy (a same-GPU copy) and a reduce-scatter's sum
are SM work queued behind a running GEMM's blocks. Here each candidate runs on a side stream,
queued by the host while the first of four bf16 8192^3 GEMMs on another stream runs, and its
time from its start event to its end event is compared with the same op alone.

Candidates: ``Tensor.copy_``, ``cuMemcpyAsync``, ``cuMemcpyBatchAsync`` (default flags and
PREFER_OVERLAP_WITH_COMPUTE), a graph holding one memcpy node (``cuGraphAddMemcpyNode``, its
addresses set per launch with ``cuGraphExecMemcpyNodeSetParams``), and conccl's reduction
kernel and ``torch.add`` on a normal- and a highest-priority stream. Also the host cost of each
launch, and what the profiler calls each copy (a kernel or a copy-engine record).

    PYTHONPATH=src python benchmarks/2026-11-26-h100x2-session4/beside_probe.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from conccl._driver import check, driver
from conccl.executors.cuda_reduce import ReduceLaunch


def graph_copy(cu, ctx, dst, src, n):
    """A one-node graph copying ``n`` bytes; returns (exec, node, params, set(dst, src))."""
    p = cu.CUDA_MEMCPY3D()
    p.srcMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcDevice, p.dstDevice = cu.CUdeviceptr(src), cu.CUdeviceptr(dst)
    p.WidthInBytes, p.Height, p.Depth = n, 1, 1
    graph = check(cu.cuGraphCreate(0))
    node = check(cu.cuGraphAddMemcpyNode(graph, None, 0, p, ctx))
    exe = check(cu.cuGraphInstantiate(graph, 0))
    return exe, node, p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="65536,1048576,16777216")
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cu = driver()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    ctx = check(cu.cuCtxGetCurrent())
    A = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    B = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    C = torch.empty_like(A)
    gemm_stream = torch.cuda.Stream(dev)
    normal = torch.cuda.Stream(dev)
    lo, hi = torch.cuda.Stream.priority_range() if hasattr(torch.cuda.Stream, "priority_range") else (0, -1)
    high = torch.cuda.Stream(dev, priority=min(lo, hi))
    sizes = [int(s) for s in args.sizes.split(",")]
    rows, hosts, names = [], {}, {}

    for n in sizes:
        src = torch.randn(n // 2, device=dev, dtype=torch.bfloat16)
        src2 = torch.randn(n // 2, device=dev, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        attrs = cu.CUmemcpyAttributes()
        attrs.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        attrs_ov = cu.CUmemcpyAttributes()
        attrs_ov.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        attrs_ov.flags = cu.CUmemcpyFlags.CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
        exe, node, gp = graph_copy(cu, ctx, dst.data_ptr(), src.data_ptr(), n)
        red = ReduceLaunch(0, dst.data_ptr(), (src.data_ptr(), src2.data_ptr()), n // 2 * 2, "bfloat16", 1.0)
        d, s_ = cu.CUdeviceptr(dst.data_ptr()), cu.CUdeviceptr(src.data_ptr())

        def cs(st):
            return cu.CUstream(st.cuda_stream)

        def graph_launch(st):
            gp.dstDevice, gp.srcDevice = d, s_  # what a call with new buffers would do
            check(cu.cuGraphExecMemcpyNodeSetParams(exe, node, gp, ctx))
            check(cu.cuGraphLaunch(exe, cs(st)))

        ops = {
            "copy_": (normal, lambda st: dst.copy_(src)),
            "cuMemcpyAsync": (normal, lambda st: check(cu.cuMemcpyAsync(d, s_, n, cs(st)))),
            "batch": (normal, lambda st: check(cu.cuMemcpyBatchAsync([d], [s_], [n], 1, [attrs], [0], 1, cs(st)))),
            "batch_overlap": (normal, lambda st: check(cu.cuMemcpyBatchAsync([d], [s_], [n], 1, [attrs_ov], [0], 1,
                                                                             cs(st)))),
            "graph_memcpy": (normal, graph_launch),
            "reduce": (normal, lambda st: check(red.launch(cu, cs(st)))),
            "reduce_high": (high, lambda st: check(red.launch(cu, cs(st)))),
            "add": (normal, lambda st: torch.add(src, src2, out=dst)),
            "add_high": (high, lambda st: torch.add(src, src2, out=dst)),
        }
        for name, (st, op) in ops.items():
            # host cost of a launch
            torch.cuda.synchronize()
            with torch.cuda.stream(st):
                t0 = time.perf_counter()
                for _ in range(200):
                    op(st)
                hosts[f"{name}@{n}"] = (time.perf_counter() - t0) / 200 * 1e6
            torch.cuda.synchronize()
            alone, beside, gemm_beside = [], [], []
            for r in range(args.runs):
                for with_gemm in (False, True):
                    torch.cuda.synchronize()
                    with torch.cuda.stream(gemm_stream):
                        g0 = torch.cuda.Event(enable_timing=True)
                        g0.record(gemm_stream)
                        if with_gemm:
                            for _ in range(4):
                                torch.mm(A, B, out=C)
                        g1 = torch.cuda.Event(enable_timing=True)
                        g1.record(gemm_stream)
                    # Queued while the first GEMM holds the SMs (each takes over 1 ms): released
                    # together, the op and the GEMM race for the SMs and either may win.
                    time.sleep(0.0004)
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    with torch.cuda.stream(st):
                        e0.record(st)
                        op(st)
                        e1.record(st)
                    torch.cuda.synchronize()
                    (beside if with_gemm else alone).append(e0.elapsed_time(e1) * 1e3)
                    if with_gemm:
                        gemm_beside.append(g0.elapsed_time(g1))
            row = {"op": name, "bytes": n, "alone_us": statistics.median(alone), "beside_gemm_us": statistics.median(beside),
                   "beside_min_us": min(beside), "beside_max_us": max(beside), "gemms_ms": statistics.median(gemm_beside),
                   "host_us": hosts[f"{name}@{n}"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
        # what the profiler calls each copy
        from torch.profiler import ProfilerActivity, profile
        for name in ("copy_", "cuMemcpyAsync", "batch", "batch_overlap", "graph_memcpy"):
            st, op = ops[name]
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                with torch.cuda.stream(st):
                    op(st)
                torch.cuda.synchronize()
            names[f"{name}@{n}"] = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
            print(name, n, names[f"{name}@{n}"], flush=True)
    gemm = torch.cuda.get_device_name(0)
    json.dump({"device": gemm, "torch": torch.__version__, "rows": rows, "profiler_names": names},
              open(os.path.join(args.out, "beside_probe.json"), "w"), indent=1)
    with open(os.path.join(args.out, "beside_probe.md"), "w") as f:
        f.write(f"# beside_probe on {gemm}, torch {torch.__version__}\n\n| op | bytes | alone us | beside 4 GEMMs us "
                "(min-max) | GEMMs ms | host us |\n| --- | ---: | ---: | --- | ---: | ---: |\n")
        for r in rows:
            f.write(f"| {r['op']} | {r['bytes']} | {r['alone_us']:.1f} | {r['beside_gemm_us']:.1f} ({r['beside_min_us']:.1f}-"
                    f"{r['beside_max_us']:.1f}) | {r['gemms_ms']:.2f} | {r['host_us']:.1f} |\n")
        f.write("\nProfiler names:\n\n")
        for k, v in names.items():
            f.write(f"- {k}: {v}\n")


if __name__ == "__main__":
    main()
