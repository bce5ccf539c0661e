"""``conccl bench fsdp``: an FSDP2 training step with and without conccl, against no communication.

The model is a stack of Llama-style blocks (RMSNorm, causal attention, SwiGLU), bf16, one
sequence per rank; the defaults (d 4096, ffn 14336, 32 heads, 8 layers) have 1.95 B
parameters. Four configurations run in one process per GPU, one after the other:

- ``no_comm``: the same model unsharded on every rank, the same tokens: the step without
  any communication, the floor the other two are judged against;
- ``stock``: every block and the root wrapped by ``fully_shard`` (NCCL), as torchtitan wraps a
  model: every block but the last resharded after forward;
- ``conccl``: the same, then ``conccl.fsdp.enable``;
- ``conccl_direct``: the same with ``direct=True`` (none of FSDP's copies: :mod:`conccl.fsdp.copy_free`;
  the record counts the copies skipped and the collectives left to FSDP's copies);
- ``conccl_direct_prefetch``: the same, the optimizer stepped by ``FsdpComms.step_and_prefetch``
  (the next forward's first all-gather beside the optimizer's update).

Each trains ``train_steps`` AdamW steps from the same seed and data. Forward + backward of
every step after ``warmup`` is timed with CUDA events on the default stream (FSDP's root
waits there for the last reduce-scatter); the figure is the median over steps of the slowest
rank. The loss is that of one more forward after training. Peak memory is the caching
allocator's peak during the timed steps plus conccl's symmetric workspace (not in the
allocator's statistics). One more iteration runs under the profiler (rank 0): kernel time per
stream and kind, and how much of the copy engines' time ran beside kernels.
"""
from __future__ import annotations

import gc
import gzip
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.profiler import ProfilerActivity, profile

from .. import fsdp
from ..fsdp import copy_free as fsdp_direct
from . import clocks

CONFIGS = ("no_comm", "stock", "conccl", "conccl_direct", "conccl_direct_prefetch")


@dataclass(frozen=True)
class ModelShape:
    dim: int = 4096
    ffn: int = 14336
    heads: int = 32
    layers: int = 8

    def parameters(self) -> int:
        return self.layers * (4 * self.dim * self.dim + 3 * self.dim * self.ffn + 2 * self.dim)


@dataclass(frozen=True)
class FsdpConfig:
    shape: ModelShape
    tokens: tuple[int, ...] = (2048, 8192)
    configs: tuple[str, ...] = CONFIGS
    warmup: int = 3
    train_steps: int = 20
    profile: bool = True
    # Train each config a second time under torch.use_deterministic_algorithms for the loss:
    # flash attention's default backward accumulates dq with atomics, so two runs of the same
    # model differ in the last bits (a probe on one H200, commit e612c92), and a loss compared between
    # configs would say nothing about the collectives. The timed run stays in the default mode.
    deterministic_loss: bool = True
    # FSDP2's usual mixed precision: fp32 parameters (and optimizer), bf16 gathers and compute,
    # gradients reduced in fp32 (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)).
    # no_comm then is the bf16 model (the same compute; its bf16 AdamW over every parameter
    # moves about the bytes of the fp32 AdamW over a 2-rank shard).
    mixed_precision: bool = False
    # Run a few more forward+backward steps under cProfile (rank 0) after the timed run: where
    # the host's time per step goes, by function (the 2048-token step is host-bound).
    host_profile: bool = False
    # conccl.fsdp.enable(cast_once=): under mixed precision, the backward's gathers read the
    # forward's cast (False: cast at every gather, as FSDP does)
    cast_once: bool = True
    # a folder for rank 0's profiled iteration per config, as a gzipped Chrome trace
    trace_dir: str | None = None
    # AdamW's learning rate. 0: every step runs the same kernels and the weights never change, so
    # each config's GEMMs multiply the same data (a GEMM's speed depends on its data: session 15
    # found 15% between two inputs of one shape), and what differs between configs is the
    # communication alone; with a rate, no_comm (each rank its own gradients, bf16 AdamW) and the
    # sharded configs train apart.
    lr: float = 1e-4
    # Sample each rank's SM clock with nvidia-smi during the timed steps (conccl.bench.clocks):
    # how much of a gap between configs the power-capped clock could explain; compare configs
    # run in separate processes (in one, the later config ran at the lower clock). Costs host time.
    clocks: bool = False


class Block(nn.Module):
    def __init__(self, s: ModelShape):
        super().__init__()
        self.heads = s.heads
        self.norm1, self.norm2 = nn.RMSNorm(s.dim), nn.RMSNorm(s.dim)
        self.qkv = nn.Linear(s.dim, 3 * s.dim, bias=False)
        self.out = nn.Linear(s.dim, s.dim, bias=False)
        self.gate_up = nn.Linear(s.dim, 2 * s.ffn, bias=False)
        self.down = nn.Linear(s.ffn, s.dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(a)
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Model(nn.Module):
    def __init__(self, s: ModelShape):
        super().__init__()
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x


def build(config: str, shape: ModelShape, device, mixed_precision: bool = False, cast_once: bool = True):
    """The model of ``config`` on ``device`` (the same initial weights in every config); with
    ``mixed_precision``, fp32 parameters sharded under FSDP2's bf16/fp32 policy (no_comm: bf16)."""
    torch.manual_seed(0)
    fp32 = mixed_precision and config != "no_comm"
    model = Model(shape).to(device=device, dtype=torch.float32 if fp32 else torch.bfloat16)
    comms = None
    if config != "no_comm":
        kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} if fp32 else {}
        for i, blk in enumerate(model.blocks):
            # as torchtitan wraps a model: the last block is not resharded after forward, as
            # backward needs it again at once (resharded, its gather would stand alone there)
            fully_shard(blk, reshard_after_forward=i < len(model.blocks) - 1, **kw)
        fully_shard(model, **kw)
        if config.startswith("conccl"):
            direct = config.startswith("conccl_direct")
            comms = fsdp.enable(model, direct=direct, **({"cast_once": cast_once} if direct else {}))
    return model, comms


def _board_counts(comms) -> tuple[int, int]:
    """(calls that posted their row without waiting for the peers', exchanges in all) on
    conccl's groups' boards (Options.post_settled)."""
    if comms is None:
        return 0, 0
    boards = [p.group.board for p in comms.pools.values()]
    return sum(b.posts for b in boards), sum(b.count for b in boards)


def _compiled(comms) -> tuple[int, float, int]:
    """(copy-engine programs conccl's groups have compiled, host seconds spent compiling or
    re-addressing them, programs re-addressed): a call whose buffers moved re-addresses a
    program of its shape, or compiles one where there is none yet."""
    if comms is None:
        return 0, 0.0, 0
    executors = [p.group.executor for p in comms.pools.values()]
    return (sum(getattr(e, "programs_compiled", 0) for e in executors),
            sum(getattr(e, "program_compile_s", 0.0) for e in executors),
            sum(getattr(e, "programs_readdressed", 0) for e in executors))


def _segments(torch) -> list:
    """The caching allocator's segments now, per stream they were made on (largest first):
    ``[{"stream": "compute" or an id, "segments", "reserved_gib", "allocated_gib"}]``. What holds
    reserved memory that is not allocated: a block freed on one stream is reused only by that
    stream's allocations, and one marked with ``record_stream`` only once the marked stream passed."""
    compute = torch.cuda.current_stream().cuda_stream
    by = {}
    for seg in torch.cuda.memory_snapshot():
        key = "compute" if seg.get("stream") == compute else str(seg.get("stream"))
        n, total, used = by.get(key, (0, 0, 0))
        by[key] = (n + 1, total + seg.get("total_size", 0), used + seg.get("allocated_size", 0))
    rows = [{"stream": k, "segments": n, "reserved_gib": t / 2**30, "allocated_gib": u / 2**30}
            for k, (n, t, u) in by.items()]
    return sorted(rows, key=lambda r: -r["reserved_gib"])


def _stepper(config: str, opt, comms):
    """The optimizer step of ``config``: ``FsdpComms.step_and_prefetch`` or the plain one."""
    if config == "conccl_direct_prefetch" and comms is not None:
        return lambda: comms.step_and_prefetch(opt)
    return opt.step


def _train(model, x, cfg: FsdpConfig, comms=None, config: str = "", sampler=None):
    """(per-step fwd+bwd ms after warm-up, peak allocator bytes, loss after training, optimizer,
    host: {programs compiled and seconds compiling them during the timed steps, per-step host ms
    to queue fwd+bwd, per-step ms of the whole iteration: fwd, bwd, optimizer step, zero_grad}).
    A step whose host time nears its GPU time is bound by the host. ``sampler`` (a
    :class:`conccl.bench.clocks.ClockSampler`) samples the timed steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, foreach=True)
    step_fn = _stepper(config, opt, comms)
    pairs, host_ms, whole = [], [], []
    compiled, boards = (0, 0.0, 0), (0, 0)
    try:
        for step in range(cfg.train_steps):
            if step == cfg.warmup:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                compiled, boards = _compiled(comms), _board_counts(comms)
                if sampler is not None:
                    sampler.start()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            loss = model(x).float().pow(2).mean()
            loss.backward()
            end.record()
            if step >= cfg.warmup:
                pairs.append((start, end))
                host_ms.append(1e3 * (time.perf_counter() - t0))
            step_fn()
            opt.zero_grad(set_to_none=True)
            if step >= cfg.warmup:
                done = torch.cuda.Event(enable_timing=True)
                done.record()
                whole.append((start, done))
        torch.cuda.synchronize()
    finally:  # also where a step fails: the sampler is a subprocess
        if sampler is not None:
            sampler.stop()
    times = [s.elapsed_time(e) for s, e in pairs]
    # allocated and reserved: a block freed with record_stream (conccl_direct's parameters) leaves
    # the allocated count at once but is reused only once the other stream caught up
    free, total = torch.cuda.mem_get_info()  # the driver's count: every allocator, pool and library
    peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), total - free, _segments(torch))
    now, boards_now = _compiled(comms), _board_counts(comms)
    host = {"programs_compiled": now[0] - compiled[0], "compile_s": now[1] - compiled[1], "host_ms": host_ms,
            "programs_readdressed": now[2] - compiled[2], "iteration_ms": [s.elapsed_time(e) for s, e in whole],
            "board_posts": boards_now[0] - boards[0], "board_exchanges": boards_now[1] - boards[1]}
    with torch.no_grad():
        final = model(x).float().pow(2).mean().item()
    return times, peak, final, opt, host


def _iteration(model, x, step) -> None:
    """One untimed iteration: forward, backward, ``step()``, zero_grad."""
    model(x).float().pow(2).mean().backward()
    step()
    model.zero_grad(set_to_none=True)


def _profile_step(model, x, step, trace: str | None = None) -> dict:
    """Kernel and copy time per stream of one whole iteration (rank 0: forward, backward,
    ``step()``, zero_grad), by kind; and under "overlap", the copy engines' time beside kernels.
    One iteration runs before, unprofiled: the profiled one starts as a timed one does (after
    a step, which may have issued its first gather)."""
    _iteration(model, x, step)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        _iteration(model, x, step)
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


HOST_PROFILE_STEPS = 4
HOST_PROFILE_ROWS = 25


def _host_profile(model, x, steps: int = HOST_PROFILE_STEPS) -> dict:
    """The host's time per forward+backward by function, under cProfile (every rank runs the
    steps; each profiles its own): the top functions by own time and by cumulative time, ms per
    step. cProfile slows Python code several-fold: compare configurations, not absolute times."""
    import cProfile
    import pstats

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
    if n.startswith("reduce_"):  # conccl's kernels (executors/cuda_reduce.py)
        return "collective kernel (conccl reduction)"
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "xmma", "cublas")):
        return "gemm"
    if any(k in n for k in ("copy", "chunk_cat", "catarray", "split_with_sizes")):
        return "copy kernel"
    return "other kernel"


def run_rank(rank: int, world: int, cfg: FsdpConfig) -> list[dict]:
    """Every (tokens, config) record of this rank (the caller reduces over ranks)."""
    device = torch.device("cuda", torch.cuda.current_device())
    out = []
    for tokens in cfg.tokens:
        g = torch.Generator(device=device).manual_seed(1000 + rank)
        x = torch.randn(1, tokens, cfg.shape.dim, generator=g, device=device, dtype=torch.bfloat16)
        for config in cfg.configs:
            loss = None
            if cfg.deterministic_loss:
                loss = _deterministic_loss(config, x, cfg, device)
            free, total = torch.cuda.mem_get_info()
            used_before = total - free  # what the process held before this configuration
            model, comms = build(config, cfg.shape, device, cfg.mixed_precision, cfg.cast_once)
            dist.barrier()
            before = fsdp_direct.counters()  # FSDP copies skipped, collectives left to FSDP's copies
            sampler = clocks.ClockSampler(clocks.device_uuid(device)) if cfg.clocks else None
            times, peak, loss_timed, opt, host = _train(model, x, cfg, comms, config, sampler)
            direct = {k: v - before[k] for k, v in fsdp_direct.counters().items()}
            extra = 0
            if comms is not None:
                extra = sum(m["workspace_bytes"] for m in comms.memory().values())
            rec = {"tokens_per_rank": tokens, "config": config, "rank": rank, "times_ms": times,
                   "iteration_ms": host["iteration_ms"], "host_ms": host["host_ms"],
                   "peak_alloc_bytes": peak[0], "peak_reserved_bytes": peak[1], "conccl_workspace_bytes": extra,
                   "device_used_before_bytes": used_before, "device_used_after_bytes": peak[2],
                   "segments_by_stream": peak[3],
                   "loss": loss_timed if loss is None else loss, "loss_deterministic": loss is not None,
                   "loss_timed_run": loss_timed, "clocks": sampler.summary() if sampler is not None else None,
                   "conccl": None if comms is None else {"modules": len(comms.modules), "fallback": comms.fallback,
                                                         "memory": comms.memory(), "direct": direct,
                                                         "programs_compiled_timed": host["programs_compiled"],
                                                         "program_compile_s_timed": host["compile_s"],
                                                         "programs_readdressed_timed": host["programs_readdressed"],
                                                         "board_posts_timed": host["board_posts"],
                                                         "board_exchanges_timed": host["board_exchanges"]}}
            if cfg.host_profile:
                host_profile = _host_profile(model, x)
                if rank == 0:
                    rec["host_profile"] = host_profile
            if cfg.profile and rank == 0:
                trace = None
                if cfg.trace_dir:
                    os.makedirs(cfg.trace_dir, exist_ok=True)
                    trace = os.path.join(cfg.trace_dir, f"{config}_{tokens}.json.gz")
                rec["profile"] = _profile_step(model, x, _stepper(config, opt, comms), trace)
            elif cfg.profile:  # the peers take part in the profiled iteration and the one before it
                for _ in range(2):
                    _iteration(model, x, _stepper(config, opt, comms))
                torch.cuda.synchronize()
            out.append(rec)
            del model, opt, comms
            gc.collect()
            torch.cuda.empty_cache()
            dist.barrier()
    return out


def _deterministic_loss(config: str, x, cfg: FsdpConfig, device) -> float:
    """The loss after ``cfg.train_steps`` steps of ``config`` under deterministic algorithms."""
    torch.use_deterministic_algorithms(True)
    try:
        model, comms = build(config, cfg.shape, device, cfg.mixed_precision, cfg.cast_once)
        dist.barrier()
        _, _, loss, opt, _ = _train(model, x, cfg, comms, config)
    finally:
        torch.use_deterministic_algorithms(False)
    del model, comms, opt
    gc.collect()
    torch.cuda.empty_cache()
    return loss


def _slowest(recs, key: str) -> list | None:
    """Per timed step, the slowest rank's ``key`` time; None where a rank has none."""
    if not all(r.get(key) for r in recs):
        return None
    return [max(ts) for ts in zip(*(r[key] for r in recs))]


def combine(per_rank: list[list[dict]]) -> list[dict]:
    """One record per (tokens, config): the slowest rank of each step, then the median."""
    results = []
    for recs in zip(*per_rank):
        r0 = recs[0]
        slowest = _slowest(recs, "times_ms")
        # the whole iteration (forward, backward, optimizer step, zero_grad)
        whole = _slowest(recs, "iteration_ms")
        peak = max(r["peak_alloc_bytes"] + r["conccl_workspace_bytes"] for r in recs)
        results.append({
            "tokens_per_rank": r0["tokens_per_rank"], "config": r0["config"],
            "step_ms": statistics.median(slowest), "step_ms_spread": [min(slowest), max(slowest)],
            "steps_timed": len(slowest), "peak_mem_gib": peak / 2**30,
            "iteration_ms": statistics.median(whole) if whole else None,
            "iteration_ms_spread": [min(whole), max(whole)] if whole else None,
            # the host's time to queue a step's fwd+bwd, the slowest rank's, median over steps
            "host_ms": statistics.median(host) if (host := _slowest(recs, "host_ms")) else None,
            "peak_alloc_gib": max(r["peak_alloc_bytes"] for r in recs) / 2**30,
            "peak_reserved_gib": max(r.get("peak_reserved_bytes", 0) for r in recs) / 2**30,
            "conccl_workspace_gib": max(r["conccl_workspace_bytes"] for r in recs) / 2**30,
            # the driver's count after the timed steps (the caching allocator keeps its peak
            # segments: about the peak), and what this configuration added to the process's
            "device_used_gib": max(r.get("device_used_after_bytes", 0) for r in recs) / 2**30,
            "device_added_gib": max(r.get("device_used_after_bytes", 0) - r.get("device_used_before_bytes", 0)
                                    for r in recs) / 2**30,
            "loss": r0["loss"], "loss_per_rank": [r["loss"] for r in recs],
            "loss_deterministic": r0.get("loss_deterministic", False), "loss_timed_run": r0.get("loss_timed_run"),
            "conccl": r0["conccl"], "profile_rank0": r0.get("profile"),
            "clocks_per_rank": [r.get("clocks") for r in recs],
            "segments_by_stream_rank0": r0.get("segments_by_stream"), "host_profile_rank0": r0.get("host_profile"),
        })
    return results


def markdown(doc: dict) -> str:
    meta, res = doc, doc["results"]
    lr = meta.get("config", {}).get("lr", 1e-4)
    lines = [f"# conccl bench fsdp: {meta['machine_kind']}, {meta.get('device')} x {meta.get('world')}", "",
             f"commit {meta['commit']}, {meta['date']}, torch {meta['torch']}, NCCL {meta['nccl']}. Model: "
             f"{meta['model']['layers']} blocks, d {meta['model']['dim']}, ffn {meta['model']['ffn']}, "
             f"{meta['model']['heads']} heads, "
             + ("fp32 parameters under MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (no_comm: the bf16 "
                "model)" if meta.get("config", {}).get("mixed_precision") else "bf16")
             + f", {meta['model']['parameters'] / 1e9:.2f} B parameters; AdamW at lr {lr:g}"
             + (" (the weights never change: every config multiplies the same data)" if lr == 0 else "") + "; one "
             "sequence per rank. Step = forward + backward; iteration = forward, backward, optimizer step "
             "and zero_grad; CUDA events, median over steps of the slowest rank. "
             + ("Loss: one forward after the same training run again under torch.use_deterministic_algorithms "
                "(the timed run's attention backward is not reproducible bit for bit)."
                if res and res[0].get("loss_deterministic") else "Loss: one forward after the timed run."),
             "", "| tokens per rank | config | step (ms) | spread (ms) | x no_comm | iteration (ms) | spread (ms) "
             "| x no_comm | peak memory (GiB) | peak reserved (GiB) "
             "| device used, driver (GiB) | added by the config (GiB) | loss after training |",
             "| ---: | --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    base = {r["tokens_per_rank"]: r["step_ms"] for r in res if r["config"] == "no_comm"}
    base_it = {r["tokens_per_rank"]: r.get("iteration_ms") for r in res if r["config"] == "no_comm"}
    for r in res:
        ratio = f"{r['step_ms'] / base[r['tokens_per_rank']]:.3f}" if r["tokens_per_rank"] in base else "-"
        lo, hi = r["step_ms_spread"]
        it, it_base = r.get("iteration_ms"), base_it.get(r["tokens_per_rank"])
        whole = "- | - | -" if it is None else (
            f"{it:.2f} | {r['iteration_ms_spread'][0]:.2f}-{r['iteration_ms_spread'][1]:.2f} | "
            + (f"{it / it_base:.3f}" if it_base else "-"))
        lines.append(f"| {r['tokens_per_rank']} | {r['config']} | {r['step_ms']:.2f} | {lo:.2f}-{hi:.2f} | {ratio} | "
                     f"{whole} | "
                     f"{r['peak_mem_gib']:.2f} | {r.get('peak_reserved_gib', 0):.2f} | {r.get('device_used_gib', 0):.2f} | "
                     f"{r.get('device_added_gib', 0):.2f} | {r['loss']!r} |")
    for r in res:
        c = r.get("conccl") or {}
        said = []
        if "programs_compiled_timed" in c:  # buffers that move between steps compile on every call
            spent = c.get("program_compile_s_timed")
            said.append(f"{c['programs_compiled_timed']} copy-engine programs compiled"
                        + (f" and {c['programs_readdressed_timed']} re-addressed" if "programs_readdressed_timed" in c
                           else "") + " during the timed steps"
                        + (f" ({1e3 * spent:.1f} ms of host time)" if spent is not None else ""))
        if c.get("board_exchanges_timed"):
            said.append(f"{c['board_posts_timed']} of its {c['board_exchanges_timed']} calls on the host board during the "
                        "timed steps posted their row without waiting for the peers'")
        segs = r.get("segments_by_stream_rank0")
        if segs:
            said.append("the caching allocator's segments after the timed steps, per stream made on: " + ", ".join(
                f"{g['stream']} {g['reserved_gib']:.2f} GiB reserved / {g['allocated_gib']:.2f} allocated "
                f"({g['segments']} segments)" for g in segs[:4]))
        if r.get("host_ms") is not None:
            said.append(f"the host queued a step's forward and backward in {r['host_ms']:.2f} ms (median, slowest rank)")
        d = c.get("direct")
        if r["config"].startswith("conccl_direct") and d:
            cast = ""
            if d.get("cast_gathers"):
                reused = f", {d['reused_casts']} backward all-gathers read their forward's cast" \
                    if d.get("reused_casts") else ""
                cast = f" ({d['cast_gathers']} made one cast into a cast home instead{reused})"
            said.append(f"{d['skipped_copy_outs']} all-gather copy-outs, {d.get('skipped_gather_copy_ins', 'n/a')} "
                        f"all-gather copy-ins{cast} and {d['skipped_copy_ins']} reduce-scatter copy-ins skipped; "
                        f"{d['declined_gathers']} all-gathers and {d['declined_reduces']} reduce-scatters left to "
                        "FSDP's copies")
        if said:
            lines += ["", f"{r['config']}, {r['tokens_per_rank']} tokens (rank 0, timed run): " + "; ".join(said) + "."]
        clk = r.get("clocks_per_rank") or []
        if any(clk):
            lines += ["", f"{r['config']}, {r['tokens_per_rank']} tokens: the SM clock over the timed steps "
                          "(nvidia-smi), median while the power cap held it: " + ", ".join(
                              f"rank {i} " + clocks.describe(c) for i, c in enumerate(clk)) + "."]
    for r in res:
        prof = r.get("profile_rank0")
        if not prof:
            continue
        streams = {k: v for k, v in prof.items() if k != "overlap"}
        kinds = sorted({k for s in streams.values() for k in s})
        lines += ["", f"## {r['config']}, {r['tokens_per_rank']} tokens: GPU time per stream in one iteration (ms, "
                      "rank 0)", "", "| stream | " + " | ".join(kinds) + " |", "| --- |" + " ---: |" * len(kinds)]
        for stream, by in streams.items():
            lines.append(f"| {stream} | " + " | ".join(f"{by.get(k, 0):.2f}" for k in kinds) + " |")
        o = prof.get("overlap")
        if o:
            lines += ["", f"From first to last activity {o['span_ms']:.2f} ms: kernels ran {o['kernel_ms']:.2f} ms, "
                          f"copy engines {o['copy_ms']:.2f} ms ({o['copy_beside_kernels_ms']:.2f} beside a kernel, "
                          f"{o['copy_alone_ms']:.2f} with none running), nothing {o['idle_ms']:.2f} ms."
                      + (" Longest exposed copies (ms into the iteration: ms long): " + ", ".join(
                          f"{at:.2f}: {ms:.2f}" for at, ms in o["copy_alone_longest"]) + "."
                         if o.get("copy_alone_longest") else "")]
    for r in res:
        hp = r.get("host_profile_rank0")
        if not hp:
            continue
        lines += ["", f"## {r['config']}, {r['tokens_per_rank']} tokens: host time by function (cProfile, rank 0, "
                      f"{hp['steps']} steps, {hp['host_ms_per_step_profiled']:.1f} ms per step profiled)", "",
                  "Python's garbage collector per step: " + (", ".join(f"{k} {v:.2f} ms" for k, v in
                                                                      hp.get("gc_ms_per_step", {}).items()) or "n/a")
                  + f" ({hp.get('gc_collections_per_step', 0):.1f} collections)", "",
                  "| function (by own time) | calls per step | own ms per step | cumulative ms per step |",
                  "| --- | ---: | ---: | ---: |"]
        for row in hp["by_own_time"]:
            lines.append(f"| `{row['function']}` | {row['calls_per_step']:.0f} | {row['own_ms']:.2f} | "
                         f"{row['cumulative_ms']:.2f} |")
    return "\n".join(lines) + "\n"
