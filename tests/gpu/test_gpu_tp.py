"""GPU tier: conccl.tp on one GPU per rank. Every pipeline schedule against the serial result
(NCCL's all-gather then the GEMM, or the GEMM then NCCL's reduce-scatter) at bf16 and fp16,
the autograd layers against unsharded training, and proof of what ran (no kernel but the
GEMMs' and the reduction's). Skipped without 2 GPUs (conftest.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

SCHEDULES = ("serial", "ring", "direct", "direct-p2", "direct-p4", "direct-p4-g2", "ring-p2", "direct-s2",
             "direct-p2-s2", "push", "push-s2", "auto")


def _kernels(prof) -> set:
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
            and not e.name.startswith(("Memcpy ", "Memset "))}


def _exact_reduction_operands(M: int, K: int, N: int, dtype, g):
    """A GEMM+reduce-scatter's operands whose every partial product and every partial sum over
    up to 8 ranks is a whole number of magnitude <= 192: exact in bf16 and fp16, so NCCL's
    reduce-scatter (which rounds after each of its additions, in an order of its own) and
    conccl's (fp32, rounded once) give the same bits at any world size. Random integers in
    [-3, 3] in the first 8 columns of ``a`` (the rest 0), ``w`` in [-1, 1]."""
    a = torch.zeros(M, K, dtype=dtype, device="cuda")
    a[:, :8] = torch.randint(-3, 4, (M, 8), device="cuda", generator=g).to(dtype)
    w = torch.randint(-1, 2, (K, N), device="cuda", generator=g).to(dtype)
    return a, w


def _against_serial(rank, world):
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from conccl import tp as ctp
    from conccl.schedule.pipeline import TPSchedule, gemm_steps

    bad = []
    for dtype in (torch.bfloat16, torch.float16):
        g = torch.Generator(device="cuda").manual_seed(rank)
        rows, K, N = 1024, 512, 768
        # Whole numbers: every GEMM sums exactly in fp32, so any row blocking gives the same bits.
        shard = torch.randint(-3, 4, (rows, K), device="cuda", generator=g).to(dtype)
        w = torch.randint(-3, 4, (K, N), device="cuda", generator=torch.Generator(device="cuda").manual_seed(9)).to(dtype)
        full = torch.empty(world * rows, K, dtype=dtype, device="cuda")
        dist.all_gather_into_tensor(full, shard)
        expect = full @ w
        a = torch.randint(-3, 4, (world * rows, K), device="cuda", generator=g).to(dtype)
        a_rs, w_rs = _exact_reduction_operands(world * rows, K, N, dtype, g)
        expect_rs = torch.empty(rows, N, dtype=dtype, device="cuda")
        dist.reduce_scatter_tensor(expect_rs, a_rs @ w_rs)
        for name in SCHEDULES:
            A, (y,) = ctp.all_gather_matmul(shard, [w], 0, schedule=name, return_gathered=True)
            _, (y2,) = ctp.all_gather_matmul(shard, [w], 0, schedule=name)  # no gathered rows kept
            torch.cuda.synchronize()
            if not (torch.equal(A, full) and torch.equal(y, expect) and torch.equal(y2, expect)):
                bad.append(("ag_gemm", str(dtype), name))
            z = ctp.matmul_reduce_scatter(a_rs, w_rs, 0, schedule=name)
            torch.cuda.synchronize()
            if not torch.equal(z, expect_rs):
                bad.append(("gemm_rs", str(dtype), name))
    tp = TPSchedule.parse("direct-p2")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for s, e, _ in gemm_steps(world, rank, tp, rows) + gemm_steps(world, rank, tp, rows, scatter=True):
            torch.mm(a[s:e], w)
        torch.cuda.synchronize()
    allowed = _kernels(prof)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ctp.all_gather_matmul(shard, [w], 0, schedule=tp)
        ctp.matmul_reduce_scatter(a, w, 0, schedule=tp)
        torch.cuda.synchronize()
    extra = _kernels(prof) - allowed
    return bad, sorted(extra)


def test_every_schedule_equals_the_serial_result_and_runs_only_gemms_and_the_reduction():
    from conccl.launch import run_per_gpu

    for bad, extra in run_per_gpu(_against_serial):
        assert bad == []
        assert all(k.startswith("reduce_") for k in extra) and len(extra) <= 1, extra


def _push(rank, world):
    """The push pipeline from a plain shard, double-buffered (8 MiB shards) and over the whole
    workspace (128 MiB shards: world x that is above 64 MiB), three calls each, against NCCL's
    all-gather then one GEMM; and what it runs: the GEMM steps' kernels and peer copies only,
    no staging (a same-GPU copy: a kernel or a "Memcpy DtoD")."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from conccl.api import get_group
    from conccl import tp as ctp
    from conccl.schedule.pipeline import TPSchedule, gemm_steps

    bad, seen = [], []
    dt = torch.bfloat16
    w = torch.randint(-3, 4, (4096, 512), device="cuda", generator=torch.Generator(device="cuda").manual_seed(9)).to(dt)
    for rows in (1024, 16384):
        g = torch.Generator(device="cuda").manual_seed(rank)
        shard = torch.randint(-3, 4, (rows, 4096), device="cuda", generator=g).to(dt)
        full = torch.empty(world * rows, 4096, dtype=dt, device="cuda")
        dist.all_gather_into_tensor(full, shard)
        expect = full @ w  # whole numbers: exact in fp32, so any row blocking gives these bits
        for name in ("push", "push-s2"):
            for _ in range(3):
                _, (y,) = ctp.all_gather_matmul(shard, [w], 0, schedule=name)
                if not torch.equal(y, expect):
                    bad.append((rows, name))
        tp = TPSchedule.parse("push")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for s, e, _ in gemm_steps(world, rank, tp, rows):
                torch.mm(full[s:e], w)
            torch.cuda.synchronize()
        allowed = _kernels(prof)
        # The call's driver calls: a call that makes a settled pipeline's graph (its buffers'
        # third) also runs PyTorch's one-time fills of the RNG state a CUDAGraph capture registers
        # (FillFunctor<long>); graphed calls' kernels: test_settled_... below.
        ex = get_group(None).executor
        ex._settled_pipeline = lambda *a, **k: False
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                ctp.all_gather_matmul(shard, [w], 0, schedule=tp)
                torch.cuda.synchronize()
        finally:
            del ex._settled_pipeline
        seen.append((sorted(_kernels(prof) - allowed),
                     sorted({e.name for e in prof.events() if e.name.startswith("Memcpy ")})))
    return bad, seen


def test_the_push_pipeline_equals_nccl_and_stages_nothing():
    from conccl.launch import run_per_gpu

    for bad, seen in run_per_gpu(_push):
        assert bad == []
        for extra, copies in seen:
            assert extra == [], extra  # no kernel but the GEMM steps'
            assert copies and all("PtoP" in c for c in copies), copies  # peer copies only


def _mlp(rank, world):
    from conccl import tp as ctp

    torch.manual_seed(0)
    d, f, seq = 256, 512, 64 * world
    dt = torch.bfloat16
    gate, up, down = (torch.randn(f, d, device="cuda") * 0.05, torch.randn(f, d, device="cuda") * 0.05,
                      torch.randn(d, f, device="cuda") * 0.05)
    x = torch.randn(seq, d, device="cuda")
    part = slice(rank * f // world, (rank + 1) * f // world)
    col = ctp.ColumnParallelLinear(d, (f, f), world_size=world, device="cuda", dtype=dt)
    row = ctp.RowParallelLinear(f, d, world_size=world, device="cuda", dtype=dt)
    with torch.no_grad():
        col.weights[0].copy_(gate[part])
        col.weights[1].copy_(up[part])
        row.weight.copy_(down[:, part])
    rows = slice(rank * seq // world, (rank + 1) * seq // world)
    g_, u_ = col(x[rows].to(dt))
    y = row(torch.nn.functional.silu(g_) * u_)
    y.float().square().sum().backward()
    ref_y = (torch.nn.functional.silu(x @ gate.t()) * (x @ up.t())) @ down.t()
    err = (y.float() - ref_y[rows]).abs().max().item() / ref_y.abs().max().item()
    return err, all(p.grad is not None and torch.isfinite(p.grad).all().item() for p in col.parameters())


def test_parallel_layers_match_the_unsharded_block_within_bf16_rounding():
    from conccl.launch import run_per_gpu

    for err, grads in run_per_gpu(_mlp):
        assert err < 2e-2 and grads


def _captured(rank, world):
    """Both ops captured into one CUDA graph with several schedules, replayed with new inputs
    (eager pipelines in between) against serial NCCL; the replay runs no NCCL kernel and no
    kernel but the GEMMs', the staging copy's and the reduction's."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import conccl
    from conccl import tp as ctp

    rows, K, N = 512, 256, 384
    dt = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(rank)
    w = torch.randint(-3, 4, (K, N), device="cuda", generator=torch.Generator(device="cuda").manual_seed(9)).to(dt)
    shard = torch.empty(rows, K, dtype=dt, device="cuda")
    a = torch.empty(world * rows, K, dtype=dt, device="cuda")
    w_rs = torch.empty(K, N, dtype=dt, device="cuda")
    names = ("direct", "direct-p2", "serial", "push", "push-s2", "direct-p2-s2")

    def fill():  # whole numbers: every blocking of a GEMM and every order of the sums exact, so NCCL's bits
        shard.copy_(torch.randint(-3, 4, shard.shape, device="cuda", generator=g).to(dt))
        for dst, src in zip((a, w_rs), _exact_reduction_operands(world * rows, K, N, dt, g)):
            dst.copy_(src)

    def calls():
        return [(ctp.all_gather_matmul(shard, w, 0, schedule=s, return_gathered=True),
                 ctp.matmul_reduce_scatter(a, w_rs, 0, schedule=s)) for s in names]

    fill()
    calls()  # eager first: groups made, kernels loaded
    torch.cuda.synchronize()
    conccl.reserve_graph_workspace(16 << 20)
    graph = torch.cuda.CUDAGraph()
    executor = conccl.api.get_group(None).executor
    edged = executor.edge_captures
    with torch.cuda.graph(graph):
        results = calls()
    # every pipeline captured with its marks as graph edges (conccl.schedule.captured.mark_edges), the
    # default; none with CONCCL_DISABLE=graph_mark_edges (stream memory operations on pad words)
    from conccl.schedule.captured import mark_edges_on
    want = 2 * len(names) if mark_edges_on() else 0
    assert executor.edge_captures - edged == want, (executor.edge_captures - edged, want)
    bad = []
    for step in range(6):
        fill()
        full = torch.empty(world * rows, K, dtype=dt, device="cuda")
        dist.all_gather_into_tensor(full, shard)
        rs = torch.empty(rows, N, dtype=dt, device="cuda")
        dist.reduce_scatter_tensor(rs, a @ w_rs)
        graph.replay()
        if step % 2:  # an eager pipeline between replays
            ctp.all_gather_matmul(shard.clone(), w, 0, schedule="direct-p2")
        torch.cuda.synchronize()
        for s, ((A, (y,)), z) in zip(names, results):
            if not (torch.equal(A, full) and torch.equal(y, full @ w) and torch.equal(z, rs)):
                bad.append((s, step))
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                      and not e.name.startswith(("Memcpy ", "Memset "))})
    return bad, kernels


def test_captured_pipelines_replay_equal_to_serial_nccl():
    from conccl.launch import run_per_gpu

    for bad, kernels in run_per_gpu(_captured):
        assert bad == []
        assert not any(("nccl" in k.lower() and "conccl" not in k.lower()) for k in kernels), kernels


def _settled(rank, world):
    """Eager pipelines called again and again on the same tensors (new values each call): from
    the third call with the same buffers each runs as one graph launch (a settled pipeline,
    conccl.executors.cuda.settled_pipeline; not a pull all-gather, which stages its shard
    with a same-GPU copy); every result equals serial NCCL's; a graphed call runs no kernel but
    the GEMMs' and the reduction's (no copy made a kernel); and with rank 1 kept on driver calls
    (the routes interoperate: same operations, same values) results are still NCCL's."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from conccl.api import get_group
    from conccl import tp as ctp

    ex = get_group(None).executor
    rows, K, N = 512, 1024, 768
    dt = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(rank)
    w = torch.randint(-3, 4, (K, N), device="cuda", generator=torch.Generator(device="cuda").manual_seed(9)).to(dt)
    shard = torch.empty(rows, K, dtype=dt, device="cuda")
    a = torch.empty(world * rows, K, dtype=dt, device="cuda")
    w_rs = torch.empty(K, N, dtype=dt, device="cuda")
    out = {"bad": [], "rounds": []}
    for round_ in ("graphs", "mixed"):
        if round_ == "mixed" and rank == 1:
            ex._settled_pipeline = lambda *a, **k: False
        for name in ("direct", "push-s2", "direct-p2-s2"):
            for op in ("ag", "rs"):  # one op per loop: the counters are the executor's, per op here
                before = (ex.pipelines_graphed, ex.graph_launches)
                for call in range(8):
                    if op == "ag":
                        shard.copy_(torch.randint(-3, 4, shard.shape, device="cuda", generator=g).to(dt))
                        full = torch.empty(world * rows, K, dtype=dt, device="cuda")
                        dist.all_gather_into_tensor(full, shard)
                        expect = full @ w
                        _, (y,) = ctp.all_gather_matmul(shard, w, 0, schedule=name)
                    else:
                        for dst, src in zip((a, w_rs), _exact_reduction_operands(world * rows, K, N, dt, g)):
                            dst.copy_(src)
                        expect = torch.empty(rows, N, dtype=dt, device="cuda")
                        dist.reduce_scatter_tensor(expect, a @ w_rs)
                        full = None
                        y = ctp.matmul_reduce_scatter(a, w_rs, 0, schedule=name)
                    torch.cuda.synchronize()
                    if not torch.equal(y, expect):
                        out["bad"].append((round_, name, op, call))
                    # every tensor of the call freed before the next: the allocator hands the next
                    # call's outputs the same memory, so its buffers repeat
                    del y, full, expect
                out["rounds"].append((round_, name, op, ex.pipelines_graphed - before[0],
                                      ex.graph_launches - before[1]))
    from conccl.schedule.pipeline import TPSchedule, gemm_steps

    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # the GEMM steps' kernels, alone
        for s, e, _ in gemm_steps(world, rank, TPSchedule.parse("push-s2"), rows):
            torch.mm(a[s:e], w)
        for s, e, _ in gemm_steps(world, rank, TPSchedule.parse("direct-p2-s2"), rows, scatter=True):
            torch.mm(a[s:e], w_rs)
        torch.cuda.synchronize()
    allowed = _kernels(prof)
    def both():
        _, (y,) = ctp.all_gather_matmul(shard, w, 0, schedule="push-s2")
        del y
        z = ctp.matmul_reduce_scatter(a, w_rs, 0, schedule="direct-p2-s2")
        del z

    for _ in range(6):  # settled on these buffers, both workspace halves
        both()
    launches = ex.graph_launches
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # graphed: no copy turned into a kernel
        both()
        torch.cuda.synchronize()
    out["profiled_launches"] = ex.graph_launches - launches
    out["extra"] = sorted(_kernels(prof) - allowed)
    out["failures"] = ex.graph_failures
    return out


def test_settled_eager_pipelines_run_as_one_graph_launch_equal_to_serial_nccl():
    from conccl.launch import run_per_gpu

    for rank, got in enumerate(run_per_gpu(_settled)):
        assert got["bad"] == [] and got["failures"] == 0, got
        for round_, name, op, graphed, launched in got["rounds"]:
            # a pull all-gather+GEMM stages its plain shard (a same-GPU copy): never graphed
            graphable = op == "rs" or name.startswith("push")
            if (round_ == "mixed" and rank == 1) or not graphable:
                assert graphed == 0 and launched == 0, got  # driver calls only
            elif round_ == "mixed":
                assert launched >= 4, got  # the graphs made in the first round, against driver calls
            else:
                # a graph per workspace half (the calls alternate), made at the fifth and sixth
                # calls (each half's third) and launched from then on
                assert graphed >= 1 and launched >= 2, got
        if rank == 0:
            assert got["profiled_launches"] == 2, got
        assert all(k.startswith("reduce_") for k in got["extra"]) and len(got["extra"]) <= 1, got



def _refreshed(rank, world):
    """Pipelines on driver calls and as settled graphs with the eager mark words refreshed
    every three calls (CudaCopyEngineExecutor._refresh_marks: a fill on the control stream
    before the call forks): right against serial NCCL, the refresh ran, and after a call that
    refreshed, every eager mark word holds its sequence number (the words it wrote) or one less
    (the refresh's, the others)."""
    import torch.distributed as dist

    from conccl.api import get_group
    from conccl.executors.cuda.executor import MARK_REFRESH_CALLS
    from conccl.schedule.captured import GRAPH_SLOTS
    from conccl import tp as ctp
    from conccl.schedule.base import MARK_WORDS, mark_index

    group = get_group(None)
    ex = group.executor
    refreshed = []
    real = ex._refresh_marks
    ex.mark_refresh_calls = 3
    ex._refresh_marks = lambda ctrl, seq: (refreshed.append(seq), real(ctrl, seq))
    rows, K, N = 256, 512, 384
    dt = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(rank)
    w = torch.randint(-3, 4, (K, N), device="cuda", generator=torch.Generator(device="cuda").manual_seed(9)).to(dt)
    shard = torch.empty(rows, K, dtype=dt, device="cuda")
    a = torch.empty(world * rows, K, dtype=dt, device="cuda")
    w_rs = torch.empty(K, N, dtype=dt, device="cuda")
    bad, words = [], None
    try:
        names = ("direct", "push-s2", "direct-p2-s2", "direct")
        for i, name in enumerate(names):
            for call in range(10):
                final = i == len(names) - 1 and call == 9
                if final:
                    ex.mark_refresh_calls = 1  # the last call refreshes: its words are read below
                shard.copy_(torch.randint(-3, 4, shard.shape, device="cuda", generator=g).to(dt))
                full = torch.empty(world * rows, K, dtype=dt, device="cuda")
                dist.all_gather_into_tensor(full, shard)
                _, (y,) = ctp.all_gather_matmul(shard, w, 0, schedule=name)
                torch.cuda.synchronize()
                if not torch.equal(y, full @ w):
                    bad.append((name, "ag", call))
                if not final:
                    for dst, src in zip((a, w_rs), _exact_reduction_operands(world * rows, K, N, dt, g)):
                        dst.copy_(src)
                    expect = torch.empty(rows, N, dtype=dt, device="cuda")
                    dist.reduce_scatter_tensor(expect, a @ w_rs)
                    z = ctp.matmul_reduce_scatter(a, w_rs, 0, schedule=name)
                    torch.cuda.synchronize()
                    if not torch.equal(z, expect):
                        bad.append((name, "rs", call))
                    del z, expect
                del y, full
        lo = mark_index(0, world, GRAPH_SLOTS)
        words = sorted(set(ex._pad[lo:lo + MARK_WORDS].tolist()))
        last = group.seq
    finally:
        ex.mark_refresh_calls = MARK_REFRESH_CALLS
        del ex._refresh_marks  # the method again
    return {"bad": bad, "refreshes": len(refreshed), "last_refresh": refreshed[-1] if refreshed else None,
            "last_seq": last, "words": words, "launches": ex.graph_launches, "failures": ex.graph_failures}


def test_mark_words_refreshed_every_few_calls_keep_pipelines_equal_to_serial_nccl():
    from conccl.launch import run_per_gpu

    for got in run_per_gpu(_refreshed):
        assert got["bad"] == [] and got["failures"] == 0, got
        assert got["refreshes"] >= 20 and got["launches"] > 0, got  # ~78 calls, a refresh every 3
        # the last call (a pull on driver calls, which writes its marks) refreshed first
        assert got["last_refresh"] == got["last_seq"], got
        assert set(got["words"]) <= {got["last_seq"] - 1, got["last_seq"]} and got["last_seq"] - 1 in got["words"], got
