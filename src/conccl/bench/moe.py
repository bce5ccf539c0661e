"""``conccl bench moe``: a MoE layer's dispatch and combine (conccl.ep) against the NCCL
reference dispatcher, alone and beside the expert GEMM.

Per routing (``random``: each token's top-k of random logits, a fixed seed per rank; ``skewed``:
experts drawn with Zipf-like probabilities, so one rank receives most rows) and implementation:

- ``conccl``: :func:`conccl.ep.dispatch` / :func:`conccl.ep.combine` (a token crosses a link once
  per rank holding its experts; rows on copy engines);
- ``conccl_fixed``: :func:`conccl.ep.dispatch` with ``fixed_sizes=True`` eagerly (no host sync;
  every rank sends every rank ``T`` rows, padding included);
- ``conccl_graph``: the same with fixed sizes (``fixed_sizes=True``: no host sync; every rank
  sends every rank ``T`` rows, padding included), dispatch and combine each captured into a
  CUDA graph and timed as replays (the new routing copied into the graphs' inputs untimed):
  what decode runs;
- ``reference``: :mod:`conccl.bench.moe_reference`, built as torchtitan's default dispatcher
  (one row per (token, expert) pair by NCCL's ``all_to_all_single``);
- ``reference_scatter_add``: the reference's dispatch with torchtitan's combine (weights, then
  ``scatter_add``: no fixed order, so not bit-equal; the speed bar for combine);
- ``nccl_a2a`` / ``conccl_a2a``: one uneven ``all_to_all_single`` of the reference's rows alone,
  by NCCL and by conccl (the transport without the layout work).

Timing: every call is wall time between CUDA events on the caller's stream, host syncs
included (both dispatchers read counts on the host); the ranks meet at a barrier before each
timed call; rounds run each implementation once, in turn, each round on a new routing (as
every training step routes anew: nothing a call remembers from the last one fits; one routing
for all with ``fresh_routing=False``); per rank the median, then the slowest rank's.
Correctness: conccl.ep's expert rows, counts and combined output (both modes) equal the
reference's bit for bit on every rank, every round. ``kernel_us``: the CUDA kernels' time in one call (the
SM work; copy-engine copies are not kernels). ``link_GBps``: bytes sent to other ranks over
the slowest rank's time. Beside compute: the expert GEMM (rows [N, hidden] times each local
expert's [hidden, ffn], grouped by expert) on the caller's stream, repeated to last about as
long as one dispatch and combine, queued first, then those on a second stream: the GEMMs' time
against alone, and the dispatch and combine's own time there (``comm_beside_ms``: an SM
kernel in their path waits for the GEMMs' blocks).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass

from .moe_layer import LAYER_VARIANTS, ROUTINGS, _grouped_gemm, _timed, routing, time_layer, train_both
from .timing import slowest

IMPLS = ("conccl", "conccl_fixed", "conccl_graph", "reference", "reference_scatter_add", "nccl_a2a", "conccl_a2a")


@dataclass(frozen=True)
class MoEBenchConfig:
    tokens: int = 4096
    hidden: int = 7168
    experts: int = 8
    topk: int = 2
    ffn: int = 2048  # the expert GEMM's width, for the beside-compute figure
    dtype: str = "bfloat16"
    routings: tuple = ROUTINGS
    impls: tuple = IMPLS
    warmup: int = 3
    runs: int = 10
    seed: int = 0
    fresh_routing: bool = True  # a new routing every round (as training routes), or one for all
    train_steps: int = 20  # the small MoE model (bench/moe_model.py) on both dispatchers; 0: none
    layer_chunks: int = 2  # the MoE layer forward+backward over this many micro-batches (conccl.ep.moe_layer); 0: none


@dataclass
class Record:
    routing: str
    impl: str
    dispatch_ms: float | None = None
    dispatch_spread: float | None = None
    combine_ms: float | None = None
    combine_spread: float | None = None
    rows_sent: int | None = None  # rows sent to other ranks, summed over ranks
    link_GBps: float | None = None  # dispatch: bytes to other ranks per second, slowest rank
    kernel_us: float | None = None  # CUDA kernel time in one dispatch + combine (rank 0)
    gemm_alone_ms: float | None = None
    gemm_beside_ms: float | None = None
    gemm_slowdown: float | None = None
    comm_beside_ms: float | None = None  # the dispatch + combine's time on the side stream beside the GEMMs
    wrong: bool = False
    error: str | None = None


def _kernel_us(torch, dist, fn) -> float:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    dist.barrier()  # the ranks start together: a kernel that waits for a late peer is not timed waiting
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    return float(sum(e.device_time for e in kernels))


def _case(torch, ep, reference_dispatch, reference_combine, kind, x, cfg, rank, epr, seed, dev) -> dict:
    """One routing and what the reference makes of it (untimed): the rows, counts and combined
    output every conccl result must equal, the experts' outputs, the raw all-to-all's buffers."""
    idx, wts = routing(torch, kind, cfg.tokens, cfg.experts, cfg.topk, seed, dev)
    rx, rcounts, rhandle = reference_dispatch(x, idx, wts, cfg.experts)
    scale = torch.repeat_interleave(torch.arange(1, epr + 1, device=dev, dtype=torch.float32) / epr,
                                    torch.tensor(rcounts, device=dev))[:, None]
    ry = (rx.float() * scale).to(x.dtype)  # the experts' outputs: the same rows on both paths
    return {"idx": idx, "wts": wts, "rx": rx, "rcounts": rcounts, "rhandle": rhandle, "ry": ry,
            "rout": reference_combine(ry, rhandle),
            "ref_rows": torch.empty((sum(rhandle.recv_counts), x.shape[1]), dtype=x.dtype, device=dev),
            "ref_send": x[rhandle.pairs[:, 0]].contiguous()}


class _FixedGraphs:
    """conccl.ep with fixed sizes captured into two CUDA graphs (dispatch; combine of a static
    expert output): ``load`` copies a case's routing and the reference's expert output into the
    static inputs (untimed), the graphs' ``replay`` is what is timed, ``right`` checks a replay's
    results against the reference's, bit for bit."""

    def __init__(self, torch, ep, x, cfg, rank, world):
        import conccl

        self.torch, self.cfg = torch, cfg
        dev = x.device
        self.idx = torch.zeros((cfg.tokens, cfg.topk), dtype=torch.int64, device=dev)
        self.idx[:, 0] = torch.arange(cfg.tokens, device=dev) % cfg.experts
        self.idx[:, 1:] = -1
        self.wts = torch.ones((cfg.tokens, cfg.topk), dtype=torch.float32, device=dev)
        with torch.no_grad():
            ep.dispatch(x, self.idx, self.wts, cfg.experts, fixed_sizes=True)  # eager: kernels loaded
            torch.cuda.synchronize()
            conccl.reserve_graph_workspace(ep.graph_workspace_bytes(cfg.tokens, cfg.hidden, cfg.topk, x.dtype, world))
            self.dispatch = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.dispatch):
                self.ex, self.counts, handle = ep.dispatch(x, self.idx, self.wts, cfg.experts, fixed_sizes=True)
            self.y = torch.zeros_like(self.ex)
            self.combine = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.combine):
                self.out = ep.combine(self.y, handle)
        torch.cuda.synchronize()

    def load(self, case):
        self.idx.copy_(case["idx"])
        self.wts.copy_(case["wts"])
        self.y[:case["ry"].shape[0]].copy_(case["ry"])

    def right(self, case, ex=None, counts=None, out=None) -> bool:
        """The graphs' last results (or those given: an eager fixed-size call's) against the reference's."""
        ex, counts, out = (self.ex, self.counts, self.out) if ex is None else (ex, counts, out)
        n = sum(case["rcounts"])
        return (self.torch.equal(ex[:n], case["rx"]) and counts.tolist() == list(case["rcounts"])
                and self.torch.equal(out, case["rout"]))


def run_rank(rank: int, world: int, cfg: MoEBenchConfig, progress=None) -> list:
    """Every case on this rank (collective); the records (identical on every rank), and the
    training figures (:func:`train_both`) last when ``cfg.train_steps``."""
    import torch
    import torch.distributed as dist

    import conccl
    from .. import ep
    from .moe_reference import reference_combine, reference_dispatch, scatter_add_combine

    dt = getattr(torch, cfg.dtype)
    dev = torch.device("cuda", torch.cuda.current_device())
    epr = ep.layout.experts_per_rank(cfg.experts, world)
    elt = torch.empty((), dtype=dt).element_size()
    gen = torch.Generator(device=dev).manual_seed(cfg.seed * 1000 + rank)
    x = torch.randn(cfg.tokens, cfg.hidden, device=dev, generator=gen).to(dt)
    w_experts = (torch.randn(epr, cfg.hidden, cfg.ffn, device=dev, generator=gen) / cfg.hidden ** 0.5).to(dt)
    side = torch.cuda.Stream()
    records = []
    rounds = cfg.warmup + cfg.runs
    fixed = _FixedGraphs(torch, ep, x, cfg, rank, world) if {"conccl_graph", "conccl_fixed"} & set(cfg.impls) else None
    for kind in cfg.routings:
        # one routing per round (a training step routes anew each time), or one for all
        state = {}

        def new_case(r):  # made untimed before round r; the last one stays for what follows
            state["case"] = None  # the previous round's tensors go first
            state["case"] = _case(torch, ep, reference_dispatch, reference_combine, kind, x, cfg, rank, epr,
                                  cfg.seed * 1000 + rank + (7919 * r if cfg.fresh_routing else 0), dev)
            if fixed is not None:
                fixed.load(state["case"])

        def case():
            return state["case"]

        def conccl_dispatch():
            state["c"] = ep.dispatch(x, case()["idx"], case()["wts"], cfg.experts)

        def conccl_combine():
            state["cout"] = ep.combine(case()["ry"], state["c"][2])

        def fixed_dispatch():  # eagerly, into the graphs' static inputs (untimed: load)
            state["f"] = ep.dispatch(x, fixed.idx, fixed.wts, cfg.experts, fixed_sizes=True)

        def fixed_combine():
            state["fout"] = ep.combine(fixed.y, state["f"][2])

        def ref_dispatch():
            state["r"] = reference_dispatch(x, case()["idx"], case()["wts"], cfg.experts)

        def ref_combine():
            state["rout"] = reference_combine(case()["ry"], case()["rhandle"])

        def ref_scatter_add_combine():
            state["rout_fast"] = scatter_add_combine(case()["ry"], state["r"][2])

        def nccl_a2a():
            h = case()["rhandle"]
            dist.all_to_all_single(case()["ref_rows"], case()["ref_send"], h.recv_counts, h.send_counts)

        def conccl_a2a():
            h = case()["rhandle"]
            conccl.all_to_all_single(case()["ref_rows"], case()["ref_send"], h.recv_counts, h.send_counts)

        calls = {"conccl": (conccl_dispatch, conccl_combine), "reference": (ref_dispatch, ref_combine),
                 "conccl_graph": (fixed.dispatch.replay, fixed.combine.replay) if fixed else (None, None),
                 "conccl_fixed": (fixed_dispatch, fixed_combine),
                 "reference_scatter_add": (ref_dispatch, ref_scatter_add_combine),
                 "nccl_a2a": (nccl_a2a, None), "conccl_a2a": (conccl_a2a, None)}
        impls = [i for i in cfg.impls if i in calls]
        recs = {i: Record(kind, i) for i in impls}
        times = {i: ([], []) for i in impls}
        wrong = wrong_graph = wrong_fixed = False
        for r in range(rounds):
            if r == 0 or cfg.fresh_routing:
                new_case(r)
            for i in impls:
                d, c = calls[i]
                td = _timed(torch, dist, d)
                tc = _timed(torch, dist, c) if c else None
                if r >= cfg.warmup:
                    times[i][0].append(td)
                    if tc is not None:
                        times[i][1].append(tc)
            if "conccl" in recs:  # every round's results against the reference's
                cx, ccounts, _ = state["c"]
                want = case()
                wrong = wrong or not (torch.equal(cx, want["rx"]) and ccounts == want["rcounts"]
                                      and torch.equal(state["cout"], want["rout"]))
            if "conccl_graph" in recs:
                wrong_graph = wrong_graph or not fixed.right(case())
            if "conccl_fixed" in recs:
                fx, fcounts, _ = state["f"]
                wrong_fixed = wrong_fixed or not fixed.right(case(), fx, fcounts, state["fout"])
        for i, w in (("conccl", wrong), ("conccl_graph", wrong_graph), ("conccl_fixed", wrong_fixed)):
            if i in recs:
                every = [None] * world
                dist.all_gather_object(every, w)
                recs[i].wrong = any(every)
        last = case()
        sent = {"conccl": sum(n for d, n in enumerate(state["c"][2].send.counts) if d != rank) if "c" in state else 0,
                "reference": sum(n for d, n in enumerate(last["rhandle"].send_counts) if d != rank)}
        sent["nccl_a2a"] = sent["conccl_a2a"] = sent["reference_scatter_add"] = sent["reference"]
        sent["conccl_graph"] = sent["conccl_fixed"] = cfg.tokens * (world - 1)  # fixed sizes: T rows to every rank
        for i in impls:
            rec = recs[i]
            rec.dispatch_ms, rec.dispatch_spread = slowest(dist, world, times[i][0])
            if times[i][1]:
                rec.combine_ms, rec.combine_spread = slowest(dist, world, times[i][1])
            every = [None] * world
            dist.all_gather_object(every, sent[i])
            rec.rows_sent = sum(every)
            rec.link_GBps = max(every) * cfg.hidden * elt / (rec.dispatch_ms * 1e6)
            d, c = calls[i]
            rec.kernel_us = _kernel_us(torch, dist, lambda: (d(), c() if c else None))
        # beside compute: the expert GEMM queued on this stream first, then a dispatch + combine
        # on the side stream: the GEMMs' time against alone, and the communication's
        gemm = lambda: _grouped_gemm(torch, last["rx"], w_experts, last["rcounts"])  # noqa: E731
        for i in impls:
            rec = recs[i]
            d, c = calls[i]
            comm_ms = (rec.dispatch_ms or 0) + (rec.combine_ms or 0)
            one = statistics.median([_timed(torch, dist, gemm) for _ in range(5)])
            reps = max(1, round(comm_ms / max(one, 1e-3)))
            loop = lambda: [gemm() for _ in range(reps)]  # noqa: E731
            alone, beside, comm = [], [], []
            for _ in range(cfg.runs):
                alone.append(_timed(torch, dist, loop))
                torch.cuda.synchronize()
                dist.barrier()
                torch.cuda.synchronize()
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
                ev[0].record()
                loop()  # queued first: the GEMMs hold the SMs when the communication arrives
                ev[1].record()
                with torch.cuda.stream(side):
                    ev[2].record()
                    d()
                    if c:
                        c()
                    ev[3].record()
                torch.cuda.synchronize()
                beside.append(ev[0].elapsed_time(ev[1]))
                comm.append(ev[2].elapsed_time(ev[3]))
            rec.gemm_alone_ms = slowest(dist, world, alone)[0]
            rec.gemm_beside_ms = slowest(dist, world, beside)[0]
            rec.gemm_slowdown = rec.gemm_beside_ms / rec.gemm_alone_ms
            rec.comm_beside_ms = slowest(dist, world, comm)[0]
        for i in impls:
            records.append(recs[i])
            if progress and rank == 0:
                progress(recs[i])
    if cfg.layer_chunks:
        try:
            records.append({"layer": time_layer(rank, world, cfg)})
        except Exception as e:  # noqa: BLE001 - the figures above are kept; the record says why
            records.append({"layer": {"error": f"{type(e).__name__}: {e}"}})
    if cfg.train_steps:
        try:
            records.append(train_both(rank, world, cfg))
        except Exception as e:  # noqa: BLE001 - the figures above are kept; the record says why
            records.append({"error": f"{type(e).__name__}: {e}", "equal": False})
    return records


def document(meta: dict, cfg: MoEBenchConfig, records: list) -> dict:
    train = [r for r in records if isinstance(r, dict) and "layer" not in r]
    layer = [r["layer"] for r in records if isinstance(r, dict) and "layer" in r]
    return {"machine_kind": meta.get("machine_kind"), "commit": meta.get("commit"), "torch": meta.get("torch"),
            "meta": meta, "config": asdict(cfg), "results": [asdict(r) for r in records if not isinstance(r, dict)],
            "training": train[0] if train else None, "layer": layer[0] if layer else None}


def _f(v, fmt=".3f"):
    return "" if v is None else format(v, fmt)


def markdown(doc: dict) -> str:
    meta, c = doc["meta"], doc["config"]
    lines = [f"# conccl bench moe ({meta.get('machine_kind')}, {meta.get('device')}, world {meta.get('world')})", "",
             f"{meta.get('date')}, commit {str(doc.get('commit'))[:12]}, torch {doc.get('torch')}, NCCL "
             f"{meta.get('nccl')}. {c['tokens']} tokens per rank, hidden {c['hidden']}, {c['experts']} experts, "
             f"top-{c['topk']}, {c['dtype']}, "
             f"{'a new routing every run' if c.get('fresh_routing', True) else 'one routing'}; "
             f"the slowest rank's median of {c['runs']} runs (ms, wall time "
             f"with host syncs); GEMM: the grouped expert GEMM (ffn {c['ffn']}) alone and beside one dispatch "
             "and combine.", "",
             "| routing | impl | dispatch ms | spread | combine ms | spread | rows to peers | link GB/s | "
             "kernel us | GEMM alone ms | beside ms | slowdown | comm beside ms | wrong |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in doc["results"]:
        if r["error"]:
            lines.append(f"| {r['routing']} | {r['impl']} | error: {r['error'][:80]} |" + " |" * 11)
            continue
        spread = lambda v: "" if v is None else f"{100 * v:.1f}%"  # noqa: E731
        lines.append(f"| {r['routing']} | {r['impl']} | {_f(r['dispatch_ms'])} | {spread(r['dispatch_spread'])} | "
                     f"{_f(r['combine_ms'])} | {spread(r['combine_spread'])} | {r['rows_sent']} | "
                     f"{_f(r['link_GBps'], '.1f')} | {_f(r['kernel_us'], '.0f')} | {_f(r['gemm_alone_ms'])} | "
                     f"{_f(r['gemm_beside_ms'])} | {_f(r['gemm_slowdown'])} | {_f(r.get('comm_beside_ms'))} | "
                     f"{'WRONG' if r['wrong'] else ''} |")
    lay = doc.get("layer")
    if lay and lay.get("error"):
        lines += ["", f"MoE layer timing failed: {lay['error'][:300]}"]
    elif lay:
        lines += ["", f"A MoE layer, forward + backward (GELU experts of width {lay['ffn']}, grouped GEMMs), "
                      f"{lay['chunks']} micro-batches where chunked; ms, the slowest rank's median:", "",
                  "| layer | ms | spread | x reference |", "| --- | ---: | ---: | ---: |"]
        ref = lay.get("reference", {}).get("ms")
        for name in LAYER_VARIANTS:
            if lay.get(name):
                ratio = f"{lay[name]['ms'] / ref:.3f}" if ref else ""
                lines.append(f"| {name} | {lay[name]['ms']:.3f} | {100 * lay[name]['spread']:.1f}% | {ratio} |")
    t = doc.get("training")
    if t and t.get("error"):
        lines += ["", f"Training failed: {t['error'][:300]}"]
    elif t:
        lines += ["", f"Training: the small MoE model ({t['config']['layers']} layers, dim {t['config']['dim']}, ffn "
                      f"{t['config']['ffn']}, {t['config']['tokens_per_rank']} tokens per rank), "
                      f"{t['config']['steps']} AdamW steps on each dispatcher in turn; losses and parameters "
                      f"{'equal bit for bit' if t['equal'] else 'NOT EQUAL'}; loss {t['first_loss']:.4f} -> "
                      f"{t['last_loss']:.4f}.", "", "| dispatcher | step ms | spread |", "| --- | ---: | ---: |"]
        for name in ("conccl", "reference"):
            if t.get(name):
                lines.append(f"| {name} | {t[name]['step_ms']:.3f} | {100 * t[name]['spread']:.1f}% |")
    return "\n".join(lines) + "\n"


def write(out, doc: dict) -> None:
    from ..jsonfile import write_text

    write_text(out / "moe.json", json.dumps(doc, indent=1))
    write_text(out / "moe.md", markdown(doc))
