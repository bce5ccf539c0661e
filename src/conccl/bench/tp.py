"""``conccl bench tp``: tensor-parallel ops against the GEMM alone, NCCL and PyTorch async-TP.

Per op (``ag_gemm``: all-gather then GEMM; ``gemm_rs``: GEMM then reduce-scatter), shape
(M x K x N: M the gathered rows, or the rows of the product before the reduce-scatter) and
implementation:

- ``gemm_only``: the same GEMM with no communication: the lower bound every ratio divides by;
- ``serial_nccl``: ``torch.distributed``'s collective (NCCL), then the GEMM (or the reverse);
- ``serial_conccl``: conccl's copy-engine collective, then the GEMM;
- ``torch_async_tp``: ``torch.ops.symm_mem.fused_all_gather_matmul`` /
  ``fused_matmul_reduce_scatter`` (PyTorch's async-TP);
- ``conccl``: ``conccl.tp`` with each schedule asked for, and ``conccl_auto`` (``schedule="auto"``).

Timing: warm-ups, then ``runs`` timed rounds with CUDA events on every rank; a round runs every
implementation of the shape once, in turn, so clock and power drift (which moved one H100's
times by 5-10% over a shape's runs) falls on all of them alike; per rank the median, then the
slowest rank's median (and its spread): :mod:`conccl.bench.timing`. Correctness on every case: each result is
compared with ``serial_nccl``'s (bf16: within the rounding a GEMM cut into other row blocks
may change; ``wrong`` counts the cases outside it).

On one GPU there is no peer: the runner times only what needs none, each schedule's GEMM steps
for a ``model_world``-rank pipeline run back to back (its decomposition), beside ``gemm_only``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..schedule.tp_schedule import TPSchedule, gemm_steps
from .async_tp import world_async_tp
from .timing import aligner, every_rank, slowest, timed_in_turn

OPS = ("ag_gemm", "gemm_rs")
# The all-gather+GEMM shapes conccl's tensor-parallel goals name, and the row-parallel shapes
# of the same models.
DEFAULT_SHAPES = {
    "ag_gemm": ((8192, 8192, 14336), (16384, 8192, 14336), (4096, 8192, 8192), (32768, 4096, 7168),
                (8192, 8192, 7168), (8192, 4096, 14336), (1024, 8192, 7168), (16384, 8192, 7168)),
    "gemm_rs": ((8192, 14336, 8192), (16384, 14336, 8192), (4096, 8192, 8192), (32768, 7168, 4096),
                (8192, 3584, 8192), (8192, 7168, 4096), (1024, 3584, 8192), (16384, 7168, 8192)),
}
DEFAULT_SCHEDULES = ("serial", "ring", "direct", "direct-p2", "direct-p4", "direct-p4-g2", "ring-p2", "push", "push-s2")


def schedules_for(op: str, schedules) -> tuple:
    """The schedules of ``schedules`` that ``op`` times: a GEMM+reduce-scatter runs a push
    schedule as direct (its pieces always leave by pushes), so it is not timed twice."""
    return tuple(n for n in schedules if op == "ag_gemm" or not TPSchedule.parse(n).push)


@dataclass(frozen=True)
class TPBenchConfig:
    ops: tuple = OPS
    shapes: dict = field(default_factory=lambda: dict(DEFAULT_SHAPES))
    schedules: tuple = DEFAULT_SCHEDULES
    impls: tuple = ("gemm_only", "serial_nccl", "serial_conccl", "torch_async_tp", "conccl", "conccl_auto")
    dtype: str = "bfloat16"
    warmup: int = 3
    runs: int = 20
    model_world: int = 2  # one GPU: the pipeline world whose GEMM steps are timed
    graph: bool = False  # each implementation captured into a CUDA graph, its replays timed
    # Before each run (after the GPU's sleep), a one-element NCCL all-reduce on the caller's
    # stream, so the ranks' GPUs start the run within microseconds of each other: the figure
    # is then the op's own, not the skew of the hosts' wake-ups (tens of microseconds, which at
    # decode size moved medians by up to 45% between processes: docs/results.md, "The
    # GEMM+reduce-scatter's tail, aligned timing, eager host time").
    align: bool = False


@dataclass(frozen=True)
class Record:
    op: str
    M: int
    K: int
    N: int
    world: int
    impl: str
    schedule: str | None
    grain: str | None
    ms: float | None
    ms_spread: float | None
    ratio_to_gemm: float | None
    wrong: bool = False
    error: str | None = None
    note: str | None = None
    host_ms: float | None = None  # the host's time to queue one call (median, slowest rank)


def grain_of(tp: TPSchedule) -> str:
    return f"p{tp.pieces}-g{tp.gemm_pieces}"


def gathered_input(dist, a_in, M: int, world: int):
    """The all-gather+GEMM's gathered ``A`` (``M`` rows: every rank's ``a_in``), which
    ``gemm_only`` and the serial schedules multiply. Filled before anything is timed: a GEMM's
    speed depends on its data, and on an uninitialised ``A`` the GEMM alone was measured 15%
    faster than on the gathered random rows at 4096x8192x8192 on 2 x H100 (docs/results.md,
    "Settled pipelines with their marks as graph edges"), which put every ratio to it off by as
    much."""
    full = a_in.new_empty((M, a_in.shape[1]))
    if world == 1:
        full.copy_(a_in)
    else:
        dist.all_gather_into_tensor(full, a_in)
    return full


def run_rank(rank: int, world: int, cfg: TPBenchConfig, progress=None) -> list:
    """Every case on this rank (a collective call on world >= 2); the records on every rank."""
    import torch
    import torch.distributed as dist

    import conccl
    from .. import tp as ctp

    dt = getattr(torch, cfg.dtype)
    dev = torch.device("cuda", torch.cuda.current_device())
    records: list[Record] = []
    async_tp = world_async_tp(torch, dist) if world > 1 and "torch_async_tp" in cfg.impls else None
    if cfg.graph and world > 1:
        conccl.reserve_graph_workspace(graph_workspace_bytes(cfg, world))
    for op in cfg.ops:
        for (M, K, N) in cfg.shapes[op]:
            if M % max(world, cfg.model_world):
                records.append(Record(op, M, K, N, world, "gemm_only", None, None, None, None, None,
                                      error=f"M={M} not divisible by the world size"))
                continue
            g = torch.Generator(device=dev).manual_seed(1000 + rank)
            rows = M // world
            a_in = torch.randn((rows if op == "ag_gemm" else M, K), device=dev, dtype=dt, generator=g) / K ** 0.25
            same = torch.Generator(device=dev).manual_seed(7)  # every rank's weight alike
            wt = torch.randn((K, N), device=dev, dtype=dt, generator=same) / K ** 0.25
            full = gathered_input(dist, a_in, M, world) if op == "ag_gemm" else None
            prod = torch.empty((M, N), device=dev, dtype=dt)
            out_rs = torch.empty((M // world, N), device=dev, dtype=dt)

            def gemm_only():
                torch.mm(full if op == "ag_gemm" else a_in, wt, out=prod)

            if world == 1:
                names = schedules_for(op, cfg.schedules)
                fns = [gemm_only] + [_decomposition(torch, cfg, op, M, name, full if op == "ag_gemm" else a_in, wt, prod)
                                     for name in names]
                times = timed_in_turn(torch, fns, cfg.warmup, cfg.runs)
                base_ms, base_spread = slowest(dist, world, times[0])
                records.append(Record(op, M, K, N, world, "gemm_only", None, None, base_ms, base_spread, 1.0))
                for name, ms in zip(names, times[1:]):
                    med, spread = slowest(dist, world, ms)
                    records.append(Record(op, M, K, N, 1, "conccl", name, grain_of(TPSchedule.parse(name)), med, spread,
                                          med / base_ms, note=f"one GPU: the GEMM steps of a {cfg.model_world}-rank "
                                          "pipeline alone (its decomposition loss), no transfer"))
                if progress is not None:
                    progress(records[-1])
                continue
            impls = _impls(torch, dist, conccl, ctp, cfg, op, a_in, wt, full, prod, out_rs, async_tp, world)
            # Each implementation is run once and checked; those that ran on every rank are then
            # timed in turn (one that failed on some rank only would leave the ranks' collectives
            # out of step: every rank drops it).
            reference, ran, failed = None, [], {}
            for impl, schedule, fn in impls:
                try:
                    result = fn()
                    torch.cuda.synchronize()
                    if reference is None:
                        reference = result.clone()
                    ran.append((impl, schedule, fn, not _close(torch, result, reference)))
                except Exception as e:  # noqa: BLE001 - a case that cannot run is a record, not the end
                    failed[(impl, schedule)] = f"{type(e).__name__}: {str(e)[:200]}"
            everywhere = set.intersection(*every_rank(dist, world, {(i, s) for i, s, _, _ in ran}))
            for impl, schedule, _, _ in ran:
                if (impl, schedule) not in everywhere:
                    failed[(impl, schedule)] = "failed on another rank"
            ran = [r for r in ran if (r[0], r[1]) in everywhere]
            if cfg.graph:
                fns = [gemm_only] + [fn for _, _, fn, _ in ran]
                graphed, why = _graphed(torch, dist, world, fns)
                if why is not None:  # one capture failed somewhere: the shape's graphs are lost
                    records += [Record(op, M, K, N, world, i, s, None, None, None, None, error=why) for i, s, _, _ in ran]
                    ran = []
                else:
                    gemm_only = graphed[0]
                    ran = [(i, s, g, wrong) for (i, s, _, wrong), g in zip(ran, graphed[1:])]
            host: list = []
            try:
                times = timed_in_turn(torch, [gemm_only] + [fn for _, _, fn, _ in ran], cfg.warmup, cfg.runs, host,
                                      align=aligner(torch, dist, dev) if cfg.align and world > 1 else None)
            except Exception as e:  # noqa: BLE001 - the shape's timings are lost, not the run
                why = f"timing: {type(e).__name__}: {str(e)[:200]}"
                records.append(Record(op, M, K, N, world, "gemm_only", None, None, None, None, None, error=why))
                records += [Record(op, M, K, N, world, i, s, None, None, None, None, error=why) for i, s, _, _ in ran]
                ran, times = [], None
            if times is not None:
                base_ms, base_spread = slowest(dist, world, times[0])
                records.append(Record(op, M, K, N, world, "gemm_only", None, None, base_ms, base_spread, 1.0,
                                      host_ms=slowest(dist, world, host[0])[0]))
            for (impl, schedule, _, wrong), ms, queued in zip(ran, times[1:] if times else (), host[1:]):
                med, spread = slowest(dist, world, ms)
                tp = TPSchedule.parse(schedule) if schedule else None
                records.append(Record(op, M, K, N, world, impl, schedule, grain_of(tp) if tp else None, med, spread,
                                      med / base_ms, wrong, host_ms=slowest(dist, world, queued)[0]))
            for (impl, schedule), why in failed.items():
                records.append(Record(op, M, K, N, world, impl, schedule, None, None, None, None, error=why))
            if progress is not None and rank == 0:
                progress(records[-1])
            del a_in, wt, full, prod, out_rs
    return records


def graph_workspace_bytes(cfg: TPBenchConfig, world: int) -> int:
    """Graph workspace every captured conccl call of the run needs (reserved before the first
    capture): a staged all-gather stages its shard, a push all-gather takes ``world`` of them
    (``auto`` counted as one), a reduce-scatter pushes ``world`` partials."""
    elem = 4 if cfg.dtype == "float32" else 2
    total = 0
    for op in cfg.ops:
        names = schedules_for(op, cfg.schedules) if "conccl" in cfg.impls else ()
        # a copy each: the serial flat collective stages or pushes as much as a pipeline
        copies = sum(world if TPSchedule.parse(n).push else 1 for n in names)
        auto = world if op == "ag_gemm" else 1  # auto may push
        copies += auto * ("conccl_auto" in cfg.impls) + ("serial_conccl" in cfg.impls)
        for M, K, N in cfg.shapes[op]:
            per = (M // world) * K * elem if op == "ag_gemm" else M * N * elem
            total += copies * (-(-per // 256) * 256)
    return max(total, 1 << 20)


def _graphed(torch, dist, world: int, fns: list):
    """([a replay of each fn's CUDA graph], None), or (None, why) where a capture failed on any
    rank (every rank drops the shape alike: a conccl capture is a collective call)."""
    graphs = []
    for fn in fns:
        why = None
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            graphs.append(g)
        except Exception as e:  # noqa: BLE001 - e.g. an implementation PyTorch cannot capture
            why = f"capture: {type(e).__name__}: {str(e)[:160]}"
        # agreed after each capture: a rank going on to capture a conccl call its peer does not
        # make would wait for that peer on the board
        why = next((w for w in every_rank(dist, world, why) if w), None)
        if why:
            torch.cuda.synchronize()
            return None, why
    torch.cuda.synchronize()
    return [g.replay for g in graphs], None


def _close(torch, a, b) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2))


def _impls(torch, dist, conccl, ctp, cfg, op, a_in, wt, full, prod, out_rs, async_tp, world):
    """(impl, schedule name or None, fn returning this rank's result) for one case."""
    if op == "ag_gemm":
        def serial(lib):
            def fn():
                lib.all_gather_into_tensor(full, a_in)
                return torch.mm(full, wt, out=prod)
            return fn

        def pipelined(schedule):
            return ctp.all_gather_matmul(a_in, wt, schedule=schedule)[1][0]

        fused, M = (async_tp.ag if async_tp is not None else None), full.shape[0]
    else:
        def serial(lib):
            def fn():
                torch.mm(a_in, wt, out=prod)
                lib.reduce_scatter_tensor(out_rs, prod)
                return out_rs
            return fn

        def pipelined(schedule):
            return ctp.matmul_reduce_scatter(a_in, wt, schedule=schedule)

        fused, M = (async_tp.rs if async_tp is not None else None), a_in.shape[0]
    out = []
    if "serial_nccl" in cfg.impls:
        out.append(("serial_nccl", None, serial(dist)))
    if "serial_conccl" in cfg.impls:
        out.append(("serial_conccl", None, serial(conccl)))
    if fused is not None:
        out.append(("torch_async_tp", None, lambda: fused(a_in, wt)))
    for name in schedules_for(op, cfg.schedules) if "conccl" in cfg.impls else ():
        out.append(("conccl", name, lambda name=name: pipelined(name)))
    if "conccl_auto" in cfg.impls:
        name = ctp.resolve_schedule("auto", op, M, wt.shape[0], wt.shape[1], world, a_in.dtype, a_in.device).name
        out.append(("conccl_auto", name, lambda: pipelined("auto")))
    return out


def _decomposition(torch, cfg, op, M, name, src, wt, prod):
    """One GPU: the GEMM steps of ``name``'s pipeline for ``cfg.model_world`` ranks, back to back."""
    W = cfg.model_world
    steps = [(src[start:end], prod[start:end]) for start, end, _ in
             gemm_steps(W, 0, TPSchedule.parse(name), M // W, scatter=op == "gemm_rs")]

    def fn():
        for x, y in steps:
            torch.mm(x, wt, out=y)

    return fn


def document(meta: dict, cfg: TPBenchConfig, records: list) -> dict:
    return {"machine_kind": meta.get("machine_kind"), "commit": meta.get("commit"), "torch": meta.get("torch"),
            "meta": meta, "config": {"dtype": cfg.dtype, "warmup": cfg.warmup, "runs": cfg.runs,
                                     "schedules": list(cfg.schedules), "model_world": cfg.model_world,
                                     "graph": cfg.graph, "align": cfg.align},
            "results": [asdict(r) for r in records]}


def markdown(doc: dict) -> str:
    meta = doc["meta"]
    lines = [f"# conccl bench tp ({meta.get('machine_kind')}, {meta.get('device')}, world {meta.get('world')})", "",
             f"{meta.get('date')}, commit {str(doc.get('commit'))[:12]}, torch {doc.get('torch')}, "
             f"NCCL {meta.get('nccl')}. Milliseconds: the slowest rank's median of {doc['config']['runs']} runs; "
             "ratio: over the GEMM alone." + (" Every implementation (the GEMM alone too) captured into a CUDA graph, "
                                              "its replays timed." if doc["config"].get("graph") else "")
             + (" Each run starts after a one-element NCCL all-reduce (the ranks aligned on the GPU)."
                if doc["config"].get("align") else ""), ""]
    lines += ["| op | M x K x N | impl | schedule | ms | spread | x GEMM | host ms | wrong |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc["results"]:
        if r["error"]:
            lines.append(f"| {r['op']} | {r['M']}x{r['K']}x{r['N']} | {r['impl']} | {r['schedule'] or ''} | "
                         f"error: {r['error'][:60]} | | | | |")
            continue
        lines.append(f"| {r['op']} | {r['M']}x{r['K']}x{r['N']} | {r['impl']} | {r['schedule'] or ''} | "
                     f"{r['ms']:.3f} | {100 * r['ms_spread']:.1f}% | {r['ratio_to_gemm']:.3f} | "
                     f"{'' if r.get('host_ms') is None else format(r['host_ms'], '.3f')} | "
                     f"{'WRONG' if r['wrong'] else ''} |")
    return "\n".join(lines) + "\n"


def write(out, doc: dict) -> None:
    from ..jsonfile import write_text

    write_text(out / "tp.json", json.dumps(doc, indent=1))
    write_text(out / "tp.md", markdown(doc))
