"""Where the time of an all-gather+GEMM (``--op ag_gemm``) or a GEMM+reduce-scatter (``--op gemm_rs``)
goes on two GPUs, per shape and implementation: the GPU timelines of profiled calls, timed as
``conccl bench tp`` times them (issue 39, item 1).

Every implementation runs once per round, in turn (clock and power drift fall on all alike),
each call queued while the GPU sleeps (a ``torch.cuda._sleep`` kernel on the caller's stream),
so the call's GPU work starts when the sleep ends, with the host's queueing hidden as in a
training step whose host runs ahead. ``--rounds`` rounds are profiled after warm-ups; per
call, from the end of its sleep kernel:

- ``wall``: to the end of the call's last GPU operation (any stream);
- ``gemm``: the GEMM kernels' summed time, and over the GEMM alone's kernel in the same rounds
  (> 1: the split and the copies beside it slow the GEMM's kernels);
- ``no_gemm``: wall time with no GEMM kernel running (what the pipeline exposes): ``head``
  before the first GEMM, ``gaps`` between GEMMs, ``tail`` after the last;
- ``stage``: same-GPU copies (``Memcpy DtoD``: the shard staged into symmetric memory, the own
  chunk into the output where it is made), ``peer``: the copy engines' peer copies (``Memcpy PtoP``), their
  summed time and when the last one ends;
- ``other``: every other kernel (async-TP's barrier, conccl's reduction); ``gemm_end``,
  ``other_start``, ``other_end``: when the last GEMM kernel ends and the other kernels start
  and end (a GEMM+reduce-scatter's exposed tail: the wait for the last piece, then the sum).

Medians over the profiled rounds, per rank; the printed table is rank 0's, the JSON has every
rank's. Needs 2 or more GPUs::

    PYTHONPATH=src python3 scripts/tp_timeline.py --shapes 8192x8192x14336,4096x8192x8192 \\
        --schedules direct,direct-p2,direct-s2,direct-p2-s2 --json OUT/tp_timeline.json \\
        --markdown OUT/tp_timeline.md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist

SLEEP_CYCLES = 2_000_000  # ~1 ms at H100/H200 clocks: longer than queueing any call


def _gpu_events(prof) -> list:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name)).get("traceEvents", [])
    return sorted(({"stream": e.get("args", {}).get("stream", e.get("tid")), "cat": e["cat"], "name": e["name"],
                    "start": float(e["ts"]), "end": float(e["ts"]) + float(e.get("dur", 0))}
                   for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                  key=lambda e: e["start"])


def _is_sleep(e) -> bool:
    # torch.cuda._sleep's (~1 ms; not conccl's spin waits, nor another library's short spin kernel)
    return e["cat"] == "kernel" and "spin_kernel" in e["name"] and e["end"] - e["start"] > 400


def _is_gemm(e) -> bool:
    n = e["name"].lower()
    return e["cat"] == "kernel" and any(k in n for k in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_"))


def _union(spans) -> float:
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def split_calls(events) -> list:
    """The GPU operations of each call: those after a sleep kernel's end and before the next
    sleep kernel's start (the calls of a round never overlap: each is synchronised)."""
    sleeps = [e for e in events if _is_sleep(e)]
    calls = []
    for i, s in enumerate(sleeps):
        stop = sleeps[i + 1]["start"] if i + 1 < len(sleeps) else float("inf")
        calls.append((s["end"], [e for e in events if not _is_sleep(e) and s["end"] <= e["start"] < stop]))
    return calls


def call_summary(t0: float, ops: list) -> dict:
    """One call's figures (microseconds from ``t0``, the end of its sleep)."""
    if not ops:
        return {}
    end = max(e["end"] for e in ops)
    gemms = [e for e in ops if _is_gemm(e)]
    busy = _union([(e["start"], e["end"]) for e in gemms])
    copies = [e for e in ops if e["cat"] == "gpu_memcpy"]
    stage = [e for e in copies if "DtoD" in e["name"]]
    peer = [e for e in copies if "PtoP" in e["name"]]
    other = [e for e in ops if e["cat"] == "kernel" and not _is_gemm(e)]
    first = min((e["start"] for e in gemms), default=end)
    last = max((e["end"] for e in gemms), default=end)
    return {"wall": end - t0, "gemm": sum(e["end"] - e["start"] for e in gemms), "gemm_kernels": len(gemms),
            "gemm_streams": len({e["stream"] for e in gemms}), "no_gemm": (end - t0) - busy,
            "head": first - t0, "tail": end - last, "gaps": (last - first) - busy,
            "stage": sum(e["end"] - e["start"] for e in stage),
            "peer": sum(e["end"] - e["start"] for e in peer),
            "peer_end": max((e["end"] for e in peer), default=t0) - t0,
            "other": sum(e["end"] - e["start"] for e in other),
            "gemm_end": last - t0,
            "other_start": min((e["start"] for e in other), default=end) - t0,
            "other_end": max((e["end"] for e in other), default=t0) - t0}


def _medians(summaries: list) -> dict:
    keys = summaries[0].keys() if summaries else ()
    return {k: round(statistics.median(s[k] for s in summaries), 1) for k in keys}


def _rank(rank, world, shapes, schedules, warmup, rounds, op="ag_gemm"):
    from torch.profiler import ProfilerActivity, profile

    import conccl
    from conccl.bench.async_tp import world_async_tp
    ctp = conccl.tp

    async_tp = world_async_tp(torch, dist)
    out = []
    for M, K, N in shapes:
        g = torch.Generator(device="cuda").manual_seed(rank)
        rs = op == "gemm_rs"  # a: the whole M rows (reduce-scatter) or this rank's shard (all-gather)
        a = torch.randn(M if rs else M // world, K, device="cuda", dtype=torch.bfloat16, generator=g) / K ** 0.25
        w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16,
                        generator=torch.Generator(device="cuda").manual_seed(9)) / K ** 0.25
        # the GEMM alone multiplies data like the pipelines' (a GEMM's power and clocks depend on it)
        full = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g) / K ** 0.25
        prod = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        auto = ctp.resolve_schedule("auto", op, M, K, N, world, a.dtype, a.device).name
        impls = {"gemm_alone": lambda: torch.mm(a if rs else full, w, out=prod)}
        call = ((lambda s: ctp.matmul_reduce_scatter(a, w, schedule=s)) if rs
                else (lambda s: ctp.all_gather_matmul(a, w, schedule=s)))
        for s in schedules:
            impls[f"conccl {s}"] = lambda s=s: call(s)
        impls[f"conccl auto ({auto})"] = lambda: call("auto")
        if async_tp is not None:
            impls["torch async-TP"] = (lambda: async_tp.rs(a, w)) if rs else (lambda: async_tp.ag(a, w))
        names, fns = list(impls), list(impls.values())
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        timed = {n: [] for n in names}

        def one_round(record):
            for n, fn in zip(names, fns):
                torch.cuda._sleep(SLEEP_CYCLES)
                start.record()
                fn()
                end.record()
                end.synchronize()
                if record:
                    timed[n].append(1e3 * start.elapsed_time(end))

        for _ in range(warmup):
            one_round(False)
        torch.cuda.synchronize()
        dist.barrier()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(rounds):
                one_round(True)
            torch.cuda.synchronize()
        calls = split_calls(_gpu_events(prof))
        if len(calls) != rounds * len(names):
            raise RuntimeError(f"found {len(calls)} calls in the trace, expected {rounds * len(names)}")
        per = {n: [] for n in names}
        for i, (t0, ops) in enumerate(calls):
            per[names[i % len(names)]].append(call_summary(t0, ops))
        rec = {"op": op, "shape": f"{M}x{K}x{N}", "rank": rank, "auto": auto, "impls": {}}
        for n in names:
            rec["impls"][n] = dict(_medians(per[n]), events_us=round(statistics.median(timed[n]), 1))
        alone = rec["impls"]["gemm_alone"]
        for n, r in rec["impls"].items():
            r["over_alone"] = round(r["events_us"] / alone["events_us"], 3)
            r["gemm_over_alone"] = round(r["gemm"] / alone["gemm"], 3) if alone.get("gemm") else None
        out.append(rec)
    return out


COLUMNS = ("events_us", "over_alone", "wall", "gemm", "gemm_over_alone", "gemm_streams", "no_gemm", "head", "gaps",
           "tail", "stage", "peer", "peer_end", "other", "gemm_end", "other_start", "other_end")


def markdown(results, meta) -> str:
    lines = [f"# Where a tensor-parallel op's time goes ({meta.get('device')}, world {len(results)})", "",
             f"{meta.get('date')}, commit {meta.get('commit')}, torch {torch.__version__}. Microseconds, medians of "
             f"{meta.get('rounds')} profiled rounds in turn, rank 0 (`events_us`, `over_alone`: CUDA events of the "
             "same rounds; the slowest rank's in the JSON). See the script's doc for each column.", ""]
    lines += ["| shape | impl | " + " | ".join(COLUMNS) + " |", "| --- | --- |" + " --- |" * len(COLUMNS)]
    for rec in results[0]:
        for n, r in rec["impls"].items():
            cells = [("" if r.get(c) is None else format(r[c], "g")) for c in COLUMNS]
            lines.append(f"| {rec['shape']} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", choices=("ag_gemm", "gemm_rs"), default="ag_gemm")
    ap.add_argument("--shapes", default="8192x8192x14336,4096x8192x8192",
                    help="MxKxN,... (M: the gathered rows, or the rows each rank multiplies before the reduce-scatter)")
    ap.add_argument("--schedules", default="direct,direct-p2,ring-p2,direct-s2,direct-p2-s2")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--machine-kind", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    a = ap.parse_args()
    if torch.cuda.device_count() < 2:
        print("needs 2 or more GPUs", file=sys.stderr)
        return 2
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    from conccl.bench.environment import environment
    from conccl.launch import run_per_gpu

    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    results = run_per_gpu(_rank, shapes, a.schedules.split(","), a.warmup, a.rounds, a.op)
    meta = dict(environment(a.machine_kind, len(results)), rounds=a.rounds)
    for per_rank in zip(*results):  # the slowest rank's events time beside rank 0's figures
        for n, r in per_rank[0]["impls"].items():
            r["events_us_slowest_rank"] = max(x["impls"][n]["events_us"] for x in per_rank)
    text = markdown(results, meta)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "ranks": results}, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
