"""``conccl bench moe``'s whole-layer figures: a MoE layer's forward + backward over
micro-batches (:func:`time_layer`) and the small MoE model trained on both dispatchers
(:func:`train_both`); and the helpers the per-call figures share with them (the routings, a
timed call, the grouped expert GEMM). The per-call figures and the report are
:mod:`conccl.bench.moe`'s; ``cfg`` is its ``MoEBenchConfig``."""
from __future__ import annotations

from .timing import slowest

ROUTINGS = ("random", "skewed")
LAYER_VARIANTS = ("conccl_overlapped", "conccl_chunks_in_turn", "conccl", "conccl_fixed_overlapped", "conccl_fixed",
                  "reference")


def routing(torch, kind: str, tokens: int, experts: int, k: int, seed: int, device):
    """``(topk_idx [T, k] int64, topk_weights [T, k] fp32)``: distinct experts per token."""
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        logits = torch.randn(tokens, experts, generator=g)
    elif kind == "skewed":  # Zipf-like popularity: expert e drawn ~ 1 / (e + 1)^1.5
        p = 1.0 / torch.arange(1, experts + 1, dtype=torch.float32) ** 1.5
        logits = torch.log(p)[None, :] - torch.log(-torch.log(torch.rand(tokens, experts, generator=g)))  # Gumbel
    else:
        raise ValueError(f"routing {kind!r}: one of {', '.join(ROUTINGS)}")
    top = torch.topk(logits, k, dim=1)
    w = torch.softmax(top.values, dim=1)
    return top.indices.to(device), w.to(device)


def _timed(torch, dist, fn) -> float:
    """One call's wall time on the caller's stream, the ranks started together."""
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _grouped_gemm(torch, rows, weights, counts):
    """rows [N, H] grouped by expert (``counts``: a list, or a device tensor with fixed sizes,
    the rows past its sum ignored) times ``weights`` [E, H, F]: [N, F]."""
    if hasattr(torch, "_grouped_mm") and rows.is_cuda and rows.dtype == torch.bfloat16:
        if torch.is_tensor(counts):
            offs = counts.to(torch.int64).cumsum(0).to(torch.int32)
        else:  # from pinned memory, not waited for: a pageable copy would sync the stream per call
            offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).pin_memory().to(
                rows.device, non_blocking=True)
        try:
            return torch._grouped_mm(rows, weights, offs=offs)
        except RuntimeError:  # a torch build or layout it refuses: the loop below
            pass
    out, start = [], 0
    counts = counts.tolist() if torch.is_tensor(counts) else counts
    for e, n in enumerate(counts):
        out.append(rows[start:start + n] @ weights[e])
        start += n
    return torch.cat(out)


def train_both(rank: int, world: int, cfg) -> dict:
    """The small MoE model (4 layers, dim 2048, ``cfg``'s experts and top-k, ``cfg.tokens`` per
    rank, bf16) trained ``cfg.train_steps`` AdamW steps on each dispatcher, their steps in turn:
    per dispatcher the slowest rank's median step (ms, after 3) and whether the losses and the
    final parameters are equal bit for bit."""
    import torch
    import torch.distributed as dist

    from . import moe_model

    dev = torch.device("cuda", torch.cuda.current_device())
    seq = max(1, cfg.tokens // 4)
    mcfg = moe_model.MoEConfig(layers=4, experts=cfg.experts, topk=cfg.topk, dim=2048, ffn=1024, seq=seq, batch=4,
                               seed=cfg.seed)
    runs = {}
    for name in moe_model.DISPATCHERS:
        model = moe_model.build(mcfg, name, device=dev, dtype=getattr(torch, cfg.dtype))
        runs[name] = {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=3e-3), "ms": [], "losses": []}
    for step in range(cfg.train_steps):
        tokens, targets = moe_model.batch(mcfg, rank, step, dev)
        for name, r in runs.items():
            def one_step(r=r):
                r["losses"].append(moe_model.train_step(r["model"], r["opt"], tokens, targets))

            ms = _timed(torch, dist, one_step)
            if step >= 3:
                r["ms"].append(ms)
    c, ref = runs["conccl"], runs["reference"]
    same_loss = all(torch.equal(a, b) for a, b in zip(c["losses"], ref["losses"]))
    pc, pr = c["model"].state_dict(), ref["model"].state_dict()
    same_params = all(torch.equal(pc[n], pr[n]) for n in pc)
    every = [None] * world
    dist.all_gather_object(every, same_loss and same_params)
    out = {"config": {"layers": 4, "dim": 2048, "ffn": 1024, "tokens_per_rank": 4 * seq, "steps": cfg.train_steps},
           "equal": all(every), "first_loss": float(c["losses"][0]), "last_loss": float(c["losses"][-1])}
    for name, r in runs.items():
        out[name] = dict(zip(("step_ms", "spread"), slowest(dist, world, r["ms"]))) if r["ms"] else {}
    return out


def time_layer(rank: int, world: int, cfg) -> dict:
    """A MoE layer's forward + backward (GELU experts of width ``cfg.ffn``, grouped GEMMs):
    conccl.ep over ``cfg.layer_chunks`` micro-batches overlapped (:func:`conccl.ep.moe_layer`),
    the same chunks one after another, conccl.ep unchunked, and the reference dispatcher
    unchunked; the first three again with fixed sizes (no host sync: the host queues the whole
    layer ahead of the GPU, the expert GEMMs run over the worst case's rows with ``offs`` from
    the device counts); the slowest rank's median ms of each, in turns."""
    import torch
    import torch.distributed as dist

    from .. import ep
    from .moe_reference import reference_combine, reference_dispatch

    dt = getattr(torch, cfg.dtype)
    dev = torch.device("cuda", torch.cuda.current_device())
    epr = ep.layout.experts_per_rank(cfg.experts, world)
    gen = torch.Generator(device=dev).manual_seed(cfg.seed * 1000 + 17 + rank)
    w1 = (torch.randn(epr, cfg.hidden, cfg.ffn, device=dev, generator=gen) / cfg.hidden ** 0.5).to(dt).requires_grad_()
    w2 = (torch.randn(epr, cfg.ffn, cfg.hidden, device=dev, generator=gen) / cfg.ffn ** 0.5).to(dt).requires_grad_()
    x = torch.randn(cfg.tokens, cfg.hidden, device=dev, generator=gen).to(dt).requires_grad_()
    idx, wts = routing(torch, "random", cfg.tokens, cfg.experts, cfg.topk, cfg.seed * 1000 + rank, dev)

    def experts(rows, counts):
        return _grouped_gemm(torch, torch.nn.functional.gelu(_grouped_gemm(torch, rows, w1, counts)), w2, counts)

    def reference():
        rows, counts, h = reference_dispatch(x, idx, wts, cfg.experts)
        return reference_combine(experts(rows, counts), h)

    def layer(chunks, **kw):
        return lambda: ep.moe_layer(x, idx, wts, cfg.experts, experts, chunks=chunks, **kw)

    variants = {"conccl_overlapped": layer(cfg.layer_chunks),
                "conccl_chunks_in_turn": layer(cfg.layer_chunks, overlap=False),
                "conccl": layer(1),
                "conccl_fixed_overlapped": layer(cfg.layer_chunks, fixed_sizes=True),
                "conccl_fixed": layer(1, fixed_sizes=True),
                "reference": reference}
    assert tuple(variants) == LAYER_VARIANTS

    def step(fn):
        def run():
            for t in (x, w1, w2):
                t.grad = None
            fn().float().square().mean().backward()
        return run

    times = {name: [] for name in variants}
    for r in range(cfg.warmup + cfg.runs):
        for name, fn in variants.items():
            ms = _timed(torch, dist, step(fn))
            if r >= cfg.warmup:
                times[name].append(ms)
    out = {"chunks": cfg.layer_chunks, "ffn": cfg.ffn}
    for name, ms in times.items():
        out[name] = dict(zip(("ms", "spread"), slowest(dist, world, ms)))
    return out
