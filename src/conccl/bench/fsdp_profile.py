"""What one iteration of ``conccl bench fsdp`` spends, profiled on rank 0: GPU time per stream
and kind (:func:`profile_step`, under torch.profiler), how much of the copy engines' time ran
beside kernels (:func:`overlap`), and the host's time by function (:func:`host_profile`, under
cProfile).
"""
from __future__ import annotations

import cProfile
import gc
import gzip
import json
import pstats
import shutil
import tempfile
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

HOST_PROFILE_STEPS = 4
HOST_PROFILE_ROWS = 25


def iteration(model, x, step) -> None:
    """One untimed iteration: forward, backward, ``step()``, zero_grad."""
    model(x).float().pow(2).mean().backward()
    step()
    model.zero_grad(set_to_none=True)


def profile_step(model, x, step, trace: str | None = None) -> dict:
    """Kernel and copy time per stream of one whole iteration (rank 0: forward, backward,
    ``step()``, zero_grad), by kind; and under "overlap", the copy engines' time beside kernels.
    One iteration runs before, unprofiled: the profiled one starts as a timed one does (after
    a step, which may have issued its first gather)."""
    iteration(model, x, step)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        iteration(model, x, step)
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        if trace:
            with open(f.name, "rb") as src, gzip.open(trace, "wb") as dst:
                shutil.copyfileobj(src, dst)
        trace = json.load(open(f.name))
    per = defaultdict(lambda: defaultdict(float))
    spans = {"kernel": [], "gpu_memcpy": []}
    for ev in trace.get("traceEvents", []):
        cat = ev.get("cat", "")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        stream = f"stream {ev.get('args', {}).get('stream', ev.get('tid'))}"
        per[stream][classify(ev.get("name", ""), cat)] += ev.get("dur", 0) / 1e3
        if cat in spans:
            spans[cat].append((ev["ts"], ev["ts"] + ev.get("dur", 0)))
    out = {s: {k: round(v, 3) for k, v in sorted(kinds.items())} for s, kinds in sorted(per.items())}
    out["overlap"] = overlap(spans["kernel"], spans["gpu_memcpy"])
    return out


def _union(spans: list) -> list:
    merged = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def overlap(kernels: list, copies: list) -> dict:
    """From (start, end) microsecond spans of every kernel and every copy-engine copy of a
    profiled iteration, ms: its span (first to last activity), the time some kernel ran, some
    copy ran, a copy ran with no kernel anywhere (exposed copies), and nothing ran (idle); and
    the longest stretches of exposed copies, as [ms from the first activity, ms long]."""
    k, c = _union(kernels), _union(copies)
    alone = []  # (start, end) of copy time with no kernel running
    i = 0
    for a, b in c:  # both unions sorted and disjoint: one sweep
        while i < len(k) and k[i][1] <= a:
            i += 1
        cur, n = a, i
        while n < len(k) and k[n][0] < b:
            if k[n][0] > cur:
                alone.append((cur, k[n][0]))
            cur = max(cur, k[n][1])
            n += 1
        if cur < b:
            alone.append((cur, b))
    busy_k, busy_c = sum(b - a for a, b in k), sum(b - a for a, b in c)
    both = busy_c - sum(b - a for a, b in alone)
    every = k + c
    span = (max(b for _, b in every) - min(a for a, _ in every)) if every else 0.0
    first = min(a for a, _ in every) if every else 0.0
    longest = sorted(((b - a, a) for a, b in alone if b > a), key=lambda t: (-t[0], t[1]))[:8]
    return {"span_ms": span / 1e3, "kernel_ms": busy_k / 1e3, "copy_ms": busy_c / 1e3,
            "copy_beside_kernels_ms": both / 1e3, "copy_alone_ms": (busy_c - both) / 1e3,
            "idle_ms": (span - (busy_k + busy_c - both)) / 1e3,
            "copy_alone_longest": [[round((a - first) / 1e3, 3), round(d / 1e3, 3)] for d, a in longest]}


def host_profile(model, x, steps: int = HOST_PROFILE_STEPS) -> dict:
    """The host's time per forward+backward by function, under cProfile (every rank runs the
    steps; each profiles its own): the top functions by own time and by cumulative time, ms per
    step. cProfile slows Python code several-fold: compare configurations, not absolute times."""
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    prof = cProfile.Profile()
    collections = []  # Python's garbage collections during the steps: [generation, seconds]

    def on_gc(phase, info):
        if phase == "start":
            collections.append([info["generation"], time.perf_counter()])
        elif collections:
            collections[-1][1] = time.perf_counter() - collections[-1][1]

    gc.callbacks.append(on_gc)
    t0 = time.perf_counter()
    prof.enable()
    try:
        for _ in range(steps):
            model(x).float().pow(2).mean().backward()
    finally:
        prof.disable()
        gc.callbacks.remove(on_gc)
    wall = (time.perf_counter() - t0) * 1e3 / steps
    sync()
    model.zero_grad(set_to_none=True)
    stats = pstats.Stats(prof).stats

    def name(key):
        path, line, fn = key
        parts = path.replace("\\", "/").split("/")
        tail = "/".join(parts[-2:]) if "site-packages" in path or "conccl" in path else path
        return f"{tail}:{line}({fn})"

    rows = [(name(k), nc, tt * 1e3 / steps, ct * 1e3 / steps) for k, (_, nc, tt, ct, _) in stats.items()]

    def top(i):
        return [{"function": f, "calls_per_step": nc / steps, "own_ms": tt, "cumulative_ms": ct}
                for f, nc, tt, ct in sorted(rows, key=lambda r: -r[i])[:HOST_PROFILE_ROWS]]
    # A collection runs inside whatever function allocated last, as that function's own time.
    gc_ms = {f"generation {g}": sum(t for gen, t in collections if gen == g) * 1e3 / steps for g in (0, 1, 2)}
    return {"steps": steps, "host_ms_per_step_profiled": wall, "gc_ms_per_step": gc_ms,
            "gc_collections_per_step": len(collections) / steps, "by_own_time": top(2), "by_cumulative_time": top(3)}


def classify(name: str, cat: str = "kernel") -> str:
    """The kind of a GPU activity for the per-stream table."""
    if cat == "gpu_memcpy":
        return "memcpy (copy engine)"
    if cat == "gpu_memset":
        return "memset"
    n = name.lower()
    if "nccl" in n:
        return "collective kernel (NCCL)"
    if n.startswith("reduce_"):  # conccl's kernels (conccl.kernels.reduce)
        return "collective kernel (conccl reduction)"
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "xmma", "cublas")):
        return "gemm"
    if any(k in n for k in ("copy", "chunk_cat", "catarray", "split_with_sizes")):
        return "copy kernel"
    return "other kernel"
