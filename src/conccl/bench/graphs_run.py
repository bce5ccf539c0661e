"""The graphs benchmark on the GPUs, in one process per GPU (what it measures:
:mod:`conccl.bench.graphs`).

Per collective and size one set of buffers serves every implementation; per implementation
and mode: a correctness check against NCCL, warm-ups, timed runs. Order inside a case::

    setup ──> eager: check (calls calls) ─> warm-up ─> runs x [barrier, event, replays x calls, event]
          └─> graph: calls eagerly (warm-up) ─> reserve graph workspace ─> capture calls calls
                     ─> check (one replay) ─> warm-up ─> runs x [barrier, event, replays x replay, event]
          └─> beside: check (calls calls) ─> warm-up ─> runs x [GEMMs alone], runs x [one call alone],
                      runs x [GEMMs queued, the first seen running, one call]
          ──> teardown (conccl_auto: the eager path back to copy engines) ─> conccl groups destroyed
"""
from __future__ import annotations

import gc
import statistics
import sys
import time

import torch
import torch.distributed as dist

import conccl

from ..collectives import Collective, get as get_collective
from ..units import format_size
from .graphs import (BESIDE_GEMM_N, BESIDE_GEMMS, USES_CONCCL_GROUP, GraphsConfig, GraphsRecord,
                     calls_per_graph, graph_workspace_per_call, per_call_us, summarize)
from .impls import implementations
from .run import _wrong_elements, make_case, max_bytes, round_size

DTYPE, ESIZE = torch.bfloat16, 2


class _Case:
    """One collective at one size: this rank's buffers and the bytes a correct output holds."""

    def __init__(self, coll: Collective, size: int, calls: int, world: int, rank: int):
        self.coll, self.size, self.calls, self.world = coll, size, calls, world
        self.ws_per_call = graph_workspace_per_call(coll, size, world)
        self.inp, self.out, self.expected = make_case(coll, size, world, rank, DTYPE, "cuda")
        self.pristine = None
        if coll.single_tensor:  # reduced in place, as torch.distributed.all_reduce: calls repeat the sum
            self.pristine, self.out = self.inp.clone(), self.inp
            self.expected = self._nccl_result()

    def reset(self) -> None:
        """The input again (in place), or the output poisoned: unwritten elements count as wrong."""
        if self.pristine is not None:
            self.out.copy_(self.pristine)
        else:
            self.out.view(torch.uint8).fill_(0xAB)

    def _nccl_result(self):
        """NCCL's output after ``calls`` eager calls from the pristine input."""
        self.reset()
        for _ in range(self.calls):
            self.coll.call_with(dist, self.out, self.inp)
        torch.cuda.synchronize()
        return self.out.contiguous().view(-1).view(torch.uint8).clone()

    def wrong(self, once, result) -> int:
        """Elements differing from the expected output after ``once()`` (one replay, or the
        ``calls`` eager calls), summed over the ranks."""
        self.reset()
        if self.pristine is not None and result() is not self.out:
            result().copy_(self.pristine)  # the implementation's own copy of the in-place tensor (conccl.empty)
        once()
        torch.cuda.synchronize()
        n = torch.tensor([_wrong_elements(result(), self.expected, ESIZE)], device="cuda")
        dist.all_reduce(n)
        return int(n.item())


def _repeat(run, calls: int):
    def unit():
        for _ in range(calls):
            run()
    return unit


def _slowest(values: list[float]) -> list[float]:
    """Each run's value, the largest of any rank's (run by run)."""
    t = torch.tensor(values, dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _timed_runs(once, replays: int, runs: int, warmup: int) -> list[float]:
    """Each run's ms for ``replays`` calls of ``once``, the slowest rank's (run by run)."""
    for _ in range(warmup):
        once()
    torch.cuda.synchronize()
    ms = []
    for _ in range(runs):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            once()
        end.record()
        torch.cuda.synchronize()
        ms.append(start.elapsed_time(end))
    return _slowest(ms)


def _measure(mode: str, impl, unit, result, case: _Case, cfg: GraphsConfig, ctx: dict) -> dict:
    """One mode of one implementation: the record's checked and timed fields."""
    ctx.pop("path", None)
    graph = None
    if mode == "graph":
        unit()  # eagerly first: the conccl group, its kernels and NCCL's communicator exist before capture
        torch.cuda.synchronize()
        if USES_CONCCL_GROUP[impl.name]:
            staged = impl.staged_push  # its calls take more than the case's bound
            conccl.reserve_graph_workspace(case.calls * (graph_workspace_per_call(case.coll, case.size, case.world, True)
                                                         if staged else case.ws_per_call))
        dist.barrier()
        torch.cuda.synchronize()
        ctx.pop("path", None)
        graph = torch.cuda.CUDAGraph()
        # thread_local: NCCL's and conccl's watchdog threads may query events recorded before the
        # capture; in the default (global) mode that would invalidate it.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            unit()
        once = graph.replay
        path = ctx.pop("path", None)  # what the captured calls took
    else:
        once = unit
    wrong = case.wrong(once, result)
    if mode == "eager":
        path = ctx.pop("path", None)
    ms = _timed_runs(once, cfg.replays, cfg.runs, cfg.warmup)
    us = summarize(per_call_us(t, case.calls, cfg.replays) for t in ms)
    return {**us, "wrong": wrong, "path": path}


def _beside_one(run, gemms, gemm_stream, with_call: bool, host_group) -> tuple[float | None, float | None]:
    """(us from queueing one ``run()`` to its completion, ms of the GEMMs) of one try: with
    ``gemms`` None the call alone; else the GEMMs queued on ``gemm_stream``, the call queued
    once the first of them runs (``with_call`` False: the GEMMs alone). Right before the call
    the ranks' hosts meet on ``host_group`` (gloo: an NCCL barrier would wait for the GEMM),
    so that a rank's time holds little of a peer host's lag (what skew the meeting leaves)."""
    dist.barrier()
    torch.cuda.synchronize()
    g0 = g1 = None
    if gemms is not None:
        a, b, c = gemms
        g0, g1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(gemm_stream):
            g0.record()
            for _ in range(BESIDE_GEMMS):
                torch.mm(a, b, out=c)
            g1.record()
        while not g0.query():  # the first GEMM starts right behind this event
            pass
        time.sleep(100e-6)
    us = None
    if with_call:
        dist.barrier(group=host_group)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()  # on the call's idle stream: the moment the call is queued
        run()
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1e3
    torch.cuda.synchronize()
    return us, (g0.elapsed_time(g1) if g0 is not None else None)


def _beside_setup() -> tuple:
    """The beside mode's GEMM operands, their stream and a gloo group for the hosts' meeting:
    made by every rank before the first case (``dist.new_group`` is collective), all or none."""
    n = BESIDE_GEMM_N
    g = torch.Generator(device="cuda").manual_seed(1)
    gemms = tuple(torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    return gemms, torch.cuda.Stream(), dist.new_group(backend="gloo")


def _measure_beside(run, unit, result, case: _Case, cfg: GraphsConfig, ctx: dict) -> dict:
    """The beside mode (:mod:`conccl.bench.graphs`): one call's completion while GEMMs hold
    the SMs, against the same call alone, and the GEMMs' slowdown; checked as eager."""
    gemms, stream, host = ctx["beside"]  # made by run_all before any case (_beside_setup)
    ctx.pop("path", None)
    wrong = case.wrong(unit, result)
    path = ctx.pop("path", None)
    for _ in range(cfg.warmup):
        _beside_one(run, gemms, stream, True, host)
    gemm_alone, alone, beside, gemm_beside = [], [], [], []
    for _ in range(cfg.runs):  # in turns, so that a drift of the machine reaches each kind alike
        gemm_alone.append(_beside_one(run, gemms, stream, False, host)[1])
        alone.append(_beside_one(run, None, stream, True, host)[0])
        us, ms = _beside_one(run, gemms, stream, True, host)
        beside.append(us)
        gemm_beside.append(ms)
    alone, beside = _slowest(alone), _slowest(beside)
    gemm_alone, gemm_beside = _slowest(gemm_alone), _slowest(gemm_beside)
    return {**summarize(beside), "wrong": wrong, "path": path, "alone_us": statistics.median(alone),
            "gemm_slowdown": statistics.median(gemm_beside) / statistics.median(gemm_alone)}


def _nccl_below(info, coll: Collective) -> int | None:
    """The size below which ``set_eager_path('auto')`` (its returned ``info``) sends ``coll`` to NCCL."""
    try:
        v = info["nccl_below"][coll.name]
    except (KeyError, TypeError, IndexError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def _settle() -> None:
    """After a failure: wait for what was queued (the failure may have come from it)."""
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the record already holds the error
        pass


def _drop_conccl_groups() -> None:
    """Every conccl group closed, so that the next case captures on fresh graph slots and graph
    workspace (a group keeps both for good). The graphs that used them are gone by now."""
    torch.cuda.synchronize()
    gc.collect()
    conccl.destroy()
    dist.barrier()


def _impl_records(impl, case: _Case, cfg: GraphsConfig, ctx: dict) -> tuple[list[GraphsRecord], object]:
    """Every mode's record of one implementation at one case, and what ``set_eager_path``
    returned (conccl_auto; else None)."""
    fields, info = {}, None
    try:
        run, result = impl.setup(case.coll, case.inp, case.out, ctx)
        info = ctx.get("eager_path")
        unit = _repeat(run, case.calls)
        for mode in cfg.modes:
            try:
                fields[mode] = (_measure_beside(run, unit, result, case, cfg, ctx) if mode == "beside"
                                else _measure(mode, impl, unit, result, case, cfg, ctx))
            except Exception as e:  # noqa: BLE001 - one failing case must not lose the sweep
                fields[mode] = {"error": _error_text(e)}
                _settle()
    except Exception as e:  # noqa: BLE001 - the setup failed: every mode says why
        fields.update({m: {"error": _error_text(e)} for m in cfg.modes if m not in fields})
        _settle()
    finally:
        try:
            if impl.teardown is not None:
                impl.teardown(ctx)
        finally:
            if USES_CONCCL_GROUP[impl.name] and "graph" in cfg.modes:
                _drop_conccl_groups()
                # conccl.empty arenas belong to the group just closed: its successor would take
                # them for plain tensors
                for key in [k for k in ctx if k.startswith("arena_")]:
                    del ctx[key]
    # the beside mode times one call per try: no graph, no replays
    recs = [GraphsRecord(collective=case.coll.name, bytes=case.size, impl=impl.name, mode=m,
                         calls_per_graph=1 if m == "beside" else case.calls, replays=1 if m == "beside" else cfg.replays,
                         nccl_below=_nccl_below(info, case.coll), **fields[m]) for m in cfg.modes]
    return recs, info


def _progress(i: int, total: int, rec: GraphsRecord, t0: float) -> None:
    what = f"[graphs] {i}/{total} {rec.collective} {format_size(rec.bytes)} {rec.impl} {rec.mode}:"
    if rec.error is not None:
        line = f"{what} error: {rec.error}"
    else:
        line = (f"{what} {rec.us_per_call:.1f} us/call ({rec.us_min:.1f}..{rec.us_max:.1f}), #wrong {rec.wrong}"
                + (f", path {rec.path}" if rec.path else "")
                + (f", alone {rec.alone_us:.1f} us, GEMMs x{rec.gemm_slowdown:.3f}" if rec.alone_us else ""))
    print(f"{line}  [{time.monotonic() - t0:.0f} s]", file=sys.stderr, flush=True)


def run_all(rank: int, world: int, cfg: GraphsConfig) -> dict:
    """Every case of ``cfg``: ``{"results": [GraphsRecord, ...], "eager_path": ...}``, the
    figures the slowest rank's (rank 0 reports progress on stderr)."""
    colls = [get_collective(n) for n in cfg.collectives]
    sizes = list(dict.fromkeys(round_size(s, world, ESIZE) for s in cfg.sizes))
    ctx: dict = {"max_bytes": max_bytes(colls, sizes, world, ESIZE)}
    if "beside" in cfg.modes:
        ctx["beside"] = _beside_setup()
    registry = implementations(cfg.variant)
    impls = [registry[n] for n in cfg.impls]
    total = sum(len(cfg.modes) for c in colls for _ in sizes for i in impls if i.serves(c, world))
    records, eager_path, t0 = [], None, time.monotonic()
    for coll in colls:
        for size in sizes:
            calls = calls_per_graph(cfg.calls, graph_workspace_per_call(coll, size, world), cfg.graph_workspace_bytes)
            case = _Case(coll, size, calls, world, rank)
            for impl in impls:
                if not impl.serves(coll, world):
                    continue
                recs, info = _impl_records(impl, case, cfg, ctx)
                eager_path = eager_path if eager_path is not None else info
                for rec in recs:
                    records.append(rec)
                    if rank == 0:
                        _progress(len(records), total, rec, t0)
            case = None
            gc.collect()
            torch.cuda.empty_cache()
    ctx.pop("beside", None)  # the GEMMs' 384 MiB back before the caller goes on
    return {"results": records, "eager_path": eager_path}
