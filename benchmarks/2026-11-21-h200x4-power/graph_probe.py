"""Can a compiled program become a CUDA graph? A feasibility probe for the small-call path.

One process, GPU 0 pushing 256 KiB to each of GPUs 1..3 (peer access enabled), as a 4-rank
push all-gather of 1 MiB does: a batch of signal ops, one ``cuMemcpyBatchAsync`` of the peer
copies, another batch of signal ops. The probe:

1. times that sequence queued eagerly (3 driver calls), host us per call;
2. captures it into a graph and times ``cuGraphLaunch`` alone;
3. times ``cuGraphExecBatchMemOpNodeSetParams`` (what patching a sequence number would cost);
4. lists the GPU activities the profiler sees during graph launches: peer memcpy nodes must
   stay copies (no kernel), or the graph path is ruled out;
5. checks the graph moved the bytes.

Run on a GPU machine with >= 2 GPUs: ``PYTHONPATH=src python3 benchmarks/2026-11-21-h200x4-power/graph_probe.py [--json F]``.
"""
import argparse
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from conccl._driver import check, driver, signal_flags
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from host_floor import per_call_us  # noqa: E402  (scripts/host_floor.py: the same call count)

CHUNK = 1 << 18
N = 5000  # calls per ungated figure


def gated_us(fn, cu, cs, gate_word: int, n=40) -> float:
    """Host us per call of ``fn`` while the stream is held by a wait on ``gate_word``, so the
    GPU cannot push back on the host; the gate is then opened from another stream. Few calls:
    with the stream held, a few hundred fill its queue and the host would block for good."""
    torch.cuda.synchronize()
    check(cu.cuStreamWaitValue32(cs, cu.CUdeviceptr(gate_word), 1, signal_flags(cu)[0]))
    t = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t) / n * 1e6
    side = torch.cuda.Stream()
    check(cu.cuStreamWriteValue32(cu.CUstream(side.cuda_stream), cu.CUdeviceptr(gate_word), 1, 0))
    torch.cuda.synchronize()
    check(cu.cuStreamWriteValue32(cu.CUstream(side.cuda_stream), cu.CUdeviceptr(gate_word), 0, 0))
    torch.cuda.synchronize()
    return us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    cu = driver()
    peers = list(range(1, min(4, torch.cuda.device_count())))
    torch.cuda.set_device(0)
    src = torch.randint(0, 255, (CHUNK,), dtype=torch.uint8, device="cuda:0")
    dsts = [torch.zeros(CHUNK, dtype=torch.uint8, device=f"cuda:{p}") for p in peers]
    for p in peers:  # let GPU 0's context reach each peer's memory
        ctx = check(cu.cuDevicePrimaryCtxRetain(cu.CUdevice(p)))
        err = cu.cuCtxEnablePeerAccess(ctx, 0)[0]
        assert err in (cu.CUresult.CUDA_SUCCESS, cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED), err
    words = torch.zeros(64, dtype=torch.int32, device="cuda:0")
    stream = torch.cuda.Stream()
    cs = cu.CUstream(stream.cuda_stream)
    geq, fenced = signal_flags(cu)

    def memops(n, base):
        params = []
        for i in range(n):
            p = cu.CUstreamBatchMemOpParams()
            is_wait = i >= n // 2
            p.operation = (cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32 if is_wait
                           else cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32)
            sub = p.waitValue if is_wait else p.writeValue
            sub.operation = p.operation
            # writes of 0 into words 32.., waits "word >= 0" on words that stay 0
            sub.address = cu.CUdeviceptr(words.data_ptr() + 4 * (base + i if is_wait else 32 + base + i))
            sub.flags = geq if is_wait else fenced
            sub.value = 0
            params.append(p)
        return params

    pre, post = memops(6, 0), memops(6, 8)
    attrs = cu.CUmemcpyAttributes()
    attrs.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    copy_args = ([cu.CUdeviceptr(d.data_ptr()) for d in dsts], [cu.CUdeviceptr(src.data_ptr())] * len(dsts),
                 [CHUNK] * len(dsts), len(dsts), [attrs], [0], 1)

    def eager():
        check(cu.cuStreamBatchMemOp(cs, len(pre), pre, 0))
        check(cu.cuMemcpyBatchAsync(*copy_args, cs))
        check(cu.cuStreamBatchMemOp(cs, len(post), post, 0))

    out = {"peers": peers}
    gate = words.data_ptr() + 4 * 60
    out["eager_3_calls_us"] = per_call_us(eager, N)
    out["eager_3_calls_gated_us"] = gated_us(eager, cu, cs, gate)
    ok_eager = all(torch.equal(d.cpu(), src.cpu()) for d in dsts)
    for d in dsts:
        d.zero_()
    torch.cuda.synchronize()

    def captured_calls():  # what a graph can hold: cuMemcpyBatchAsync may not be capturable
        check(cu.cuStreamBatchMemOp(cs, len(pre), pre, 0))
        if out["batch_capturable"]:
            check(cu.cuMemcpyBatchAsync(*copy_args, cs))
        else:
            for d in dsts:
                check(cu.cuMemcpyAsync(cu.CUdeviceptr(d.data_ptr()), cu.CUdeviceptr(src.data_ptr()), CHUNK, cs))
        check(cu.cuStreamBatchMemOp(cs, len(post), post, 0))

    out["batch_capturable"] = True
    graph = None
    for attempt in (0, 1):
        check(cu.cuStreamBeginCapture(cs, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
        ok = True
        try:
            captured_calls()
        except RuntimeError as e:
            out["batch_capture_error"] = str(e)
            out["batch_capturable"] = ok = False
        finally:
            res = cu.cuStreamEndCapture(cs)
        if ok:
            graph = check(res)
            break
    assert graph is not None
    exec_ = check(cu.cuGraphInstantiate(graph, 0))
    nodes, count = check(cu.cuGraphGetNodes(graph, 64))
    nodes = list(nodes)[:count]
    kinds = [str(check(cu.cuGraphNodeGetType(n))).split(".")[-1] for n in nodes]
    out["graph_nodes"] = kinds
    out["graph_launch_us"] = per_call_us(lambda: check(cu.cuGraphLaunch(exec_, cs)), N)
    out["graph_launch_gated_us"] = gated_us(lambda: check(cu.cuGraphLaunch(exec_, cs)), cu, cs, gate)
    torch.cuda.synchronize()
    out["graph_moved_bytes_right"] = all(torch.equal(d.cpu(), src.cpu()) for d in dsts)
    out["eager_moved_bytes_right"] = ok_eager

    memop_nodes = [n for n, k in zip(nodes, kinds) if "BATCH_MEM_OP" in k]
    if memop_nodes:
        node = memop_nodes[0]
        params = check(cu.cuGraphBatchMemOpNodeGetParams(node))

        def patch():
            check(cu.cuGraphExecBatchMemOpNodeSetParams(exec_, node, params))

        out["exec_memop_set_params_us"] = per_call_us(patch, N)
        out["set_params_plus_launch_us"] = per_call_us(lambda: (patch(), patch(), check(cu.cuGraphLaunch(exec_, cs))), N)
        out["set_params_x2_plus_launch_gated_us"] = gated_us(
            lambda: (patch(), patch(), check(cu.cuGraphLaunch(exec_, cs))), cu, cs, gate)

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            check(cu.cuGraphLaunch(exec_, cs))
        torch.cuda.synchronize()
    names = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name] = names.get(e.name, 0) + 1
    out["gpu_activities_during_20_launches"] = names
    print(json.dumps(out, indent=1, default=str))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
