"""Probe: one-way signal latency between 2 GPUs, stream memops against the spin-wait kernel.

Rank 0 writes the peer's PING word, rank 1 waits for it and writes rank 0's PONG word, rank 0
waits: a round trip, N per timed run (events on rank 0's stream), RUNS runs after one warm-up,
the median; one way = round trip / 2. Every combination of:

* wait: ``cuStreamWaitValue32`` GEQ (memop) | ``conccl_spin_wait`` polling with __nanosleep(20)
  (spin20, conccl's default) or without (spin0), or with the optional end fence (spin20_fence);
* write: ``cuStreamWriteValue32`` default flags (memop) | ``conccl_signal_write`` (kernel);
* copy: none | a 64 KiB ``cuMemcpyAsync`` from the peer's symmetric buffer before each write;
* mode: eager (every iteration queued behind a GPU-side gate, a memop wait on a local word
  released once all is queued, so host enqueue is not timed) | graph (the N iterations captured
  once and replayed; a graph's values are fixed, so it waits for 1 and writes 0 back into the
  waited word after each wait, one more memop per iteration and side).

Everything runs on one stream per rank at the device's highest priority (the spin kernel must
start beside other work; a memop ignores priority). A handshake round trip before the start
event removes the ranks' skew. Host enqueue cost per driver call is timed too (eager: the
queueing loop; graph: the capture, and the replay's launch). Last, each operation alone, N of
them back to back on the stream, satisfied (no peer): what one costs the stream.

Fails rather than hangs: spin waits are bounded at 10 s (a timed-out word raises), the gate is
released after --gate-s even if queueing has not finished (raises), and the whole run exits
with every thread's stack after --timeout-s (faulthandler).

Run from the repository root on 2 GPUs, either way:
  PYTHONPATH=src torchrun --nproc-per-node 2 benchmarks/2026-11-26-h100x2-latency/probe_signal.py --out DIR
  PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-latency/probe_signal.py --out DIR  (spawns 2 ranks)
Writes DIR/signal.json and DIR/signal.md (rank 0). signal-run1/ beside it: its first run, 2 x H100
(torch 2.11.0+cu130, cuda-bindings 13.3.1, driver 13.0), spawned, from the commit that added it.
"""
import os

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ[_k] = _v  # before torch.distributed is imported: no NVLink multicast

import argparse  # noqa: E402
import faulthandler  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed import _symmetric_memory as symm_mem  # noqa: E402

from conccl._driver import check, driver, signal_flags  # noqa: E402
from conccl.executors.cuda_spin import SignalWriteLaunch, SpinWaitLaunch  # noqa: E402
from conccl.launch import run_per_gpu, under_torchrun  # noqa: E402

PING, PONG, GATE, HS, ABORT, TIMED_OUT, ONE, SCRATCH = range(8)  # words of each rank's pad
COPY_BYTES = 64 << 10
SPIN_TIMEOUT_NS = 10 * 10**9
WAITS = {"memop": None, "spin20": (20, False), "spin0": (0, False), "spin20_fence": (20, True)}  # (sleep ns, end fence)
WRITES = ("memop", "kernel")


def probe(rank, world, args):
    assert world == 2, "the ping-pong takes exactly 2 ranks"
    faulthandler.dump_traceback_later(args.timeout_s, exit=True)
    cu, dev, peer = driver(), torch.cuda.current_device(), 1 - rank
    geq, wflags = signal_flags(cu)
    name = dist.group.WORLD.group_name
    pad = symm_mem.empty(64, dtype=torch.int32, device="cuda")
    pad.zero_()
    torch.cuda.synchronize()
    pad_h = symm_mem.rendezvous(pad, name)
    buf = symm_mem.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    buf_h = symm_mem.rendezvous(buf, name)
    dst = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    pads = list(pad_h.buffer_ptrs)
    least, greatest = check(cu.cuCtxGetStreamPriorityRange())
    stream, gate_stream = torch.cuda.Stream(priority=greatest), torch.cuda.Stream()  # torch clamps to its range
    S, G = cu.CUstream(stream.cuda_stream), cu.CUstream(gate_stream.cuda_stream)

    def own(w):
        return cu.CUdeviceptr(pads[rank] + 4 * w)

    def theirs(w):
        return cu.CUdeviceptr(pads[peer] + 4 * w)

    # Each call: v -> the driver's result tuple, arguments built once (as conccl's programs do).
    def wait(kind, w):
        if WAITS[kind] is None:
            a, f = own(w), cu.cuStreamWaitValue32
            return lambda v: f(S, a, v, geq)
        sleep, fence = WAITS[kind]
        k = SpinWaitLaunch(dev, (int(own(w)),), (0,), int(own(ABORT)), int(own(TIMED_OUT)), SPIN_TIMEOUT_NS,
                           poll_sleep_ns=sleep, end_fence=fence)
        return lambda v: k.launch(cu, S, v)

    def write(kind, addr):
        if kind == "memop":
            f = cu.cuStreamWriteValue32
            return lambda v: f(S, addr, v, wflags)
        k = SignalWriteLaunch(dev, (int(addr),), (0,))
        return lambda v: k.launch(cu, S, v)

    def copy():
        d, s, f = cu.CUdeviceptr(dst.data_ptr()), cu.CUdeviceptr(buf_h.buffer_ptrs[peer]), cu.cuMemcpyAsync
        return lambda v: f(d, s, COPY_BYTES, S)

    def reset(w):
        a, f = own(w), cu.cuStreamWriteValue32
        return lambda v: f(S, a, 0, wflags)

    def queue(calls, values):
        t0 = time.perf_counter()
        for v in values:
            for c in calls:
                r = c(v)
                if r[0]:
                    check(r)
        return time.perf_counter() - t0

    mw, mr = wait("memop", HS), write("memop", theirs(HS))
    handshake = [mr, mw] if rank == 0 else [mw, mr]
    gate = wait("memop", GATE)

    def gated(k, body):
        """Queue gate k, the handshake and body() between timing events; release the gate from a
        thread once queued (or after --gate-s: raises). Returns (GPU ms, body's return)."""
        queued, late = threading.Event(), []

        def release():
            torch.cuda.set_device(dev)  # the thread's driver calls need the context current
            if not queued.wait(args.gate_s):
                late.append(True)
            check(cu.cuStreamWriteValue32(G, own(GATE), k, wflags))

        t = threading.Thread(target=release, daemon=True)
        t.start()
        queue([gate], [k])
        queue(handshake, [k])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        out = body()
        end.record(stream)
        queued.set()
        t.join()
        stream.synchronize()
        if late:
            raise RuntimeError(f"queueing took over {args.gate_s} s: the gate was released early")
        if pad[TIMED_OUT].item() or pad[ABORT].item():
            raise RuntimeError("a spin wait timed out (10 s): the peer never signalled")
        return start.elapsed_time(end), out

    def fresh():
        torch.cuda.synchronize()
        dist.barrier()
        pad.zero_()
        torch.cuda.synchronize()
        dist.barrier()

    rows = []
    for mode in ("eager", "graph"):
        for nbytes in (0, COPY_BYTES):
            for wkind in WAITS:
                for rkind in WRITES:
                    fresh()
                    pre = [copy()] if nbytes else []
                    again = [reset(PONG if rank == 0 else PING)] if mode == "graph" else []
                    if rank == 0:
                        calls = pre + [write(rkind, theirs(PING)), wait(wkind, PONG)] + again
                    else:
                        calls = [wait(wkind, PING)] + again + pre + [write(rkind, theirs(PONG))]
                    row = {"mode": mode, "copy_bytes": nbytes, "wait": wkind, "write": rkind,
                           "calls_per_iteration": len(calls)}
                    if mode == "graph":
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g, stream=stream, capture_error_mode="thread_local"):
                            row["capture_us_per_call"] = queue(calls, [1] * args.n) * 1e6 / (args.n * len(calls))

                        def body(run):
                            t0 = time.perf_counter()
                            with torch.cuda.stream(stream):
                                g.replay()
                            return time.perf_counter() - t0
                    else:
                        def body(run):  # values go on rising from run to run
                            return queue(calls, range(run * args.n + 1, (run + 1) * args.n + 1))
                    ms, host = [], []
                    for run in range(args.runs + 1):  # run 0 warms up
                        gpu_ms, host_s = gated(run + 1, lambda: body(run))
                        dist.barrier()
                        if run:
                            ms.append(gpu_ms)
                            host.append(host_s)
                    rt = [m * 1e3 / args.n for m in ms]  # us per round trip, each run
                    row.update(round_trip_us=statistics.median(rt), one_way_us=statistics.median(rt) / 2,
                               round_trip_runs_us=rt)
                    if mode == "eager":
                        row["enqueue_us_per_call"] = statistics.median(host) * 1e6 / (args.n * len(calls))
                    else:
                        row["replay_launch_us"] = statistics.median(host) * 1e6
                        del g
                    rows.append(row)
                    if rank == 0:
                        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                                          if k != "round_trip_runs_us"}), flush=True)
    fresh()
    pad[ONE] = 1  # a word every wait below finds reached
    torch.cuda.synchronize()
    alone = {}
    ops = {f"wait {k}": wait(k, ONE) for k in WAITS}
    ops.update({f"write {k}": write(k, own(SCRATCH)) for k in WRITES})
    ops["copy 64 KiB"] = copy()
    for name, op in ops.items():
        us = [gated(run + 1, lambda: queue([op], [1] * args.n))[0] * 1e3 / args.n for run in range(args.runs + 1)]
        alone[name] = statistics.median(us[1:])
        dist.barrier()
    if rank == 0:
        print(json.dumps({"alone_us": {k: round(v, 2) for k, v in alone.items()}}), flush=True)
    faulthandler.cancel_dump_traceback_later()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "driver": check(cu.cuDriverGetVersion()), "stream_priority_range": [least, greatest],
            "n": args.n, "runs": args.runs, "spin_timeout_ns": SPIN_TIMEOUT_NS, "date": time.strftime("%Y-%m-%d")}
    return {"meta": meta, "rows": rows, "alone_us": alone}


def markdown(res) -> str:
    m = res["meta"]
    lines = [f"# Signal latency, 2 GPUs ({m['device']}, {m['date']})", "",
             f"torch {m['torch']}, driver {m['driver']}, stream priority {m['stream_priority_range'][1]} "
             f"(range {m['stream_priority_range']}); {m['n']} round trips per run, median of {m['runs']} runs. "
             "One way = round trip / 2. Enqueue: host us per driver call (eager: queueing; graph: capture). "
             "Graph rows add one memop (the waited word reset to 0) per iteration and side.", "",
             "| mode | copy (B) | wait | write | one way (us) | round trip (us) | runs (us) | enqueue (us/call) | calls/iter |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in res["rows"]:
        runs = f"{min(r['round_trip_runs_us']):.2f}-{max(r['round_trip_runs_us']):.2f}"
        enq = r.get("enqueue_us_per_call", r.get("capture_us_per_call"))
        lines.append(f"| {r['mode']} | {r['copy_bytes']} | {r['wait']} | {r['write']} | {r['one_way_us']:.2f} | "
                     f"{r['round_trip_us']:.2f} | {runs} | {enq:.2f} | {r['calls_per_iteration']} |")
    lines += ["", f"Each alone, {m['n']} back to back on the stream, satisfied (us each):", "",
              "| operation | us |", "| --- | --- |"]
    lines += [f"| {k} | {v:.2f} |" for k, v in res["alone_us"].items()]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--n", type=int, default=200, help="round trips per timed run")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--gate-s", type=float, default=20.0, help="release the gate after this long regardless")
    p.add_argument("--timeout-s", type=float, default=600.0, help="the whole run's bound (exits with stacks)")
    args = p.parse_args()
    results = run_per_gpu(probe, args, nprocs=2, timeout_s=args.timeout_s + 60)
    if under_torchrun():
        dist.destroy_process_group()
        if int(os.environ["RANK"]) != 0:
            return
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "signal.json").write_text(json.dumps(results[0], indent=1) + "\n")
    (args.out / "signal.md").write_text(markdown(results[0]))
    print(markdown(results[0]))


if __name__ == "__main__":
    main()
