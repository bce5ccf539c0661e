"""``conccl bench fsdp``: an FSDP2 training step with and without conccl, against no communication.

The model is a stack of Llama-style blocks (RMSNorm, causal attention, SwiGLU), bf16, one
sequence per rank; the defaults (d 4096, ffn 14336, 32 heads, 8 layers) have 1.95 B
parameters. Five configurations run in one process per GPU, one after the other:

- ``no_comm``: the same model unsharded on every rank, the same tokens: the step without
  any communication, the floor the others are judged against;
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
stream and kind, and how much of the copy engines' time ran beside kernels
(:mod:`conccl.bench.fsdp_profile`). :func:`combine` and :func:`markdown`
(:mod:`conccl.bench.fsdp_report`) reduce the ranks' records and write the report.
"""
from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from .. import fsdp
from ..fsdp import copy_free
from . import clocks
from .fsdp_profile import host_profile, iteration, profile_step
# The reduction over ranks and the report: with run_rank, what the CLI runs of this benchmark.
from .fsdp_report import combine, markdown

__all__ = ["CONFIGS", "ModelShape", "FsdpConfig", "Block", "Model", "build", "run_rank", "combine", "markdown"]

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
    # model differ in the last bits (seen on an H200), and a loss compared between configs would
    # say nothing about the collectives. The timed run stays in the default mode.
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
    # each config's GEMMs multiply the same data (a GEMM's speed depends on its data: measured 15%
    # apart on two inputs of one shape, docs/results.md, "Settled pipelines with their marks as
    # graph edges"), and what differs between configs is the communication alone; with a rate,
    # no_comm (each rank its own gradients, bf16 AdamW) and the sharded configs train apart.
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
            before = copy_free.counters()  # FSDP copies skipped, collectives left to FSDP's copies
            sampler = clocks.ClockSampler(clocks.device_uuid(device)) if cfg.clocks else None
            times, peak, loss_timed, opt, host = _train(model, x, cfg, comms, config, sampler)
            direct = {k: v - before[k] for k, v in copy_free.counters().items()}
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
                profiled = host_profile(model, x)
                if rank == 0:
                    rec["host_profile"] = profiled
            if cfg.profile and rank == 0:
                trace = None
                if cfg.trace_dir:
                    os.makedirs(cfg.trace_dir, exist_ok=True)
                    trace = os.path.join(cfg.trace_dir, f"{config}_{tokens}.json.gz")
                rec["profile"] = profile_step(model, x, _stepper(config, opt, comms), trace)
            elif cfg.profile:  # the peers take part in the profiled iteration and the one before it
                for _ in range(2):
                    iteration(model, x, _stepper(config, opt, comms))
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
