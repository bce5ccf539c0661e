"""The rig's tensor-parallel parts: ``tp`` (every pipeline schedule of ``conccl.tp`` against the
serial result, bit for bit; which kernels a pipelined call runs), ``tp_layers`` (the parallel
linear layers train like the whole block) and ``bench_tp`` (``conccl bench tp``'s multi-rank
runner on small shapes).

conccl is imported inside each part: the harness also serves scripts/launch_path_bench.py run
against another checkout's conccl, which may lack what a part uses."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from rig.common import bits_equal, sm_kernels, small_ints

TP_SCHEDULES = ("serial", "ring", "direct", "direct-p2", "direct-p4-g2", "ring-p3", "direct-p3-g3", "direct-p2-s2",
                "push", "push-s2", "auto")

def tp(rank, world, cases, report):
    """conccl.tp: every pipeline schedule against the serial result, bit for bit; the kernels a
    pipelined call runs are only its GEMMs' (and the reduction's): no copy or spinning kernel."""
    from torch.profiler import ProfilerActivity, profile

    from conccl.collectives import REGISTRY
    from conccl import tp as ctp

    for dtype in (torch.bfloat16, torch.float16):
        for rows, K, Ns in ((64, 128, (96, 32)), (5, 64, (48,))):
            shards = [small_ints((rows, K), 100 + r, dtype) for r in range(world)]
            weights = [small_ints((K, n), 7 + i, dtype) for i, n in enumerate(Ns)]
            full = torch.cat(shards)
            expect = [full @ w for w in weights]
            a_rs = [small_ints((world * rows, K), 200 + r, dtype) for r in range(world)]
            partial = [(a @ weights[0]).reshape(-1) for a in a_rs]
            expect_rs = REGISTRY["reduce_scatter"].reference(partial, rank).view(rows, Ns[0])
            for name in TP_SCHEDULES:
                A, outs = ctp.all_gather_matmul(shards[rank], weights, 0, schedule=name, return_gathered=True)
                torch.cuda.synchronize()
                cases.append((f"tp ag_gemm {dtype} {rows}x{K} {name}",
                              bits_equal(A, full) and all(bits_equal(o, e) for o, e in zip(outs, expect))))
                _, outs = ctp.all_gather_matmul(shards[rank], weights, 0, schedule=name)  # no gathered rows kept
                torch.cuda.synchronize()
                cases.append((f"tp ag_gemm {dtype} {rows}x{K} {name} (no A)",
                              all(bits_equal(o, e) for o, e in zip(outs, expect))))
                out = ctp.matmul_reduce_scatter(a_rs[rank], weights[0], 0, schedule=name)
                torch.cuda.synchronize()
                cases.append((f"tp gemm_rs {dtype} {rows}x{K} {name}", bits_equal(out, expect_rs)))
    # Which kernels: the pipeline's GEMM steps run alone (plain torch.mm on the same rows) give
    # the allowed set; the reduction kernel is the reduce-scatter's only other SM work.
    from conccl.schedule.pipeline import TPSchedule, gemm_steps

    rows, K, N = 512, 256, 384
    shard, w = small_ints((rows, K), 300 + rank, torch.bfloat16), small_ints((K, N), 9, torch.bfloat16)
    a = small_ints((world * rows, K), 400 + rank, torch.bfloat16)
    piped = TPSchedule.parse("direct-p2")
    ctp.all_gather_matmul(shard, w, 0, schedule=piped)
    ctp.matmul_reduce_scatter(a, w, 0, schedule=piped)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for start, end, _ in gemm_steps(world, rank, piped, rows) + gemm_steps(world, rank, piped, rows, scatter=True):
            torch.mm(a[start:end], w)
        torch.cuda.synchronize()
    allowed = set(sm_kernels(prof))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ctp.all_gather_matmul(shard, w, 0, schedule=piped)
        torch.cuda.synchronize()
    ag_kernels = sm_kernels(prof)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ctp.matmul_reduce_scatter(a, w, 0, schedule=piped)
        torch.cuda.synchronize()
    rs_kernels = sm_kernels(prof)
    report["tp_kernels"] = {"gemm_steps_alone": sorted(allowed), "ag_gemm": ag_kernels, "gemm_rs": rs_kernels}
    cases.append(("tp ag_gemm runs no kernel but its GEMMs'", bool(ag_kernels) and set(ag_kernels) <= allowed))
    extra = set(rs_kernels) - allowed
    cases.append(("tp gemm_rs runs no kernel but its GEMMs' and the reduction's",
                  bool(rs_kernels) and all(k.startswith("reduce_") for k in extra) and len(extra) <= 1))
    _settled_pipelines(rank, world, cases)
    _captured(rank, world, cases)


def _settled_pipelines(rank, world, cases):
    """The same tensors called again and again with new contents: from the third call with the
    same buffers an eager pipeline runs as one graph launch (conccl.executors.cuda.executor
    ._settled_pipeline); every result the reference's bits, and graphs launched."""
    from conccl.api import get_group
    from conccl.collectives import REGISTRY
    from conccl import tp as ctp

    ex = get_group(None).executor
    if not hasattr(ex, "pipelines_graphed"):  # another checkout's conccl (the harness's launch bench)
        return
    rows, K, N = 64, 128, 96
    shard = torch.empty(rows, K, dtype=torch.bfloat16, device="cuda")
    a = torch.empty(world * rows, K, dtype=torch.bfloat16, device="cuda")
    w = small_ints((K, N), 17, torch.bfloat16)
    for name in ("direct", "push-s2"):
        before = (ex.pipelines_graphed, ex.graph_launches)
        right = True
        for step in range(7):
            shards = [small_ints((rows, K), 900 + 10 * step + r, torch.bfloat16) for r in range(world)]
            a_all = [small_ints((world * rows, K), 1000 + 10 * step + r, torch.bfloat16) for r in range(world)]
            shard.copy_(shards[rank])
            a.copy_(a_all[rank])
            _, (y,) = ctp.all_gather_matmul(shard, w, 0, schedule=name)
            z = ctp.matmul_reduce_scatter(a, w, 0, schedule=name)
            torch.cuda.synchronize()
            expect_rs = REGISTRY["reduce_scatter"].reference([(x @ w).reshape(-1) for x in a_all], rank).view(rows, N)
            right &= bits_equal(y, torch.cat(shards) @ w) and bits_equal(z, expect_rs)
            del y, z, shards, a_all, expect_rs  # freed before the next call: its buffers repeat
        graphed, launched = ex.pipelines_graphed - before[0], ex.graph_launches - before[1]
        # the GEMM+reduce-scatter, and the push all-gather (a pull one stages its shard on this
        # GPU, a copy a graph would run on SMs: driver calls)
        want = 2 if name.startswith("push") else 1
        cases.append((f"tp settled {name}: every call right, {graphed} graphs, {launched} launches",
                      right and graphed >= want and launched >= 2 * want and ex.graph_failures == 0))


def _captured(rank, world, cases):
    """Both ops captured into one CUDA graph (a staged all-gather, a push reduce-scatter; a
    pipelined and the serial schedule) and replayed with new inputs, an eager pipeline between
    replays: every result the reference's bits."""
    import conccl
    from conccl.collectives import REGISTRY
    from conccl import tp as ctp

    rows, K, N = 64, 128, 96
    shard = torch.empty(rows, K, dtype=torch.bfloat16, device="cuda")
    a = torch.empty(world * rows, K, dtype=torch.bfloat16, device="cuda")
    w = small_ints((K, N), 13, torch.bfloat16)
    names = ("direct-p2", "serial", "push")

    def calls():
        return [(ctp.all_gather_matmul(shard, w, 0, schedule=s, return_gathered=True),
                 ctp.matmul_reduce_scatter(a, w, 0, schedule=s)) for s in names]

    shard.copy_(small_ints((rows, K), 500 + rank, torch.bfloat16))
    a.copy_(small_ints((world * rows, K), 600 + rank, torch.bfloat16))
    calls()  # eagerly first: the GEMM kernels loaded
    torch.cuda.synchronize()
    conccl.reserve_graph_workspace(1 << 20)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        results = calls()
    for step in range(3):
        shards = [small_ints((rows, K), 700 + 10 * step + r, torch.bfloat16) for r in range(world)]
        a_all = [small_ints((world * rows, K), 800 + 10 * step + r, torch.bfloat16) for r in range(world)]
        shard.copy_(shards[rank])
        a.copy_(a_all[rank])
        graph.replay()
        ctp.all_gather_matmul(shards[rank].clone(), w, 0, schedule="direct")  # eager, between replays
        torch.cuda.synchronize()
        full = torch.cat(shards)
        expect_rs = REGISTRY["reduce_scatter"].reference([(x @ w).reshape(-1) for x in a_all], rank).view(rows, N)
        for s, ((A, (y,)), z) in zip(names, results):
            cases.append((f"tp captured {s} replay {step}",
                          bits_equal(A, full) and bits_equal(y, full @ w) and bits_equal(z, expect_rs)))
    # The captured calls hold their graph workspace for the group's life: with the graph gone,
    # close the group (every rank, once no peer reads this one's memory), so that a later part
    # reserving graph workspace gets a new group's (at world 4 the ep part could not otherwise
    # grow the 1 MiB these calls had taken).
    del graph, results
    torch.cuda.synchronize()
    dist.barrier()
    conccl.destroy()


def tp_layers(rank, world, cases, report):
    """conccl.tp's autograd layers on CUDA: a SwiGLU MLP block sharded with ColumnParallelLinear
    and RowParallelLinear (fp32) trains like the unsharded block: each rank's weight shard and
    the summed loss after 3 SGD steps, against the same block computed whole on this rank."""
    from conccl import tp as ctp

    for sched in os.environ.get("CONCCL_SMOKE_TP_LAYERS", "direct-p2,serial,auto").split(","):
        torch.manual_seed(0)
        d, f, seq = 64, int(os.environ.get("CONCCL_SMOKE_TP_F", 64 * world)), 8 * world
        gate, up, down = (torch.randn(f, d, device="cuda") * 0.1, torch.randn(f, d, device="cuda") * 0.1,
                          torch.randn(d, f, device="cuda") * 0.1)
        xs = [torch.randn(seq, d, device="cuda") for _ in range(3)]
        ref = [t.clone().requires_grad_() for t in (gate, up, down)]
        opt = torch.optim.SGD(ref, lr=0.1)
        ref_losses = []
        for x in xs:
            h = torch.nn.functional.silu(x @ ref[0].t()) * (x @ ref[1].t())
            loss = ((h @ ref[2].t()) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ref_losses.append(loss.item())
        col = ctp.ColumnParallelLinear(d, (f, f), world_size=world, schedule=sched, backward_schedule=sched,
                                       device="cuda", dtype=torch.float32)
        row = ctp.RowParallelLinear(f, d, world_size=world, schedule=sched, backward_schedule=sched,
                                    device="cuda", dtype=torch.float32)
        part, rows = slice(rank * f // world, (rank + 1) * f // world), slice(rank * seq // world, (rank + 1) * seq // world)
        with torch.no_grad():
            col.weights[0].copy_(gate[part])
            col.weights[1].copy_(up[part])
            row.weight.copy_(down[:, part])
        opt = torch.optim.SGD(list(col.parameters()) + list(row.parameters()), lr=0.1)
        losses = []
        trace = os.environ.get("CONCCL_SMOKE_TRACE")  # where a hang is: each phase synchronized and printed
        for i, x in enumerate(xs):
            g_, u_ = col(x[rows])
            if trace:
                torch.cuda.synchronize()
                print(f"rank {rank} {sched} step {i}: column forward done", flush=True)
            y = row(torch.nn.functional.silu(g_) * u_)
            local = (y ** 2).sum() / (seq * d)
            if trace:
                torch.cuda.synchronize()
                print(f"rank {rank} {sched} step {i}: row forward done", flush=True)
            opt.zero_grad()
            local.backward()
            if trace:
                torch.cuda.synchronize()
                print(f"rank {rank} {sched} step {i}: backward done", flush=True)
            opt.step()
            total = torch.tensor([local.item()], dtype=torch.float64)
            dist.all_reduce(total)
            losses.append(total.item())
        torch.cuda.synchronize()
        same_w = all(torch.allclose(mine, whole, rtol=1e-4, atol=1e-5) for mine, whole in
                     ((col.weights[0], ref[0].detach()[part]), (col.weights[1], ref[1].detach()[part]),
                      (row.weight, ref[2].detach()[:, part])))
        same_loss = all(abs(a - b) <= 1e-4 * abs(b) + 1e-7 for a, b in zip(losses, ref_losses))
        cases.append((f"tp layers {sched}: a sharded MLP trains like the whole one (weights, losses)", same_w and same_loss))
    _parallelized(rank, world, cases)


class _SwiGLU(torch.nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.gate, self.up = torch.nn.Linear(d, f, bias=False), torch.nn.Linear(d, f, bias=False)
        self.down = torch.nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def _parallelized(rank, world, cases):
    """conccl.tp.parallelize_module on CUDA: a plain nn.Linear MLP made sequence-parallel in place
    gives the whole module's rows and the shards of its weight gradients (fp32)."""
    from conccl import tp as ctp

    torch.manual_seed(1)
    d, f, seq = 64, 64 * world, 8 * world
    whole = _SwiGLU(d, f).cuda()
    block = _SwiGLU(d, f).cuda()
    block.load_state_dict(whole.state_dict())
    x = torch.randn(seq, d, device="cuda")
    (whole(x) ** 2).sum().backward()
    ctp.parallelize_module(block, {"gate": "colwise", "up": "colwise", "down": "rowwise"})
    rows, part = slice(rank * seq // world, (rank + 1) * seq // world), slice(rank * f // world, (rank + 1) * f // world)
    y = block(x[rows])
    (y ** 2).sum().backward()
    torch.cuda.synchronize()
    ok = (torch.allclose(y, whole(x)[rows], rtol=1e-4, atol=1e-5)
          and torch.allclose(block.gate.weights[0].grad, whole.gate.weight.grad[part], rtol=1e-4, atol=1e-4)
          and torch.allclose(block.down.weight.grad, whole.down.weight.grad[:, part], rtol=1e-4, atol=1e-4))
    cases.append(("tp parallelize_module: an nn.Linear MLP made sequence-parallel gives the whole one's rows and "
                  "gradient shards", ok))


def bench_tp(rank, world, cases, report):
    """`conccl bench tp`'s multi-rank runner (what a two-GPU `conccl bench tp` starts) on small
    shapes: every conccl implementation runs, agrees with the serial result and is timed.
    NCCL is the gloo group here, so serial_nccl may be refused (recorded, not counted)."""
    from conccl.bench import tp as bench_tp

    shape = (world * 256, 256, 384)
    cfg = bench_tp.TPBenchConfig(shapes={"ag_gemm": (shape,), "gemm_rs": (shape,)},
                                 schedules=("serial", "ring", "direct-p2", "direct-p4-g2", "push"),
                                 impls=("gemm_only", "serial_nccl", "serial_conccl", "conccl", "conccl_auto"),
                                 warmup=1, runs=3)
    records = bench_tp.run_rank(rank, world, cfg)
    report["bench_tp"] = [(r.op, r.impl, r.schedule, r.ms, r.wrong, r.error) for r in records]
    for r in records:
        if r.impl == "serial_nccl" and r.error:
            continue  # gloo, not NCCL, on this rig
        cases.append((f"bench tp {r.op} {r.impl} {r.schedule or ''}",
                      r.error is None and not r.wrong and r.ms is not None and r.ms > 0))
    timed = {(r.op, r.impl) for r in records if r.ms}
    cases.append(("bench tp timed every conccl implementation of both ops",
                  all((op, impl) in timed for op in ("ag_gemm", "gemm_rs")
                      for impl in ("gemm_only", "serial_conccl", "conccl", "conccl_auto"))))
