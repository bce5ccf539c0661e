"""Host time of one driver call by each route a settled conccl call could take (issue 38 item 4).

One GPU, no peers: every call is queued on a side stream, the host's wall clock per call is
what is measured (median of ``--repeats`` runs of ``--calls`` calls; the stream is synchronised
every 64 calls so a full queue is not timed). Routes:

* cuda-python (``cuda.bindings.driver``), as :mod:`conccl.executors.cuda_program` calls it today;
* the same driver functions through ctypes with argument arrays built once
  (``driver_calls_ctypes.py`` beside this script), where the call patches a value in place;
* PyTorch's event record / stream wait and a CUDA graph's replay.

Every ctypes route is checked to do what it should (the written words, the copied bytes).

    PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session7/driver_call_probe.py [--calls 2000] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import statistics
import time

import torch


def per_call_us(fn, calls: int, repeats: int, stream) -> tuple[float, list[float]]:
    out = []
    for _ in range(repeats):
        stream.synchronize()
        t = time.perf_counter()
        for i in range(calls):
            fn(i)
            if i % 64 == 63:
                stream.synchronize()
        out.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(out), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    from cuda.bindings import driver as cu

    from conccl._driver import signal_flags

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import driver_calls_ctypes as fc  # the ctypes route tried in this session (not shipped: no faster)

    torch.cuda.set_device(0)
    torch.cuda.init()
    stream = torch.cuda.Stream()
    handle = stream.cuda_stream
    cu_stream = cu.CUstream(handle)
    words = torch.zeros(64, dtype=torch.int32, device="cuda")
    base = words.data_ptr()
    src = torch.arange(4096, dtype=torch.uint8, device="cuda").repeat(2)
    dst = torch.zeros_like(src)
    geq, fenced = signal_flags(cu)
    results = {}

    # --- cuStreamBatchMemOp: a satisfied wait (word 0 >= 0) and a write of the call's value into word 1
    wait_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32
    write_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32
    params, subs = [], []
    for op, addr, flags in ((wait_op, base, geq), (write_op, base + 4, fenced)):
        p = cu.CUstreamBatchMemOpParams()
        p.operation = op
        sub = p.waitValue if op == wait_op else p.writeValue
        sub.operation, sub.address, sub.flags, sub.value = op, cu.CUdeviceptr(addr), flags, 0
        params.append(p)
        subs.append(sub)

    def cp_batch(i):
        subs[1].value = i & 0xFFFF
        err = cu.cuStreamBatchMemOp(cu_stream, 2, params, 0)
        assert not err[0], err

    results["memop batch (2 ops), cuda-python"] = per_call_us(cp_batch, a.calls, a.repeats, stream)
    fc.check_value_offset(cu)
    fast = fc.SignalBatchFast(cu, params, [(1, 0)])  # the wait's value stays 0: satisfied

    def ct_batch(i):
        err = fast.launch(handle, i & 0xFFFF)
        assert not err, err

    results["memop batch (2 ops), ctypes"] = per_call_us(ct_batch, a.calls, a.repeats, stream)
    fast.launch(handle, 0x1234)
    stream.synchronize()
    assert int(words[1]) == 0x1234, f"ctypes batch wrote {int(words[1]):#x}"

    # --- cuStreamWriteValue32 alone
    def cp_write(i):
        err = cu.cuStreamWriteValue32(cu_stream, cu.CUdeviceptr(base + 8), i & 0xFFFF, fenced)
        assert not err[0]

    results["write value, cuda-python (pointer object per call)"] = per_call_us(cp_write, a.calls, a.repeats, stream)

    # --- cuMemcpyBatchAsync of two 4 KiB copies
    attrs = cu.CUmemcpyAttributes()
    attrs.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    dsts = [cu.CUdeviceptr(dst.data_ptr()), cu.CUdeviceptr(dst.data_ptr() + 4096)]
    srcs = [cu.CUdeviceptr(src.data_ptr()), cu.CUdeviceptr(src.data_ptr() + 4096)]
    cp_args = (dsts, srcs, [4096, 4096], 2, [attrs], [0], 1)

    def cp_copies(i):
        err = cu.cuMemcpyBatchAsync(*cp_args, cu_stream)
        assert not err[0], err

    results["copy batch (2 x 4K), cuda-python"] = per_call_us(cp_copies, a.calls, a.repeats, stream)
    dst.zero_()
    fast_copies = fc.CopyBatchFast(cu, [(dst.data_ptr(), src.data_ptr(), 4096),
                                        (dst.data_ptr() + 4096, src.data_ptr() + 4096, 4096)])

    def ct_copies(i):
        err = fast_copies.launch(handle)
        assert not err, err

    results["copy batch (2 x 4K), ctypes"] = per_call_us(ct_copies, a.calls, a.repeats, stream)
    stream.synchronize()
    assert torch.equal(dst, src), "ctypes copy batch did not copy"

    # --- cuMemcpyAsync
    d1, s1 = cu.CUdeviceptr(dst.data_ptr()), cu.CUdeviceptr(src.data_ptr())

    def cp_copy(i):
        err = cu.cuMemcpyAsync(d1, s1, 4096, cu_stream)
        assert not err[0]

    results["copy (4K), cuda-python"] = per_call_us(cp_copy, a.calls, a.repeats, stream)
    fast_copy = fc.CopyFast(dst.data_ptr(), src.data_ptr(), 4096)

    def ct_copy(i):
        err = fast_copy.launch(handle)
        assert not err

    results["copy (4K), ctypes"] = per_call_us(ct_copy, a.calls, a.repeats, stream)

    # --- PyTorch's event record and wait, and a graph replay
    ev = torch.cuda.Event()
    other = torch.cuda.Stream()
    results["event record (torch)"] = per_call_us(lambda i: ev.record(stream), a.calls, a.repeats, stream)
    results["event record + wait (torch)"] = per_call_us(lambda i: (ev.record(stream), other.wait_event(ev)),
                                                         a.calls, a.repeats, stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        g.capture_begin()
        dst.copy_(src)
        g.capture_end()
    with torch.cuda.stream(stream):
        results["graph replay (torch)"] = per_call_us(lambda i: g.replay(), a.calls, a.repeats, stream)
    rows = [{"route": k, "median_us": v[0], "runs_us": v[1]} for k, v in results.items()]
    for r in rows:
        print(f"{r['route']:55s} {r['median_us']:7.2f} us  ({min(r['runs_us']):.2f}-{max(r['runs_us']):.2f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
