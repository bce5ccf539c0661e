"""The host cost of each building block of a conccl call, one GPU, no peers.

Times (wall clock, mean of many calls, us) what a small call is made of: torch's event and
stream calls, and the cuda-python driver calls a compiled program makes (a stream memory op
batch, a memcpy batch, a single memcpy), with arguments prebuilt as ``CompiledProgram`` does.
The sum is the floor a Python launch path cannot go below. Run on a GPU machine:
``PYTHONPATH=src python3 scripts/host_floor.py [--json FILE]``.
"""
import argparse
import ctypes
import json
import time

import torch

from conccl.device.driver import driver, signal_flags

N = 20000


def per_call_us(fn, n=N) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    cu = driver()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    stream = torch.cuda.Stream(dev)
    side = torch.cuda.Stream(dev)
    cs = cu.CUstream(stream.cuda_stream)
    words = torch.zeros(64, dtype=torch.int32, device=dev)
    a = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
    b = torch.empty(4 << 20, dtype=torch.uint8, device=dev)
    geq, fenced = signal_flags(cu)
    ev = torch.cuda.Event()
    ev.record(stream)

    def batch_params(n):
        wait_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32
        write_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32
        params, subs = [], []
        for i in range(n):
            p = cu.CUstreamBatchMemOpParams()
            is_wait = i % 2 == 0
            p.operation = wait_op if is_wait else write_op
            sub = p.waitValue if is_wait else p.writeValue
            sub.operation = p.operation
            # waits on words that stay 0 (GEQ 0 holds), writes of 0 into others
            sub.address = cu.CUdeviceptr(words.data_ptr() + 4 * (i if is_wait else 32 + i))
            sub.flags = geq if is_wait else fenced
            params.append(p)
            subs.append(sub)
        return params, subs

    p2, s2 = batch_params(2)
    p6, s6 = batch_params(6)
    attrs = cu.CUmemcpyAttributes()
    attrs.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    chunk = 1 << 18
    dsts = [cu.CUdeviceptr(b.data_ptr() + i * (1 << 20)) for i in range(3)]
    srcs = [cu.CUdeviceptr(a.data_ptr() + i * chunk) for i in range(3)]
    copy_args = (dsts, srcs, [chunk] * 3, 3, [attrs], [0], 1)
    d0, s0 = cu.CUdeviceptr(b.data_ptr()), cu.CUdeviceptr(a.data_ptr())

    def mem_batch(params, subs):
        def f():
            for s in subs:
                s.value = 0
            cu.cuStreamBatchMemOp(cs, len(params), params, 0)
        return f

    # The same calls through ctypes, with every argument marshalled once: what cuda-python's
    # per-call argument conversion costs on top of the driver itself.
    ver = cu.cuDriverGetVersion()[1]

    def proc(name, *argtypes):
        err, pfn, _ = cu.cuGetProcAddress(name.encode(), ver, cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT)
        assert not err and int(pfn), (name, err)
        return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(int(pfn))

    vp, sz, ui = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint
    c_batch = proc("cuMemcpyBatchAsync", vp, vp, vp, sz, vp, vp, sz, vp)
    c_memops = proc("cuStreamBatchMemOp", vp, ui, vp, ui)
    c_copy = proc("cuMemcpyAsync", ctypes.c_uint64, ctypes.c_uint64, sz, vp)
    c_dsts = (ctypes.c_uint64 * 3)(*[int(d) for d in dsts])
    c_srcs = (ctypes.c_uint64 * 3)(*[int(x) for x in srcs])
    c_sizes = (sz * 3)(*([chunk] * 3))
    c_idx = (sz * 1)(0)
    attrs_ptr, stream_ptr = attrs.getPtr(), stream.cuda_stream
    c_args = (ctypes.addressof(c_dsts), ctypes.addressof(c_srcs), ctypes.addressof(c_sizes), 3, attrs_ptr,
              ctypes.addressof(c_idx), 1, stream_ptr)
    PARAM = 48  # sizeof(CUstreamBatchMemOpParams); the 32-bit value sits at byte 16
    buf6 = ctypes.create_string_buffer(PARAM * 6)
    for i, prm in enumerate(p6):
        ctypes.memmove(ctypes.addressof(buf6) + PARAM * i, prm.getPtr(), PARAM)
    vals6 = [ctypes.c_uint32.from_buffer(buf6, PARAM * i + 16) for i in range(6)]
    buf6_ptr = ctypes.addressof(buf6)

    def c_mem6():
        for v in vals6:
            v.value = 0
        return c_memops(stream_ptr, 6, buf6_ptr, 0)

    rc = (c_batch(*c_args), c_mem6(), c_copy(int(d0), int(s0), chunk, stream_ptr))
    torch.cuda.synchronize()
    assert rc == (0, 0, 0), rc

    rows = {
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(dev),
        "Event.record(stream)": lambda: ev.record(stream),
        "Stream.wait_event(event)": lambda: side.wait_event(ev),
        "Event.query()": lambda: ev.query(),
        "torch.cuda.Event() (new, unrecorded)": lambda: torch.cuda.Event(),
        "cuStreamBatchMemOp, 2 ops (values patched)": mem_batch(p2, s2),
        "cuStreamBatchMemOp, 6 ops (values patched)": mem_batch(p6, s6),
        "cuStreamWriteValue32": lambda: cu.cuStreamWriteValue32(cs, d0, 0, fenced),
        "cuMemcpyAsync 256 KiB": lambda: cu.cuMemcpyAsync(d0, s0, chunk, cs),
        "cuMemcpyBatchAsync, 3 x 256 KiB": lambda: cu.cuMemcpyBatchAsync(*copy_args, cs),
        "ctypes cuStreamBatchMemOp, 6 ops (values patched)": c_mem6,
        "ctypes cuMemcpyAsync 256 KiB": lambda: c_copy(int(d0), int(s0), chunk, stream_ptr),
        "ctypes cuMemcpyBatchAsync, 3 x 256 KiB": lambda: c_batch(*c_args),
        "Tensor.data_ptr()": lambda: a.data_ptr(),
        "Tensor.untyped_storage().data_ptr()": lambda: a.untyped_storage().data_ptr(),
    }
    out = {}
    for name, fn in rows.items():
        n = N if "Memcpy" not in name else N // 4
        out[name] = per_call_us(fn, n)
        print(f"{out[name]:8.2f} us  {name}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "us_per_call": out}, f,
                      indent=1)


if __name__ == "__main__":
    main()
