"""``conccl bench``: an nccl-tests-style sweep of every implementation, plus an overlap column.

Per size and implementation, as nccl-tests and the paper measure: a correctness run against a
known pattern (#wrong counts wrong elements), ``-w`` warm-ups, then ``-n`` timed iterations,
each between two CUDA events, ranks aligned by a barrier first; the per-iteration times of the
slowest rank count, and the median and spread (min..max) are reported. The overlap column runs
a bf16 8192^3 GEMM on another stream while the collective repeats beside it (both held behind
one GPU-side gate so that they start together) and reports how much slower the GEMM got than
alone, the slowest rank's figure.
"""
from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from .. import collectives
from ..collectives import Collective
from ..launch import run_per_gpu
from . import report
from .impls import Variant, implementations

GEMM_N = 8192


@dataclass
class BenchConfig:
    sizes: list[int]
    collectives: list[str]
    impls: list[str]
    variant: Variant = Variant()  # how the conccl and conccl_persistent implementations call
    dtype: str = "bfloat16"
    iters: int = 20
    warmup: int = 5
    check: bool = True
    overlap: bool = True
    profile: bool = True
    meta: dict = field(default_factory=dict)


def _pattern(nbytes: int, a: int, b: int, device):
    i = torch.arange(nbytes, dtype=torch.int32, device=device)
    return ((i * 7 + (a * 13 + b * 29 + 1)) % 251).to(torch.uint8)


def _values(nbytes: int, a: int, b: int, dtype, device):
    """Whole numbers in -3..3 as ``dtype``: any reduction of a few of them is exact in every dtype."""
    n = nbytes // torch.empty((), dtype=dtype).element_size()
    i = torch.arange(n, dtype=torch.int32, device=device)
    return ((i * 3 + a * 5 + b * 11 + 1) % 7 - 3).to(dtype).view(torch.uint8)


def make_case(coll: Collective, size: int, world: int, rank: int, dtype, device):
    """Input, output and the exact bytes every correct output holds, for ``size`` output bytes
    per rank, from the collective's layout: input chunk ``j`` of rank ``r`` holds a pattern of
    (r, j), and output chunk ``c`` the pattern of the chunk its layout names as its source.

    A reducing collective (an output chunk with several sources) gets small whole numbers
    instead, and its expected bytes from its reference on every rank's input (which this
    rank then holds in full: world times its input)."""
    esize = torch.empty((), dtype=dtype).element_size()
    lay = coll.layout(world, rank)
    chunk = lay.chunk_bytes(size)
    if all(len(srcs) == 1 for srcs in lay.sources):  # every output byte is one input byte
        inp = torch.cat([_pattern(chunk, rank, j, device) for j in range(lay.input_chunks)])
        expected = torch.cat([_pattern(chunk, r, j, device) for ((r, j),) in lay.sources])
    else:
        inputs = [torch.cat([_values(chunk, r, j, dtype, device) for j in range(lay.input_chunks)]).view(dtype)
                  for r in range(world)]
        inp = inputs[rank].view(torch.uint8)
        expected = coll.reference(inputs, rank).contiguous().view(-1).view(torch.uint8)
    out = torch.empty(size // esize, dtype=dtype, device=device)
    return inp.view(dtype), out, expected


def round_size(size: int, world: int, esize: int) -> int:
    unit = world * esize
    return max(unit, size // unit * unit)


def max_bytes(colls, sizes, world: int, esize: int) -> int:
    """The largest buffer, input or output, of any size of any of ``colls``: what the
    implementations' symmetric arenas hold."""
    rounded = [round_size(s, world, esize) for s in sizes]
    return max(max(size, c.input_bytes(size, world)) for c in colls for size in rounded)


def _wrong_elements(out, expected, esize: int) -> int:
    diff = out.contiguous().view(-1).view(expected.dtype) != expected
    return int(diff.view(-1, esize).any(dim=1).sum())


def _kernels_per_call(run) -> float:
    torch.cuda.synchronize()
    with warnings.catch_warnings(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        warnings.simplefilter("ignore")
        for _ in range(2):
            run()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    return sum("memcpy" not in n.lower() and "memset" not in n.lower() for n in names) / 2


def _timed(run, iters: int, warmup: int):
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    dist.barrier()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        run()
        e.record()
    torch.cuda.synchronize()
    us = torch.tensor([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)], device="cuda")
    dist.all_reduce(us, op=dist.ReduceOp.MAX)  # the slowest rank counts, iteration by iteration
    return us.cpu().tolist()


class OverlapProbe:
    """Times a bf16 GEMM alone and beside a repeating collective, both behind one gate."""

    def __init__(self):
        g = torch.Generator(device="cuda").manual_seed(0)
        self.a = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device="cuda", generator=g)
        self.b = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device="cuda", generator=g)
        self.c = torch.empty_like(self.a)
        self.gate, self.comm, self.compute = (torch.cuda.Stream() for _ in range(3))
        for _ in range(5):
            torch.mm(self.a, self.b, out=self.c)
        torch.cuda.synchronize()

    def _once(self, run, repeats: int) -> tuple[float, bool]:
        dist.barrier()
        gate_done = torch.cuda.Event()
        with torch.cuda.stream(self.gate):
            torch.cuda._sleep(40_000_000)  # ~20 ms: covers the host's enqueueing below
            gate_done.record()
        self.comm.wait_event(gate_done)
        self.compute.wait_event(gate_done)
        with torch.cuda.stream(self.comm):
            for _ in range(repeats):
                run()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.compute):
            s.record()
            torch.mm(self.a, self.b, out=self.c)
            e.record()
        gate_held = not gate_done.query()
        torch.cuda.synchronize()
        return s.elapsed_time(e) * 1e3, gate_held

    def slowdown(self, run, coll_us: float, reps: int = 3) -> dict:
        alone, beside, held = [], [], True
        for _ in range(reps):
            t, h = self._once(lambda: None, 0)
            alone.append(t)
            # Every rank must queue the same number of collectives: agree on the largest.
            repeats = torch.tensor([math.ceil(1.2 * alone[-1] / max(coll_us, 1.0))], device="cuda")
            dist.all_reduce(repeats, op=dist.ReduceOp.MAX)
            t, h2 = self._once(run, max(1, int(repeats)))
            beside.append(t)
            held &= h and h2
        x = torch.tensor([statistics.median(beside) / statistics.median(alone) - 1.0, float(not held)], device="cuda")
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return {"gemm_alone_us": statistics.median(alone), "gemm_beside_us": statistics.median(beside),
                "gemm_slowdown": float(x[0]), "gate_expired": bool(x[1] > 0)}


def bench_worker(rank: int, world: int, cfg: BenchConfig) -> list[dict]:
    """Runs in every rank's process; returns the records (rank 0 also prints them as it goes)."""
    dtype = getattr(torch, cfg.dtype)
    esize = torch.empty((), dtype=dtype).element_size()
    probe = OverlapProbe() if cfg.overlap else None
    colls = [collectives.get(name) for name in cfg.collectives]
    ctx: dict = {"max_bytes": max_bytes(colls, cfg.sizes, world, esize)}
    records = []
    registry = implementations(cfg.variant)
    impls = [registry[n] for n in cfg.impls]
    for coll in colls:
        for impl in impls:
            if not impl.serves(coll, world):
                continue
            if rank == 0:
                report.print_header(impl, coll.name, world)
            for size in cfg.sizes:
                size = round_size(size, world, esize)
                rec = {"impl": impl.name, "collective": coll.name, "size": size, "count": size // esize,
                       "type": cfg.dtype, "world": world}
                t0 = time.perf_counter()
                inp = out = expected = run = result = None
                try:
                    inp, out, expected = make_case(coll, size, world, rank, dtype, "cuda")
                    pristine = None
                    if coll.single_tensor:  # torch's all_reduce works in place: run every impl so
                        pristine, out = inp.clone(), inp
                    run, result = impl.setup(coll, inp, out, ctx)
                    if cfg.check:
                        if pristine is not None:
                            out.copy_(pristine)  # the input again (the timed runs reduce it over and over)
                        else:
                            out.view(torch.uint8).fill_(0xAB)  # poison: unwritten elements count as wrong
                        ctx.pop("path", None)
                        run()
                        torch.cuda.synchronize()
                        rec["wrong"] = _wrong_elements(result(), expected, esize)
                        if ctx.get("path") is not None:  # the path an auto implementation's call took
                            rec["path"] = ctx["path"]
                    if cfg.profile:
                        rec["kernels_per_call"] = _kernels_per_call(run)
                    us = _timed(run, cfg.iters, cfg.warmup)
                    med = statistics.median(us)
                    algbw = coll.bandwidth_bytes(size, world) / med / 1e3  # as nccl-tests computes it
                    rec.update(time_us=med, time_min_us=min(us), time_max_us=max(us), times_us=us,
                               algbw=algbw, busbw=algbw * coll.bus_factor(world))
                    if probe is not None:
                        rec.update(probe.slowdown(run, med))
                except Exception as e:  # noqa: BLE001 - one failing size must not lose the sweep
                    rec["error"] = f"{type(e).__name__}: {e}"
                    torch.cuda.synchronize()
                finally:
                    if impl.teardown is not None:
                        impl.teardown(ctx)
                rec["wall_s"] = time.perf_counter() - t0
                records.append(rec)
                if rank == 0:
                    report.print_row(rec)
                inp = out = expected = run = result = pristine = None
                torch.cuda.empty_cache()
            if rank == 0:
                report.print_footer([r for r in records if r["impl"] == impl.name and r["collective"] == coll.name])
    return records


def run_bench(cfg: BenchConfig, nprocs: int | None = None) -> list[dict]:
    """Run every implementation in one process per GPU; return rank 0's records."""
    return run_per_gpu(bench_worker, cfg, nprocs=nprocs)[0]
