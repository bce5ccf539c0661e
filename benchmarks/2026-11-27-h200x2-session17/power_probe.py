"""Do copy-engine copies slow GEMMs that do not overlap them (issue 40's last 3-5%)?

Session 16's traces of FSDP2 mixed precision (trace_gemms.txt) found every GEMM and attention
kernel 4-8% slower under conccl than with no communication, those with no copy beside them too
(1.042-1.053). Candidates: the SM clock (both configs draw the GPU's 700 W cap in the GEMMs; the
copies' HBM and NVLink power would lower it for the GEMMs after them too), or something in the
FSDP step itself. This takes FSDP out: one process drives both GPUs, each runs a chain of the
model's largest GEMM (8192x4096 @ 4096x14336 bf16) on its compute stream, and in the copy
modes moves a block every few GEMMs on a side stream with the driver's copy (a copy engine, no
SM): ``pull`` the peer's block onto itself, ``push`` its own onto the peer, ``local`` within the
GPU (no NVLink). Every GEMM and copy is timed with
CUDA events; a GEMM is "beside a copy" where their intervals meet. Modes alternate; nvidia-smi
samples the SM clock, power and the clock-event reasons every 20 ms.

  python3 power_probe.py --out DIR [--gemms 1200] [--every 10] [--copy-mib 384]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

from conccl._driver import check, driver


def run_mode(mode, a, b, c, src, dst, gemms, every, streams):
    """One timed chain per device: events per GEMM and per copy, on both GPUs at once."""
    cu = driver()
    n = len(a)
    g_ev = [[] for _ in range(n)]
    c_ev = [[] for _ in range(n)]
    base = []
    for d in range(n):
        torch.cuda.set_device(d)
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        base.append(e)
    for i in range(gemms):
        for d in range(n):
            torch.cuda.set_device(d)
            if mode != "alone" and i % every == 0:
                cs = streams[d]
                cs.wait_stream(torch.cuda.current_stream(d))  # start beside this GEMM, not before
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record(cs)
                # the driver's copy on this GPU's side stream (Tensor.copy_ between GPUs would run
                # it on the source GPU's current stream and make both current streams wait for it):
                # pull the peer's block here, push ours there, or copy within this GPU (no NVLink)
                peer = (d + 1) % n
                to, frm = {"pull": (dst[d], src[peer]), "push": (dst[peer], src[d]), "local": (dst[d], src[d])}[mode]
                check(cu.cuMemcpyAsync(to.data_ptr(), frm.data_ptr(), frm.numel() * frm.element_size(),
                                       cu.CUstream(cs.cuda_stream)))
                e.record(cs)
                c_ev[d].append((s, e))
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.matmul(a[d], b[d], out=c[d])
            e.record()
            g_ev[d].append((s, e))
    for d in range(n):
        torch.cuda.synchronize(d)
    out = []
    for d in range(n):
        gem = [(base[d].elapsed_time(s), base[d].elapsed_time(e)) for s, e in g_ev[d]]
        cop = [(base[d].elapsed_time(s), base[d].elapsed_time(e)) for s, e in c_ev[d]]
        out.append({"gemms": gem, "copies": cop})
    return out


def summarize(rec, copy_bytes):
    gem, cop = rec["gemms"], rec["copies"]
    dur = [e - s for s, e in gem]
    beside, apart, after = [], [], []
    for (s, e), t in zip(gem, dur):
        if any(cs < e and s < ce for cs, ce in cop):
            beside.append(t)
        else:
            apart.append(t)
            # a GEMM that starts within 2 ms after a copy ended: the clock's lag, if any
            if any(0 <= s - ce < 2.0 for _, ce in cop):
                after.append(t)
    span = gem[-1][1] - gem[0][0]
    res = {"gemms": len(dur), "median_ms": statistics.median(dur), "span_ms": span,
           "first_100_median_ms": statistics.median(dur[:100]), "last_100_median_ms": statistics.median(dur[-100:])}
    if cop:
        cd = [e - s for s, e in cop]
        res.update(beside=len(beside), beside_median_ms=statistics.median(beside) if beside else None,
                   apart=len(apart), apart_median_ms=statistics.median(apart) if apart else None,
                   after_copy=len(after), after_copy_median_ms=statistics.median(after) if after else None,
                   copies=len(cd), copy_median_ms=statistics.median(cd),
                   copy_gbps=copy_bytes / statistics.median(cd) / 1e6,
                   copy_duty=sum(cd) / span)
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--gemms", type=int, default=1200)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--copy-mib", type=int, default=384)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--modes", default="alone,pull", help="alone (no copies), pull, push, local")
    args = p.parse_args()
    n = torch.cuda.device_count()
    assert n >= 2, "needs two GPUs"
    n = 2
    a, b, c, src, dst, streams = [], [], [], [], [], []
    elems = args.copy_mib * 2**20 // 2
    for d in range(n):
        torch.cuda.set_device(d)
        g = torch.Generator(device=f"cuda:{d}").manual_seed(d)
        a.append(torch.randn(8192, 4096, device=d, dtype=torch.bfloat16, generator=g))
        b.append(torch.randn(4096, 14336, device=d, dtype=torch.bfloat16, generator=g))
        c.append(torch.empty(8192, 14336, device=d, dtype=torch.bfloat16))
        src.append(torch.randn(elems, device=d, dtype=torch.bfloat16, generator=g))
        dst.append(torch.empty(elems, device=d, dtype=torch.bfloat16))
        streams.append(torch.cuda.Stream(device=d))
    for d in range(n):  # peer access and cuBLAS warm
        torch.cuda.set_device(d)
        dst[d].copy_(src[(d + 1) % n])
        for _ in range(20):
            torch.matmul(a[d], b[d], out=c[d])
    for d in range(n):
        torch.cuda.synchronize(d)
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,index,clocks.sm,power.draw,clocks_event_reasons.active",
         "--format=csv,noheader,nounits", "-lms", "20"],
        stdout=open(f"{args.out}/probe_smi.csv", "w"), stderr=subprocess.DEVNULL)
    results = []
    try:
        for turn in range(args.turns):
            modes = args.modes.split(",")
            for mode in (modes if turn % 2 == 0 else modes[::-1]):
                time.sleep(1.0)  # let the clock settle between modes
                t0 = time.time()
                recs = run_mode(mode, a, b, c, src, dst, args.gemms, args.every, streams)
                t1 = time.time()
                for d, rec in enumerate(recs):
                    s = summarize(rec, args.copy_mib * 2**20)
                    s.update(turn=turn, mode=mode, device=d, wall_start=t0, wall_end=t1)
                    results.append(s)
                    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items()
                                      if not k.startswith("wall")}), flush=True)
    finally:
        smi.terminate()
    with open(f"{args.out}/probe.json", "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(args),
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
