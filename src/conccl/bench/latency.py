"""Where a small collective's time goes: host launch against GPU execution.

``python -m conccl.bench.latency --out DIR`` runs, in one process per GPU, for each
implementation, collective and (small) size, four figures, the slowest rank counting:

* ``time``: as ``conccl bench`` reports it: one call between two CUDA events, median of
  ``-n`` timed iterations (what a caller that waits for each call sees);
* ``loop``: ``-n`` calls back to back between two events, per call (what a stream of calls sees);
* ``host``: host time to queue one call (wall clock around ``-n`` calls, per call);
* ``gpu``: GPU time of one call with the host out of the way: every rank holds its stream
  behind a GPU-side sleep, queues ``-n`` calls, and the events around them measure only the
  GPU once the sleep ends (``gate_expired`` says whether the sleep outlasted the queueing).

A call costs max(host, gpu) when the caller waits for each one: the two columns say which
side to make faster. Writes ``latency.json`` and ``latency.md``.
"""
from __future__ import annotations

import argparse
import collections
import functools
import importlib
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import conccl

from .. import env
from ..collectives import REGISTRY as COLLECTIVES, STUDIED, get as get_collective
from ..launch import apply_safe_env, run_per_gpu
from .environment import environment
from .faults import _spin_cycles
from .impls import NAMES, implementations
from .run import _timed, _wrong_elements, make_case, max_bytes, round_size
from .variant import Variant, add_variant_flags, variant_of

DEFAULT_SIZES = (4096, 65536, 1 << 20, 4 << 20)
DEFAULT_IMPLS = ("conccl", "nccl")


def _gated(run, iters: int, gate_cycles: int) -> tuple[float, float, bool]:
    """(host us per call, GPU us per call, gate held) for ``iters`` calls queued behind a sleep."""
    torch.cuda.synchronize()
    dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(gate_cycles)
    s.record()
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    host_us = (time.perf_counter() - t0) / iters * 1e6
    e.record()
    held = not s.query()
    torch.cuda.synchronize()
    return host_us, s.elapsed_time(e) * 1e3 / iters, held


# Host phases of a conccl call, timed by wrapping these functions (inclusive times; a
# phase's children are listed after it): (label, module, attribute). A collective's own steps
# (validate: its local(); plan: its plan()) come from the registry.
_COLLECTIVE_CLASSES = tuple(dict.fromkeys(type(c) for c in COLLECTIVES.values()))
PHASES = (
    ("call", "conccl.group.group", "Group.call"),
    ("call", "conccl.group.persistent", "PersistentCollective.start"),  # a persistent op: execute only
    ("call key", "conccl.group.local", "LocalSteps.remembered"),
    # The local and settle steps run only for arguments (or peers' rows) not seen before.
    ("local step", "conccl.group.local", "LocalSteps.make"),
    *(("validate", cls.__module__, f"{cls.__name__}.local") for cls in _COLLECTIVE_CLASSES),
    ("board exchange", "conccl.group.board", "HostBoard.exchange"),
    ("board post", "conccl.group.board", "HostBoard.post"),  # a settled call's (Options.post_settled): no wait
    ("settle", "conccl.group.agreement", "Agreement.settle"),
    *(("plan", cls.__module__, f"{cls.__name__}.plan") for cls in _COLLECTIVE_CLASSES),
    ("execute", "conccl.group.group", "Group.execute"),
    ("executor run", "conccl.executors.cuda.executor", "CudaCopyEngineExecutor.run"),
    ("program lookup", "conccl.executors.cuda.programs", "ProgramCache._program"),
    ("driver calls", "conccl.executors.cuda.program", "CompiledProgram.launch_slot"),
    ("graph launch", "conccl.executors.cuda.graph_launch", "SettledGraph.launch"),  # a settled call's, instead
    ("watchdog track", "conccl.group.watchdog", "Watchdog.track"),
)
PHASE_LABELS = tuple(dict.fromkeys(label for label, _, _ in PHASES))


def _time_phases(run, iters: int) -> dict:
    """Host us per call spent in each of :data:`PHASES` over ``iters`` calls of ``run``
    (each wrapper adds ~0.2 us to the phases around it)."""
    totals = collections.defaultdict(int)
    patched = []

    def timer(fn, label):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[label] += time.perf_counter_ns() - t
        return timed

    try:
        for label, module, attr in PHASES:
            owner = importlib.import_module(module)
            *path, name = attr.split(".")
            for part in path:
                owner = getattr(owner, part)
            fn = owner.__dict__[name]
            setattr(owner, name, timer(fn, label))
            patched.append((owner, name, fn))
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
    finally:
        for owner, name, fn in reversed(patched):
            setattr(owner, name, fn)
    return {label: totals[label] / 1e3 / iters for label in PHASE_LABELS}


def _loop(run, iters: int) -> float:
    torch.cuda.synchronize()
    dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        run()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / iters


def latency_worker(rank: int, world: int, impls: list[str], collectives: list[str], sizes: list[int],
                   iters: int, warmup: int, reps: int, phases: bool = False, variant: Variant = Variant()) -> list[dict]:
    dtype, esize = torch.bfloat16, 2
    # every buffer of every case (a reduce-scatter's input is world times its output): the
    # symmetric implementations' arenas hold the largest
    ctx = {"max_bytes": max_bytes([get_collective(c) for c in collectives], sizes, world, esize)}
    records, registry = [], implementations(variant)
    for coll in map(get_collective, collectives):
        for name in impls:
            impl = registry[name]
            if not impl.serves(coll, world):
                continue
            for size in sizes:
                size = round_size(size, world, esize)
                inp, out, expected = make_case(coll, size, world, rank, dtype, "cuda")
                run, result = impl.setup(coll, inp, out, ctx)
                out.view(torch.uint8).fill_(0xAB)
                run()
                torch.cuda.synchronize()
                rec = {"impl": name, "collective": coll.name, "size": size, "world": world,
                       "wrong": _wrong_elements(result(), expected, esize)}
                if name != "nccl":  # which signal ops the driver took in one cuStreamBatchMemOp
                    rec["signal_batching"] = getattr(conccl.get_communicator().executor, "batching", None)
                times = _timed(run, iters, warmup)
                hosts, gpus, loops, held = [], [], [], True
                for _ in range(reps):
                    host_us, gpu_us, h = _gated(run, iters, _spin_cycles(0.05 + iters * 500e-6))
                    hosts.append(host_us)
                    gpus.append(gpu_us)
                    held &= h
                    loops.append(_loop(run, iters))
                if phases and name != "nccl":  # every rank, so that the board exchange waits alike
                    ph = _time_phases(run, iters)
                    t = torch.tensor(list(ph.values()), device="cuda")
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    rec["host_phases_us"] = dict(zip(ph, t.tolist()))
                x = torch.tensor([statistics.median(hosts), statistics.median(gpus), statistics.median(loops),
                                  float(not held), float(rec["wrong"])], device="cuda")
                dist.all_reduce(x, op=dist.ReduceOp.MAX)  # the slowest rank counts
                rec.update(time_us=statistics.median(times), time_min_us=min(times), time_max_us=max(times),
                           host_us=float(x[0]), gpu_us=float(x[1]), loop_us=float(x[2]), gate_expired=bool(x[3] > 0),
                           wrong=int(x[4]))
                if impl.teardown is not None:
                    impl.teardown(ctx)
                records.append(rec)
                if rank == 0:
                    print(f"[latency] {coll.name:10s} {name:18s} {size:>9d} B  time {rec['time_us']:7.1f}  loop "
                          f"{rec['loop_us']:7.1f}  host {rec['host_us']:6.1f}  gpu {rec['gpu_us']:6.1f} us"
                          f"{'  (gate expired)' if rec['gate_expired'] else ''}  #wrong {rec['wrong']}", flush=True)
                inp = out = expected = run = result = None
                torch.cuda.empty_cache()
    return records


def markdown(res: dict) -> str:
    m = res["meta"]
    lines = [f"# Latency: host launch against GPU execution ({m.get('machine_kind')}, {m.get('date')})", "",
             f"commit {m.get('commit')}, torch {m.get('torch')}, NCCL {m.get('nccl')}, {res['world']} ranks, bf16, "
             f"{res['iters']} calls per figure, median of {res['reps']} (time: of {res['iters']}), slowest rank. "
             f"conccl signal batching: {sorted({str(r.get('signal_batching')) for r in res['records'] if r['impl'] != 'nccl'})}."
             + (f" conccl calls: {res['variant']}." if res.get("variant") else ""),
             "",
             "| collective | implementation | size (B) | time (us) | loop (us/call) | host (us/call) | GPU (us/call) | #wrong |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in res["records"]:
        gpu = f"{r['gpu_us']:.1f}" + (" (gate expired)" if r["gate_expired"] else "")
        lines.append(f"| {r['collective']} | {r['impl']} | {r['size']} | {r['time_us']:.1f} | {r['loop_us']:.1f} | "
                     f"{r['host_us']:.1f} | {gpu} | {r['wrong']} |")
    phased = [r for r in res["records"] if "host_phases_us" in r]
    if phased:
        lines += ["", "Host phases (us per call, inclusive, slowest rank per phase; `python -m conccl.bench.latency "
                  "--phases`): call = call key + local step (validate; only for arguments not seen before) + "
                  "board exchange + settle (plan; only for peers' rows not seen before) + execute (executor run: "
                  "program lookup, driver calls; watchdog track) + the rest.", "",
                  "| collective | implementation | size (B) | " + " | ".join(PHASE_LABELS) + " |",
                  "| --- | --- | --- |" + " --- |" * len(PHASE_LABELS)]
        for r in phased:
            lines.append(f"| {r['collective']} | {r['impl']} | {r['size']} | "
                         + " | ".join(f"{r['host_phases_us'][k]:.1f}" for k in PHASE_LABELS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conccl.bench.latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for latency.json and latency.md")
    ap.add_argument("--impls", default=",".join(DEFAULT_IMPLS), help=f"comma-separated, of {', '.join(NAMES)}")
    add_variant_flags(ap)
    ap.add_argument("--collectives", default=",".join(STUDIED))  # as the committed runs
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="output bytes per rank")
    ap.add_argument("-n", "--iters", type=int, default=100)
    ap.add_argument("-w", "--warmup", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=None)
    ap.add_argument("--phases", action="store_true",
                    help="also time the host phases of each conccl call (call key, board exchange, driver calls...)")
    args = ap.parse_args(argv)
    impls = args.impls.split(",")
    unknown = [i for i in impls if i not in NAMES]
    if unknown:
        ap.error(f"unknown implementation(s) {unknown}; choose from {', '.join(NAMES)}")
    apply_safe_env()
    if torch.cuda.device_count() < 2:
        print("error: the latency benchmark needs at least 2 GPUs", file=sys.stderr)
        return 2
    world = args.gpus or torch.cuda.device_count()
    sizes = [int(s) for s in args.sizes.split(",")]
    os.makedirs(args.out, exist_ok=True)
    records = run_per_gpu(latency_worker, impls, args.collectives.split(","), sizes, args.iters, args.warmup,
                          args.reps, args.phases, variant_of(args), nprocs=args.gpus, timeout_s=900)[0]
    res = {"meta": environment(env.get("CONCCL_MACHINE_KIND"), world), "world": world,
           "variant": variant_of(args).describe(),
           "iters": args.iters, "reps": args.reps, "records": records}
    with open(os.path.join(args.out, "latency.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(os.path.join(args.out, "latency.md"), "w") as f:
        f.write(markdown(res) + "\n")
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
