"""GPU tier: the compiled programs' ctypes driver calls (conccl.executors.cuda_fastcall) on one
GPU: found on this driver, a batch of stream memory operations waits and writes the values it
is given per call, a copy batch and a copy move their bytes in stream order, a failed call
returns the driver's error, and a captured call replays; and an executor's program takes this
route (its compiled calls hold a fast call).

Runs once, in one process (conccl.launch.run_per_gpu with nprocs=1; the tier still skips below
2 GPUs: conftest.py); every wait is satisfied before it is queued, so nothing can hang.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _cases(rank, world):
    from conccl._driver import driver, signal_flags
    from conccl.executors import cuda_fastcall as fc

    cu = driver()
    out = {"available": fc.available()}
    if not out["available"]:
        return out
    fc.check_value_offset(cu)
    stream = torch.cuda.Stream()
    handle = stream.cuda_stream
    words = torch.zeros(8, dtype=torch.int32, device="cuda")
    base = words.data_ptr()
    geq, fenced = signal_flags(cu)
    wait_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32
    write_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32

    def param(op, addr, flags):
        p = cu.CUstreamBatchMemOpParams()
        p.operation = op
        sub = p.waitValue if op == wait_op else p.writeValue
        sub.operation, sub.address, sub.flags, sub.value = op, cu.CUdeviceptr(addr), flags, 0
        return p

    # word 0 holds 40: the wait for seq is satisfied; the writes put seq + 1 and seq + 2 in words 1, 2
    words[0] = 40
    batch = fc.SignalBatchFast(cu, [param(wait_op, base, geq), param(write_op, base + 4, fenced),
                                    param(write_op, base + 8, fenced)], [(0, 0), (1, 1), (2, 2)])
    errors = [batch.launch(handle, 39), batch.launch(handle, 40)]
    stream.synchronize()
    out["batch"] = {"errors": errors, "words": words[:3].tolist()}

    src = torch.arange(1 << 16, dtype=torch.int32, device="cuda")
    dst = torch.zeros_like(src)
    half = src.numel() * 2
    with torch.cuda.stream(stream):
        src.add_(1)  # queued before the copies: stream order means they copy the new values
    copies = fc.CopyBatchFast(cu, [(dst.data_ptr(), src.data_ptr(), half), (dst.data_ptr() + half,
                                                                            src.data_ptr() + half, half)])
    one = fc.CopyFast(dst.data_ptr(), src.data_ptr(), 4)
    errors = [copies.launch(handle)]
    with torch.cuda.stream(stream):
        src[0] = -5
    errors.append(one.launch(handle))
    stream.synchronize()
    expected = torch.arange(1, (1 << 16) + 1, dtype=torch.int32, device="cuda")
    expected[0] = -5
    out["copies"] = {"errors": errors, "equal": bool(torch.equal(dst, expected))}
    # captured: a graph of the batch replays with the value it was captured with
    g = torch.cuda.CUDAGraph()
    words[1] = 0
    with torch.cuda.graph(g, stream=stream):
        err = batch.launch(torch.cuda.current_stream().cuda_stream, 10)
    g.replay()
    torch.cuda.synchronize()
    out["graph"] = {"error": err, "word": int(words[1])}

    # an executor-style program compiled now takes the ctypes route
    from conccl.executors import cuda_program
    from conccl.executors.cuda_program import CopyBatch, CopyStep, SignalBatch, SignalStep

    program = cuda_program.CompiledProgram(((SignalBatch((SignalStep(False, base + 12, 0),)),
                                             CopyBatch((CopyStep(dst.data_ptr(), src.data_ptr(), 8),)),),), cu)
    out["program_fast"] = [type(c.fast).__name__ for c in program.slots[0]]
    program.launch_slot(0, cu.CUstream(handle), 77, handle=handle)
    stream.synchronize()
    out["program_word"] = int(words[3])
    # last: a null destination, refused by the driver at the call
    out["bad_copy"] = fc.CopyFast(0, src.data_ptr(), 4).launch(handle)
    return out


@pytest.fixture(scope="module")
def results():
    from conccl.launch import run_per_gpu

    return run_per_gpu(_cases, nprocs=1, timeout_s=300)[0]


def test_the_route_is_found_on_this_driver(results):
    assert results["available"], "libcuda's cuGetProcAddress did not give the functions"


def test_a_batch_waits_and_writes_each_calls_values(results):
    assert results["batch"] == {"errors": [0, 0], "words": [40, 41, 42]}


def test_copies_move_their_bytes_in_stream_order(results):
    assert results["copies"] == {"errors": [0, 0], "equal": True}


def test_a_failed_call_returns_the_drivers_error(results):
    assert results["bad_copy"] != 0


def test_a_captured_batch_replays_its_value(results):
    assert results["graph"] == {"error": 0, "word": 11}


def test_a_compiled_program_takes_the_route(results):
    assert results["program_fast"] == ["SignalBatchFast", "CopyBatchFast"]
    assert results["program_word"] == 77
