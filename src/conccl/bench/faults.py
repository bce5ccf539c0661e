"""Fault benchmark on the GPUs: a dead or stalled peer, a 10,000-call soak, the checks' cost.

``python -m conccl.bench.faults --out DIR`` runs, each in fresh processes (one per GPU):

* ``killed``: the last rank is SIGKILLed with its part of a 1 GiB all-gather queued; the
  survivors must raise within timeout + 1 s (a dead process is noticed sooner), drain their
  streams and exit with code 0.
* ``stalled``: the last rank stays alive but its GPU is busy past the timeout; the survivors
  must raise :class:`CollectiveTimeout` within timeout + 1 s, and the stalled rank, when its
  part finally runs, must not pass its output off as valid (``GroupBroken``).
* ``soak``: 10,000 back-to-back all-gathers and all-to-alls of mixed sizes, sync and async,
  each verified; device memory, threads and file descriptors at call 100 and at the end.
* ``checks``: a 1 MiB all-gather's latency with the mismatch checks and the watchdog on and
  off, interleaved, the slowest rank counts.

Writes ``faults.json`` (every figure, the machine, versions, commit) and ``faults.md``.
The GPU tests call the same workers with smaller settings.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import conccl

from .. import env
from ..collectives import REGISTRY

# The soak checks a collective that moves bytes (one source per output chunk) by byte-exact
# delivery of int32 payloads shifted per call; a reducing one by fp32 whole numbers shifted per
# call, whose sums are exact in any order. The soak runs every registered collective.
COLLECTIVES = {n: c for n, c in REGISTRY.items() if all(len(s) == 1 for s in c.layout(2, 0).sources)}
REDUCING = {n: c for n, c in REGISTRY.items() if n not in COLLECTIVES}
from ..errors import CollectiveError
from ..launch import apply_safe_env, run_per_gpu
from .environment import environment
from .run import _timed, make_case


# ---------------------------------------------------------------------------- dead / stalled peer
def _say(rank: int, t0: float, msg: str) -> None:
    print(f"[faults rank {rank} +{time.monotonic() - t0:.2f}s] {msg}", file=sys.stderr, flush=True)


def _spin_cycles(seconds: float) -> int:
    khz = torch.cuda.get_device_properties(torch.cuda.current_device()).clock_rate  # SM clock, kHz
    return int(seconds * khz * 1e3)


def peer_fault_worker(rank: int, world: int, mode: str, timeout_s: float, out_bytes: int, stall_s: float = 0.0):
    """One rank of the ``killed`` / ``stalled`` scenario; returns what it saw."""
    victim = world - 1  # never rank 0: it hosts the process group's store
    n = out_bytes // world // 4
    inp = torch.full((n,), rank, dtype=torch.int32, device="cuda")
    out = torch.empty(world * n, dtype=torch.int32, device="cuda")
    conccl.all_gather_into_tensor(out, inp)  # maps the peers and sizes the workspace
    torch.cuda.synchronize()
    rec = {"rank": rank, "mode": mode, "timeout_s": timeout_s, "out_bytes": out_bytes,
           "warm_ok": bool((out.view(world, n) == torch.arange(world, device="cuda")[:, None]).all())}
    dist.barrier()
    timeout = timedelta(seconds=timeout_s)
    if rank == victim:
        torch.cuda._sleep(_spin_cycles(stall_s if mode == "stalled" else 0.5))  # its part stays queued
        t0 = time.monotonic()
        work = conccl.all_gather_into_tensor(out, inp, async_op=True, timeout=timeout)
        if mode == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        err = None
        try:
            work.synchronize()
        except CollectiveError as e:
            err = e
        rec.update(role="stalled", error=type(err).__name__ if err else None, message=str(err) if err else None,
                   returned_s=time.monotonic() - t0)
        return rec
    out.fill_(-1)
    t0 = time.monotonic()
    work = conccl.all_gather_into_tensor(out, inp, async_op=True, timeout=timeout)
    call_s = time.monotonic() - t0
    _say(rank, t0, "queued")
    err = None
    try:
        work.synchronize(timeout=timeout_s + 10.0)  # bounded here too: a missed detection shows, not hangs
    except CollectiveError as e:
        err = e
    detect_s = time.monotonic() - t0
    _say(rank, t0, f"raised {type(err).__name__}: {err}")
    x = torch.ones(1, device="cuda") + 1  # later work on the stream runs: nothing stays stuck
    torch.cuda.synchronize()
    drained_s = time.monotonic() - t0
    _say(rank, t0, "drained")
    t1 = time.monotonic()
    again = None
    try:
        conccl.all_gather_into_tensor(out, inp)
    except CollectiveError as e:
        again = e
    _say(rank, t0, f"next call: {type(again).__name__}")
    rec.update(role="survivor", call_s=call_s, detect_s=detect_s, drained_s=drained_s, stream_ok=float(x) == 2.0,
               error=type(err).__name__ if err else None, message=str(err) if err else None,
               missing=getattr(err, "missing", None), exited=getattr(err, "exited", None),
               next_call_error=type(again).__name__ if again else None, next_call_s=time.monotonic() - t1)
    return rec


def run_peer_fault(mode: str, timeout_s: float, out_bytes: int = 1 << 30, stall_s: float = 0.0,
                   nprocs: int | None = None) -> dict:
    world = nprocs or torch.cuda.device_count()
    codes: list = []
    t0 = time.monotonic()
    ranks = run_per_gpu(peer_fault_worker, mode, timeout_s, out_bytes, stall_s, nprocs=world, timeout_s=60,
                        allow_missing=(world - 1,) if mode == "killed" else (), exitcodes=codes)
    return {"mode": mode, "timeout_s": timeout_s, "out_bytes": out_bytes, "stall_s": stall_s, "world": world,
            "ranks": ranks, "exitcodes": codes, "wall_s": time.monotonic() - t0}


# ---------------------------------------------------------------------------- soak
def _used_bytes() -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free


def soak_worker(rank: int, world: int, calls: int, seed: int = 0):
    """``calls`` verified collectives of every registered kind and mixed sizes; resource
    use at 100 and at the end. Each call's input differs from the last (each byte, or for a
    reduction each value, shifted by a per-call amount), so a stale output counts as wrong."""
    rng = random.Random(seed)  # the same sequence on every rank
    chunks = [4, 1024, 16 << 10, 256 << 10, 2 << 20]  # 4-byte elements per rank pair: 16 B .. 8 MiB
    outs, cases = {}, {}
    for n in chunks:
        size = world * n * 4
        outs[n] = torch.empty(world * n, dtype=torch.int32, device="cuda")  # shared: a stale output is wrong
        for coll in REGISTRY.values():
            dtype = torch.float32 if coll.name in REDUCING else torch.int32
            inp, _, expected = make_case(coll, size, world, rank, dtype, "cuda")
            base = inp.clone() if coll.name in REDUCING else inp.view(torch.uint8).clone()
            cases[coll.name, n] = (inp.clone(), base, expected)
    wrong = torch.zeros((), dtype=torch.int64, device="cuda")
    snap = {}
    comm = conccl.get_communicator()

    def snapshot():
        torch.cuda.synchronize()
        return {"device_used_bytes": _used_bytes(), "torch_allocated": torch.cuda.memory_allocated(),
                "torch_reserved": torch.cuda.memory_reserved(), "threads": threading.active_count(),
                "fds": len(os.listdir("/proc/self/fd")), "watchdog_in_flight": comm.watchdog.in_flight()}

    kinds = dict.fromkeys(REGISTRY, 0)
    t0 = time.monotonic()
    for i in range(calls):
        n = chunks[-1] if i == 0 else rng.choice(chunks)  # the largest first: the workspace is sized once
        coll = REGISTRY[rng.choice(list(REGISTRY))]
        async_op = rng.random() < 0.5
        kinds[coll.name] += 1
        out = outs[n]
        inp, base_inp, base_expected = cases[coll.name, n]
        shift = i % 255 + 1
        if coll.name in REDUCING:  # whole numbers: every rank adds shift, the sum gains world x shift
            out32 = out.view(torch.float32)
            if coll.single_tensor:  # in place: the output is the input
                torch.add(base_inp, shift, out=out32)
            else:
                torch.add(base_inp, shift, out=inp)
            work = coll.call_with(conccl, out32, out32 if coll.single_tensor else inp, async_op=async_op)
            expected = base_expected.view(torch.float32) + world * shift
            if async_op:
                work.wait()
            wrong += (out32 != expected).sum()
        else:  # uint8 arithmetic: wraps mod 256 alike on both sides
            torch.add(base_inp, shift, out=inp.view(torch.uint8))
            work = getattr(conccl, coll.api_name)(out, inp, async_op=async_op)
            expected = base_expected + shift
            if async_op:
                work.wait()
            wrong += (out.view(torch.uint8) != expected).view(-1, 4).any(dim=1).sum()
        if i + 1 == 100:
            snap["at_100"] = snapshot()
    snap["at_end"] = snapshot()
    elapsed = time.monotonic() - t0
    return {"rank": rank, "calls": calls, "kinds": kinds, "wrong": int(wrong), "elapsed_s": elapsed, **snap,
            "device_growth_bytes": snap["at_end"]["device_used_bytes"] - snap["at_100"]["device_used_bytes"]}


# ---------------------------------------------------------------------------- cost of the checks
def checks_cost_worker(rank: int, world: int, out_bytes: int, iters: int, reps: int):
    n = out_bytes // world // 2
    inp = torch.ones(n, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(world * n, dtype=torch.bfloat16, device="cuda")
    comm = conccl.get_communicator()
    times = {True: [], False: []}
    host = {True: [], False: []}
    for _ in range(reps):
        for checks in (True, False):  # interleaved: drift hits both alike
            comm.options.checks = checks
            us = _timed(lambda: conccl.all_gather_into_tensor(out, inp), iters, 10)
            times[checks] += us
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                conccl.all_gather_into_tensor(out, inp)
            host[checks].append((time.perf_counter() - t0) / iters * 1e6)
            torch.cuda.synchronize()
    comm.options.checks = True

    def stats(v):
        return {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v), "n": len(v)}

    on, off = stats(times[True]), stats(times[False])
    return {"rank": rank, "out_bytes": out_bytes, "with_checks": on, "without_checks": off,
            "host_us_with": statistics.median(host[True]), "host_us_without": statistics.median(host[False]),
            "cost": on["median_us"] / off["median_us"] - 1.0}


# ---------------------------------------------------------------------------- driver
def _markdown(res: dict) -> str:
    lines = [f"# conccl fault benchmark ({res['meta'].get('machine_kind', '?')}, {res['meta'].get('date', '?')})", "",
             f"commit {res['meta'].get('commit', '?')}, torch {res['meta'].get('torch')}, NCCL {res['meta'].get('nccl')}, "
             f"{res['meta'].get('world')} x {res['meta'].get('device')}", "",
             "## A dead or stalled peer during a 1 GiB all-gather", "",
             "| scenario | timeout (s) | survivor | error | detected after (s) | over timeout (s) | stream drained | next call | exit code |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for sc in res.get("peer_faults", []):
        for r in sc["ranks"]:
            if r is None or r.get("role") != "survivor":
                continue
            over = r["detect_s"] - sc["timeout_s"]
            lines.append(f"| {sc['mode']} | {sc['timeout_s']:g} | {r['rank']} | {r['error']} | {r['detect_s']:.2f} | "
                         f"{over:+.2f} | {r['stream_ok']} | {r['next_call_error']} ({r['next_call_s'] * 1e3:.1f} ms) | "
                         f"{sc['exitcodes'][r['rank']]} |")
        for r in sc["ranks"]:
            if r is not None and r.get("role") == "stalled":
                lines.append(f"| {sc['mode']} | {sc['timeout_s']:g} | {r['rank']} (stalled itself) | {r['error']} | "
                             f"{r['returned_s']:.2f} | | | | {sc['exitcodes'][r['rank']]} |")
        lines.append(f"\n{sc['mode']}: exit codes {sc['exitcodes']} (victim SIGKILL = -9), wall {sc['wall_s']:.1f} s\n")
    soak = res.get("soak")
    if soak:
        lines += ["## Soak", "", f"| rank | calls | {' / '.join(REGISTRY)} | wrong | device memory growth 100 -> end (B) | "
                  "threads | fds | elapsed (s) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in soak:
            lines.append(f"| {r['rank']} | {r['calls']} | {' / '.join(str(r['kinds'].get(c, 0)) for c in REGISTRY)} | "
                         f"{r['wrong']} | {r['device_growth_bytes']} | {r['at_100']['threads']} -> {r['at_end']['threads']} | "
                         f"{r['at_100']['fds']} -> {r['at_end']['fds']} | {r['elapsed_s']:.1f} |")
        lines.append("")
    cost = res.get("checks")
    if cost:
        worst = max(cost, key=lambda r: r["with_checks"]["median_us"])
        lines += ["## Cost of the checks on a 1 MiB all-gather", "",
                  "| | median (us) | min..max (us) | host per call (us) |", "| --- | --- | --- | --- |"]
        for key, label, hk in (("with_checks", "checks + watchdog", "host_us_with"),
                               ("without_checks", "none", "host_us_without")):
            st = worst[key]
            lines.append(f"| {label} | {st['median_us']:.1f} | {st['min_us']:.1f}..{st['max_us']:.1f} | {worst[hk]:.1f} |")
        lines.append(f"\nCost: {worst['cost'] * 100:+.1f}% (times are the slowest rank's per iteration; "
                     f"{worst['with_checks']['n']} iterations each, interleaved)\n")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conccl.bench.faults", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for faults.json and faults.md")
    ap.add_argument("--only", default="killed,stalled,soak,checks")
    ap.add_argument("--timeout", type=float, default=5.0, help="collective timeout of the fault scenarios (s)")
    ap.add_argument("--calls", type=int, default=10_000, help="soak length")
    ap.add_argument("--gpus", type=int, default=None)
    args = ap.parse_args(argv)

    apply_safe_env()


    if torch.cuda.device_count() < 2:
        print("error: the fault benchmark needs at least 2 GPUs", file=sys.stderr)
        return 2
    only = set(args.only.split(","))
    os.makedirs(args.out, exist_ok=True)
    res = {"meta": environment(env.get("CONCCL_MACHINE_KIND"), args.gpus or torch.cuda.device_count())}

    def save():
        with open(os.path.join(args.out, "faults.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
        with open(os.path.join(args.out, "faults.md"), "w") as f:
            f.write(_markdown(res) + "\n")

    res["peer_faults"] = []
    if "killed" in only:
        for timeout_s in (args.timeout, 60.0):
            print(f"[faults] killed peer, timeout {timeout_s:g} s", flush=True)
            res["peer_faults"].append(run_peer_fault("killed", timeout_s, nprocs=args.gpus))
            save()
    if "stalled" in only:
        print(f"[faults] stalled peer, timeout {args.timeout:g} s", flush=True)
        res["peer_faults"].append(run_peer_fault("stalled", args.timeout, stall_s=args.timeout + 3.0, nprocs=args.gpus))
        save()
    if "soak" in only:

        print(f"[faults] soak, {args.calls} calls", flush=True)
        res["soak"] = run_per_gpu(soak_worker, args.calls, nprocs=args.gpus, timeout_s=900)
        save()
    if "checks" in only:

        print("[faults] cost of the checks, 1 MiB all-gather", flush=True)
        res["checks"] = run_per_gpu(checks_cost_worker, 1 << 20, 200, 5, nprocs=args.gpus, timeout_s=600)
        save()
    print(_markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
