"""Why a GEMM slows beside copy-engine traffic: SM clock, power and throttle reasons per phase.

Every rank runs a loop of bf16 8192^3 GEMMs for a few seconds in each phase, while
``nvidia-smi`` samples each GPU's SM clock, power draw and clock-event (throttle) reasons.
Phases (the GEMM runs on every rank unless said otherwise):

  gemm            the GEMM loop alone
  push_ag         conccl push all-gather of SIZE alone (no GEMM)
  gemm+push_ag    both at once, on two streams
  gemm+push_ag/K  paced: one all-gather per K GEMMs, each queued behind the GEMM before it
                  (an event wait, no kernel), so the copies run a 1/K-ish share of the time
  gemm+nccl_ag    the GEMM beside NCCL's all-gather of SIZE
  r0_gemm         only rank 0 runs the GEMM; no traffic
  r0_gemm+recv    only rank 0 runs the GEMM; ranks 1..n-1 push SIZE/n each to rank 0 only
  r0_gemm+send    only rank 0 runs the GEMM; rank 0 pushes SIZE/n to each peer, nobody to it

If the GEMM's slowdown comes with a lower SM clock and a power-cap reason, the copies cost
it through the power budget; with an unchanged clock, through memory (HBM / L2). The
recv / send phases tell which side of a transfer costs the GEMM.

Run on a GPU machine: ``PYTHONPATH=src python3 benchmarks/2026-11-21-h200x4-power/gemm_power.py --out DIR [--size 1G]``.
Writes DIR/gemm_power.json and DIR/gemm_power.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import conccl
from conccl.bench.environment import environment
from conccl.launch import apply_safe_env, run_per_gpu
from conccl.units import parse_size

QUERY = "index,timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"
# NVML clock-event reason bits (nvml.h nvmlClocksEventReason*)
REASONS = {0x1: "idle", 0x2: "app_clock", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal",
           0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clock"}
N = 8192
PHASES = ("gemm", "push_ag", "gemm+push_ag", "gemm+push_ag/2", "gemm+push_ag/3", "gemm+nccl_ag", "r0_gemm",
          "r0_gemm+recv", "r0_gemm+send")


def _worker(rank: int, world: int, size: int, seconds: float) -> dict:
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(rank)
    a = torch.randn(N, N, dtype=torch.bfloat16, device=dev, generator=g)
    b = torch.randn(N, N, dtype=torch.bfloat16, device=dev, generator=g)
    c = torch.empty_like(a)
    shard = size // world
    ag_out = conccl.empty(size, dtype=torch.uint8)
    ag_in = ag_out[rank * shard:(rank + 1) * shard]  # in place, as FSDP runs it
    a2a_in = conccl.empty(size, dtype=torch.uint8)
    a2a_out = conccl.empty(size, dtype=torch.uint8)
    nccl_out = torch.empty(size, dtype=torch.uint8, device=dev)
    nccl_in = torch.empty(shard, dtype=torch.uint8, device=dev)
    # all-to-all splits that make traffic one-way: rank 0 only receives, or only sends
    piece = size // world
    recv_splits = dict(input_split_sizes=[piece if (rank != 0 and d == 0) else 0 for d in range(world)],
                       output_split_sizes=[piece if (rank == 0 and s != 0) else 0 for s in range(world)])
    send_splits = dict(input_split_sizes=[piece if (rank == 0 and d != 0) else 0 for d in range(world)],
                       output_split_sizes=[piece if (rank != 0 and s == 0) else 0 for s in range(world)])
    for sp in (recv_splits, send_splits):  # tensors as long as their splits (a view of the buffers)
        sp["input"] = a2a_in[:sum(sp["input_split_sizes"])]
        sp["output"] = a2a_out[:sum(sp["output_split_sizes"])]
    comm_stream, compute_stream = torch.cuda.Stream(), torch.cuda.Stream()

    colls = {
        "push_ag": lambda: conccl.all_gather_into_tensor(ag_out, ag_in),
        "nccl_ag": lambda: dist.all_gather_into_tensor(nccl_out, nccl_in),
        "recv": lambda: conccl.all_to_all_single(**recv_splits),
        "send": lambda: conccl.all_to_all_single(**send_splits),
    }

    def timed_loop(fn, n, stream):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            s.record()
            for _ in range(n):
                fn()
            e.record()
        return s, e

    def per_call_us(fn, stream, n=5):
        for _ in range(2):
            with torch.cuda.stream(stream):
                fn()
        torch.cuda.synchronize()
        dist.barrier()
        s, e = timed_loop(fn, n, stream)
        torch.cuda.synchronize()
        t = torch.tensor([s.elapsed_time(e) * 1e3 / n], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    gemm = lambda: torch.mm(a, b, out=c)  # noqa: E731
    t_gemm = per_call_us(gemm, compute_stream)
    t_coll = {k: per_call_us(f, comm_stream) for k, f in colls.items()}
    n_gemm = max(1, int(seconds * 1e6 / t_gemm))

    out = {"t_gemm_us": t_gemm, "t_coll_us": t_coll, "n_gemm": n_gemm, "phases": {}}
    for phase in PHASES:
        gemm_here = phase.startswith("gemm") or (phase.startswith("r0_gemm") and rank == 0)
        coll = phase.split("+")[1] if "+" in phase else (phase if phase in colls else None)
        pace = 1
        if coll and "/" in coll:
            coll, pace = coll.split("/")[0], int(coll.split("/")[1])
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.time()
        window_us = n_gemm * t_gemm
        n_coll = math.ceil(1.05 * window_us / t_coll[coll]) if coll else 0
        if pace > 1:
            n_coll = n_gemm // pace
        # Interleave the enqueueing so that neither stream waits for the host to fill the other.
        s_g = torch.cuda.Event(enable_timing=True)
        e_g = torch.cuda.Event(enable_timing=True)
        s_c = torch.cuda.Event(enable_timing=True)
        e_c = torch.cuda.Event(enable_timing=True)
        if gemm_here:
            compute_stream.record_event(s_g)
        if coll:
            comm_stream.record_event(s_c)
        ic = 0
        for i in range(n_gemm if gemm_here else 0):
            with torch.cuda.stream(compute_stream):
                gemm()
            if pace > 1:
                if i % pace == 0 and ic < n_coll:
                    comm_stream.wait_event(compute_stream.record_event())
                    with torch.cuda.stream(comm_stream):
                        colls[coll]()
                    ic += 1
                continue
            while coll and ic < n_coll and ic * n_gemm <= (i + 1) * n_coll:
                with torch.cuda.stream(comm_stream):
                    colls[coll]()
                ic += 1
        with torch.cuda.stream(comm_stream):
            for _ in range(ic, n_coll):
                colls[coll]()
        if gemm_here:
            compute_stream.record_event(e_g)
        if coll:
            comm_stream.record_event(e_c)
        if not gemm_here and coll is None:
            time.sleep(seconds)
        torch.cuda.synchronize()
        t1 = time.time()
        res = {"t0": t0, "t1": t1, "gemm_here": gemm_here, "coll": coll, "n_coll": n_coll, "pace": pace}
        if gemm_here:
            res["gemm_us"] = s_g.elapsed_time(e_g) * 1e3 / n_gemm
        if coll:
            res["coll_us"] = s_c.elapsed_time(e_c) * 1e3 / max(1, n_coll)
        out["phases"][phase] = res
    # every output checked against NCCL's all-gather once at the end: the loops moved real data
    ag_in.copy_(torch.arange(shard, device=dev, dtype=torch.int64).to(torch.uint8) + rank)
    nccl_in.copy_(ag_in)
    conccl.all_gather_into_tensor(ag_out, ag_in)
    dist.all_gather_into_tensor(nccl_out, nccl_in)
    torch.cuda.synchronize()
    out["ag_equal_nccl"] = bool(torch.equal(ag_out, nccl_out))
    return out


def _sampler(path: str):
    fields = QUERY
    probe = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        fields = fields.replace("clocks_event_reasons", "clocks_throttle_reasons")
    f = open(path, "w")
    p = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "50"],
                         stdout=f, stderr=subprocess.DEVNULL)
    return p, f


def _parse(path: str) -> list[dict]:
    rows = []
    for line in open(path):
        parts = [x.strip() for x in line.split(",")]
        if len(parts) < 7:
            continue
        try:
            whole, _, frac = parts[1].partition(".")
            ts = time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S")) + float("0." + (frac or "0"))
            rows.append({"gpu": int(parts[0]), "t": ts, "sm_mhz": float(parts[2]), "mem_mhz": float(parts[3]),
                         "power_w": float(parts[4]), "temp_c": float(parts[5]), "reasons": int(parts[6], 16)})
        except ValueError:
            continue
    return rows


def summarize(result: dict, samples: list[dict]) -> dict:
    """Per phase and GPU: GEMM time and slowdown, median SM clock and power, reason shares."""
    rank_phases = result["ranks"]
    world = len(rank_phases)
    base_all = statistics.median(r["phases"]["gemm"]["gemm_us"] for r in rank_phases)
    base_r0 = rank_phases[0]["phases"]["r0_gemm"]["gemm_us"]
    table = {}
    for phase in PHASES:
        row = {}
        for rank in range(world):
            ph = rank_phases[rank]["phases"][phase]
            # the middle 80% of the phase: away from its start and end
            span = ph["t1"] - ph["t0"]
            lo, hi = ph["t0"] + 0.1 * span, ph["t1"] - 0.1 * span
            s = [x for x in samples if x["gpu"] == rank and lo <= x["t"] <= hi]
            cell = {"samples": len(s)}
            if s:
                cell["sm_mhz"] = statistics.median(x["sm_mhz"] for x in s)
                cell["power_w"] = statistics.median(x["power_w"] for x in s)
                cell["temp_c"] = statistics.median(x["temp_c"] for x in s)
                reasons = {}
                for bit, name in REASONS.items():
                    share = sum(1 for x in s if x["reasons"] & bit) / len(s)
                    if share:
                        reasons[name] = round(share, 2)
                cell["reasons"] = reasons
            if "gemm_us" in ph:
                cell["gemm_us"] = ph["gemm_us"]
                base = base_r0 if phase.startswith("r0_") else base_all
                cell["gemm_slowdown"] = ph["gemm_us"] / base - 1.0
            if "coll_us" in ph:
                cell["coll_us"] = ph["coll_us"]
            if "gemm_us" in ph and ph.get("coll"):
                # the share of the GEMM window the copies were busy, at their speed alone
                t_alone = rank_phases[rank]["t_coll_us"][ph["coll"]]
                cell["coll_share"] = min(1.0, ph["n_coll"] * t_alone / (ph["gemm_us"] * rank_phases[rank]["n_gemm"]))
            row[rank] = cell
        table[phase] = row
    return table


def markdown(res: dict) -> str:
    lines = [f"# GEMM beside copy-engine traffic: clock and power ({res['meta'].get('machine_kind')}, "
             f"{res['meta'].get('date')})", "",
             f"size {res['size']} B, GEMM bf16 {N}^3 alone {res['ranks'][0]['t_gemm_us']:.0f} us, "
             f"collectives alone (us): " + ", ".join(f"{k} {v:.0f}" for k, v in res['ranks'][0]['t_coll_us'].items()),
             f"all-gather equal to NCCL's: {all(r['ag_equal_nccl'] for r in res['ranks'])}", "",
             "| phase | GPU | GEMM us | slowdown | coll us | coll busy | SM MHz | power W | temp C | reasons (share of samples) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for phase, row in res["table"].items():
        for gpu, c in row.items():
            fmt = lambda k, f: (f % c[k]) if k in c else "-"  # noqa: E731
            lines.append(f"| {phase} | {gpu} | {fmt('gemm_us', '%.0f')} | "
                         f"{(('%.1f%%' % (100 * c['gemm_slowdown'])) if 'gemm_slowdown' in c else '-')} | "
                         f"{fmt('coll_us', '%.0f')} | {fmt('coll_share', '%.2f')} | {fmt('sm_mhz', '%.0f')} | {fmt('power_w', '%.0f')} | "
                         f"{fmt('temp_c', '%.0f')} | {c.get('reasons', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args(argv)
    apply_safe_env()
    os.makedirs(args.out, exist_ok=True)
    size = parse_size(args.size)
    smi_path = os.path.join(args.out, "nvidia_smi.csv")
    proc, f = _sampler(smi_path)
    try:
        ranks = run_per_gpu(_worker, size, args.seconds)
    finally:
        proc.terminate()
        proc.wait()
        f.close()
    res = {"meta": environment(os.environ.get("CONCCL_MACHINE_KIND", "unknown"), torch.cuda.device_count()), "size": size, "seconds": args.seconds, "ranks": ranks}
    res["table"] = summarize(res, _parse(smi_path))
    with open(os.path.join(args.out, "gemm_power.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    md = markdown(res)
    with open(os.path.join(args.out, "gemm_power.md"), "w") as fh:
        fh.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
