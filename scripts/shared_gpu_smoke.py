"""Several conccl ranks on ONE GPU: every rank is a process bound to cuda:0, over a gloo group.

Where no multi-GPU machine is lent, this runs the protocol between ranks on real CUDA: peer
pads and workspaces mapped through symmetric memory (IPC), stream memory-op signals between
processes, the reduction kernel reading a peer's workspace, captured graphs replayed with
new inputs, persistent ops. It says nothing about speed (the ranks share one GPU's engines)
and nothing about NVLink; the tests under tests/gpu/ need one GPU per rank.

PyTorch's symmetric memory refuses two ranks on one device, so the executor's allocator is
swapped here (this script only) for plain CUDA IPC: ``torch.empty`` plus the caching
allocator's IPC handles, exchanged over the gloo group. Everything above the allocator is
conccl's own code.

Expected values need no communication: every rank regenerates every rank's inputs from
seeds and applies the registry's stated arithmetic (``Collective.reference``), which
tests/gpu/ compare against NCCL bit for bit. A case passes only if the output's bits equal
the reference's.

    PYTHONPATH=src python scripts/shared_gpu_smoke.py [--world 2] [--json OUT.json] [--fsdp] [--only tp,...]
    PYTHONPATH=src python scripts/shared_gpu_smoke.py --world 4 --only hier   # 2 simulated hosts x 2
    PYTHONPATH=src python scripts/shared_gpu_smoke.py --world 4 --only fsdp_hosts   # HSDP, full sharding
    PYTHONPATH=src python scripts/shared_gpu_smoke.py --world 4 --only hier_faults  # a rank killed on host 1
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _make(tag: int, rank: int, step: int, n: int, dtype):
    g = torch.Generator(device="cuda").manual_seed(1_000_003 * tag + 1009 * rank + step)
    return torch.randn(n, device="cuda", generator=g).to(dtype)


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _kernels(prof) -> list[str]:
    """Kernels (SM work) the profiler saw; copy-engine records ("Memcpy DtoD ...") are not."""
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(("Memcpy ", "Memset "))})


def _eager(rank, world, cases):
    from torch.distributed import ReduceOp

    import conccl
    from conccl.collectives import REGISTRY

    group = conccl.get_group()
    premul = dist._make_nccl_premul_sum(0.25)
    tag = 0
    for dtype in DTYPES:
        for n in (1, 1000, 12345, (8 << 20) // 2 + 3):
            tag += 1
            every = [_make(tag, r, 0, n, dtype) for r in range(world)]
            out = torch.empty(world * n, dtype=dtype, device="cuda")
            conccl.all_gather_into_tensor(out, every[rank])
            torch.cuda.synchronize()
            cases.append((f"all_gather {dtype} n={n}", _same(out, REGISTRY["all_gather"].reference(every, rank))))

            tag += 1
            every = [_make(tag, r, 0, world * n, dtype) for r in range(world)]
            out = torch.empty(world * n, dtype=dtype, device="cuda")
            conccl.all_to_all_single(out, every[rank])
            torch.cuda.synchronize()
            cases.append((f"all_to_all {dtype} n={n}", _same(out, REGISTRY["all_to_all"].reference(every, rank))))

            for op in (ReduceOp.SUM, ReduceOp.AVG, premul):
                opname = getattr(op, "name", None) or str(op)
                out = torch.full((n,), float("nan"), dtype=dtype, device="cuda")
                conccl.reduce_scatter_tensor(out, every[rank], op=op)
                torch.cuda.synchronize()
                want = REGISTRY["reduce_scatter"].reference(every, rank, [(op,)] * world)
                cases.append((f"reduce_scatter {dtype} n={n} {opname}", _same(out, want)))

                for mode in (conccl.StreamMode.BATCH, conccl.StreamMode.PER_PEER):
                    x = every[rank].clone()
                    if mode is conccl.StreamMode.BATCH:
                        conccl.all_reduce(x, op=op)
                        got = x
                    else:
                        got = torch.full_like(x, float("nan"))
                        group.all_reduce(got, x, op, stream_mode=mode)
                    torch.cuda.synchronize()
                    want = REGISTRY["all_reduce"].reference(every, rank, [(op,)] * world)
                    cases.append((f"all_reduce {dtype} n={world * n} {opname} {mode.value}", _same(got, want)))


def _persistent(rank, world, cases):
    import conccl
    from conccl.collectives import REGISTRY

    n = 4099
    ag_in = torch.empty(n, device="cuda")
    ag_out = torch.empty(world * n, device="cuda")
    ar = torch.empty(world * n + 5, dtype=torch.bfloat16, device="cuda")
    ag = conccl.persistent_all_gather_into_tensor(ag_out, ag_in)
    red = conccl.persistent_all_reduce(ar)
    for step in range(5):
        ag_every = [_make(50, r, step, n, torch.float32) for r in range(world)]
        ar_every = [_make(51, r, step, ar.numel(), torch.bfloat16) for r in range(world)]
        ag_in.copy_(ag_every[rank])
        ar.copy_(ar_every[rank])
        ag.start()
        red.start()
        side = torch.empty(world * 64, device="cuda")
        conccl.all_gather_into_tensor(side, torch.full((64,), float(rank + step), device="cuda"))
        torch.cuda.synchronize()
        cases.append((f"persistent all_gather step {step}", _same(ag_out, REGISTRY["all_gather"].reference(ag_every, rank))))
        cases.append((f"persistent all_reduce step {step}", _same(ar, REGISTRY["all_reduce"].reference(ar_every, rank))))
        side_want = torch.cat([torch.full((64,), float(r + step), device="cuda") for r in range(world)])
        cases.append((f"eager between persistent starts {step}", _same(side, side_want)))


def _graph(rank, world, cases, report):
    from torch.profiler import ProfilerActivity, profile

    import conccl
    from conccl.collectives import REGISTRY

    n = 4099
    ag_in, ag_out = torch.empty(n, device="cuda"), torch.empty(world * n, device="cuda")
    sym_out = conccl.empty(world * n)  # push straight into the peers' outputs
    a2a_in, a2a_out = torch.empty(world * n, device="cuda"), torch.empty(world * n, device="cuda")
    rs_in = torch.empty(world * n, dtype=torch.bfloat16, device="cuda")
    rs_out = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    ar = torch.empty(12345, dtype=torch.bfloat16, device="cuda")
    pers_out = torch.empty(world * n, device="cuda")
    pers = conccl.persistent_all_gather_into_tensor(pers_out, ag_in)

    def calls():
        pers.start()
        conccl.all_gather_into_tensor(ag_out, ag_in)
        conccl.all_gather_into_tensor(sym_out, ag_in)
        conccl.all_to_all_single(a2a_out, a2a_in)
        conccl.reduce_scatter_tensor(rs_out, rs_in)
        conccl.all_reduce(ar)

    def fill(step):
        every = {"ag": [_make(60, r, step, n, torch.float32) for r in range(world)],
                 "a2a": [_make(61, r, step, world * n, torch.float32) for r in range(world)],
                 "rs": [_make(62, r, step, world * n, torch.bfloat16) for r in range(world)],
                 "ar": [_make(63, r, step, ar.numel(), torch.bfloat16) for r in range(world)]}
        for t, key in ((ag_in, "ag"), (a2a_in, "a2a"), (rs_in, "rs"), (ar, "ar")):
            t.copy_(every[key][rank])
        return every

    fill(0)
    calls()  # eager warm-up: kernels compiled, programs made
    torch.cuda.synchronize()
    conccl.reserve_graph_workspace(16 << 20)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    for step in range(1, 9):
        every = fill(step)
        graph.replay()
        if step % 3 == 1:  # an eager call between replays
            side = torch.empty(world * 8, device="cuda")
            conccl.all_gather_into_tensor(side, torch.full((8,), float(rank), device="cuda"))
        torch.cuda.synchronize()
        ag_want = REGISTRY["all_gather"].reference(every["ag"], rank)
        cases += [(f"graph replay {step} all_gather", _same(ag_out, ag_want)),
                  (f"graph replay {step} all_gather into symmetric output", _same(sym_out, ag_want)),
                  (f"graph replay {step} persistent all_gather", _same(pers_out, ag_want)),
                  (f"graph replay {step} all_to_all", _same(a2a_out, REGISTRY["all_to_all"].reference(every["a2a"], rank))),
                  (f"graph replay {step} reduce_scatter", _same(rs_out, REGISTRY["reduce_scatter"].reference(every["rs"], rank))),
                  (f"graph replay {step} all_reduce", _same(ar, REGISTRY["all_reduce"].reference(every["ar"], rank)))]
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    report["graph_kernels"] = _kernels(prof)
    dist.barrier()
    x, out = torch.randn(1 << 20, device="cuda"), torch.empty(world << 20, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        conccl.all_gather_into_tensor(out, x)
        torch.cuda.synchronize()
    report["eager_all_gather_kernels"] = _kernels(prof)
    cases.append(("eager all_gather launches no kernel", not report["eager_all_gather_kernels"]))
    # Same-GPU copies in a graph may run as the driver's memcpy kernels (scripts/graph_copy_probe.py):
    # reported, not failed; anything else is wrong.
    cases.append(("captured graph launches no kernel but the reduction and the driver's copy kernels",
                  all(k.startswith("reduce_") or k.startswith("memcpy") for k in report["graph_kernels"])))


_SHARDS: dict = {}  # direct -> the final shards of that run, to compare the two


def _fsdp_copy_kernel(name: str) -> bool:
    """FSDP's copies around its collectives: the all-gather copy-in (``_foreach_copy_``), the
    copy-out (``split_with_sizes_copy``), the reduce-scatter copy-in (``chunk_cat``)."""
    return ("chunk_cat" in name or "split_with_sizes" in name
            or ("multi_tensor_apply" in name and "Copy<" in name))


def _fsdp(rank, world, cases, report, direct=False):
    """FSDP2 with conccl's hooks against the same model trained unsharded in this process
    (``direct``: ``conccl.fsdp.enable(direct=True)``, no copy-out or copy-in).

    Every rank trains on the same batch, so the averaged gradient is each rank's own (the
    average of equal fp32 values is exact where the world is a power of two) and the sharded
    run must equal the unsharded one shard for shard, bit for bit, after a few AdamW steps; at
    any world within 1e-5, and the direct run must equal the plain hooks' run bit for bit."""
    import copy

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    import conccl.fsdp
    from conccl import fsdp_direct

    torch.manual_seed(0)
    dim = int(os.environ.get("CONCCL_SMOKE_FSDP_DIM", "256"))
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                                      torch.nn.Linear(4 * dim, dim)) for _ in range(3)]).cuda()
    ref = copy.deepcopy(model)
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cuda")
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    comms = conccl.fsdp.enable(model, direct=direct)
    name = "fsdp2 + conccl" + (" direct" if direct else "")
    report[name] = {"modules": len(comms.modules), "fallback": comms.fallback}
    c = fsdp_direct.COUNTS
    counts = lambda: (c.skipped_copy_outs, c.declined_gathers,  # noqa: E731
                      c.skipped_copy_ins, c.declined_reduces, c.skipped_gather_copy_ins)
    before = counts()
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
    g = torch.Generator(device="cuda").manual_seed(7)  # the same batch on every rank
    executors = [p.group.executor for p in comms.pools.values()]
    compiled = []  # copy-engine programs compiled per step: buffers that move recompile
    peaks = []  # bytes the sharded model's forward + backward allocated above its start, per step
    for _ in range(4):
        x = torch.randn(64, dim, device="cuda", generator=g)
        start = sum(e.programs_compiled for e in executors)
        for m, opt in zip((model, ref), opts):
            if m is model:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            m(x).square().mean().backward()
            if m is model:
                torch.cuda.synchronize()
                peaks.append(torch.cuda.max_memory_allocated() - base)
            opt.step()
            opt.zero_grad()
        compiled.append(sum(e.programs_compiled for e in executors) - start)
    report[name]["programs_compiled_per_step"] = compiled
    report[name]["step_peak_bytes"] = peaks
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # one more step, forward and backward
        model(x).square().mean().backward()
        torch.cuda.synchronize()
    report[name]["kernels"] = _kernels(prof)
    report[name]["copy_kernels"] = [k for k in report[name]["kernels"] if _fsdp_copy_kernel(k)]
    model.zero_grad()
    same, close = [], []
    for p, q in zip(model.parameters(), ref.parameters()):
        mine = p.to_local()
        want = q.detach().chunk(world, dim=0)[rank] if q.shape[0] >= world else q.detach()
        want = want[:mine.shape[0]]
        same.append(_same(mine.contiguous(), want.contiguous()))
        close.append(bool(torch.allclose(mine, want, rtol=1e-5, atol=1e-6)))
    _SHARDS[direct] = [p.to_local().detach().clone() for p in model.parameters()]
    if direct and False in _SHARDS:  # the same arithmetic as the plain hooks at any world size
        cases.append((f"{name}: every shard equals the plain hooks' run's, bit for bit",
                      all(_same(a, b) for a, b in zip(_SHARDS[True], _SHARDS[False]))))
    if world & (world - 1) == 0:  # AVG of equal values is exact only where 1/world is (a power of two)
        cases.append((f"{name}: every shard equals unsharded training's, bit for bit", all(same)))
    cases.append((f"{name}: every shard within 1e-5 of unsharded training's", all(close)))
    cases.append((f"{name}: every FSDP module with parameters on conccl", not comms.fallback and len(comms.modules) == 3))
    report[name].update(zip(("skipped_copy_outs", "declined_gathers", "skipped_copy_ins", "declined_reduces",
                             "skipped_gather_copy_ins"), (b - a for a, b in zip(before, counts()))))
    r = report[name]
    if direct:  # every gather and reduce of these plain Linear shards uses the parameters and gradients in place
        cases.append((f"{name}: copy-outs and both copy-ins skipped, none declined",
                      r["skipped_copy_outs"] > 0 and r["skipped_copy_ins"] > 0 and r["skipped_gather_copy_ins"] > 0
                      and r["declined_gathers"] == r["declined_reduces"] == 0))
        plain = report.get("fsdp2 + conccl", {}).get("copy_kernels")
        cases.append((f"{name}: none of FSDP's copy kernels the plain hooks ran ({plain})",
                      bool(plain) and not set(plain) & set(r["copy_kernels"])))


def _fsdp_hosts(rank, world, cases):
    """FSDP2 + ``conccl.fsdp.enable`` over 2 simulated hosts (``CONCCL_SIMULATED_HOSTS=2x<world/2>``,
    set while enable makes the groups): HSDP (2-D mesh: the shard group, one host, on copy
    engines; FSDP's replicate all-reduce on gloo) and full sharding (1-D mesh over every rank:
    the hierarchical group). Each against the same model trained unsharded in this process on
    the same batch on every rank: the reduced gradient is each rank's own (every partial sum of
    equal values exact where the world is a power of two), so every shard equals the unsharded
    model's, bit for bit. The divide factor is set to the world: FSDP then passes the shard
    group PREMUL_SUM(1/world) (HSDP) or AVG (full) and all-reduces with SUM (gloo has no AVG
    on CUDA tensors)."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import conccl
    import conccl.fsdp
    from conccl.group.hierarchical import HierarchicalGroup
    from conccl.group.topology import SIMULATED_HOSTS_ENV

    if world % 2 or world < 4:
        cases.append((f"fsdp_hosts needs an even world of 4 or more, got {world}", False))
        return
    per, dim = world // 2, 128
    for layout in ("hsdp", "full"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                                          torch.nn.Linear(4 * dim, dim)) for _ in range(3)]).cuda()
        ref = copy.deepcopy(model)
        shape, names = ((2, per), ("replicate", "shard")) if layout == "hsdp" else ((world,), ("shard",))
        mesh = init_device_mesh("cuda", shape, mesh_dim_names=names)
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.set_gradient_divide_factor(float(world))
        os.environ[SIMULATED_HOSTS_ENV] = f"2x{per}"
        try:
            comms = conccl.fsdp.enable(model)
            group = conccl.get_group(mesh.get_group("shard"))
        finally:
            del os.environ[SIMULATED_HOSTS_ENV]
        cases.append((f"fsdp_hosts {layout}: the FSDP group is {'hierarchical' if layout == 'full' else 'one host'}",
                      isinstance(group, HierarchicalGroup) == (layout == "full")))
        cases.append((f"fsdp_hosts {layout}: every FSDP module on conccl ({comms.fallback})",
                      not comms.fallback and len(comms.modules) == 3))
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
        g = torch.Generator(device="cuda").manual_seed(7)  # the same batch on every rank
        for _ in range(4):
            x = torch.randn(64, dim, device="cuda", generator=g)
            for m, opt in zip((model, ref), opts):
                m(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
        torch.cuda.synchronize()
        shard_rank, shard_size = mesh.get_local_rank("shard"), mesh.size(len(shape) - 1)
        same = []
        for p, q in zip(model.parameters(), ref.parameters()):
            mine = p.to_local()
            want = q.detach().chunk(shard_size, dim=0)[shard_rank][:mine.shape[0]]
            same.append(_same(mine.contiguous(), want.contiguous()))
        cases.append((f"fsdp_hosts {layout}: every shard equals unsharded training's after 4 steps, bit for bit",
                      all(same)))


TP_SCHEDULES = ("serial", "ring", "direct", "direct-p2", "direct-p4-g2", "ring-p3", "direct-p3-g3", "auto")


def _ints(shape, seed, dtype):
    """Small whole numbers: every GEMM of them accumulates exactly in fp32, so a GEMM cut into
    other row blocks rounds to the same bits, and "the serial result" is one exact answer."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-3, 4, shape, device="cuda", generator=g).to(dtype)


def _tp(rank, world, cases, report):
    """conccl.tp: every pipeline schedule against the serial result, bit for bit; the kernels a
    pipelined call runs are only its GEMMs' (and the reduction's): no copy or spinning kernel."""
    from torch.profiler import ProfilerActivity, profile

    from conccl.collectives import REGISTRY
    from conccl.integrations import tp as ctp

    for dtype in (torch.bfloat16, torch.float16):
        for rows, K, Ns in ((64, 128, (96, 32)), (5, 64, (48,))):
            shards = [_ints((rows, K), 100 + r, dtype) for r in range(world)]
            weights = [_ints((K, n), 7 + i, dtype) for i, n in enumerate(Ns)]
            full = torch.cat(shards)
            expect = [full @ w for w in weights]
            a_rs = [_ints((world * rows, K), 200 + r, dtype) for r in range(world)]
            partial = [(a @ weights[0]).reshape(-1) for a in a_rs]
            expect_rs = REGISTRY["reduce_scatter"].reference(partial, rank).view(rows, Ns[0])
            for name in TP_SCHEDULES:
                A, outs = ctp.all_gather_matmul(shards[rank], weights, 0, schedule=name, return_gathered=True)
                torch.cuda.synchronize()
                cases.append((f"tp ag_gemm {dtype} {rows}x{K} {name}",
                              _same(A, full) and all(_same(o, e) for o, e in zip(outs, expect))))
                out = ctp.matmul_reduce_scatter(a_rs[rank], weights[0], 0, schedule=name)
                torch.cuda.synchronize()
                cases.append((f"tp gemm_rs {dtype} {rows}x{K} {name}", _same(out, expect_rs)))
    # Which kernels: the pipeline's GEMM steps run alone (plain torch.mm on the same rows) give
    # the allowed set; the reduction kernel is the reduce-scatter's only other SM work.
    from conccl.pipeline import TPSchedule, gemm_steps

    rows, K, N = 512, 256, 384
    shard, w = _ints((rows, K), 300 + rank, torch.bfloat16), _ints((K, N), 9, torch.bfloat16)
    a = _ints((world * rows, K), 400 + rank, torch.bfloat16)
    tp = TPSchedule.parse("direct-p2")
    ctp.all_gather_matmul(shard, w, 0, schedule=tp)
    ctp.matmul_reduce_scatter(a, w, 0, schedule=tp)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for start, end, _ in gemm_steps(world, rank, tp, rows) + gemm_steps(world, rank, tp, rows, scatter=True):
            torch.mm(a[start:end], w)
        torch.cuda.synchronize()
    allowed = set(_kernels(prof))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ctp.all_gather_matmul(shard, w, 0, schedule=tp)
        torch.cuda.synchronize()
    ag_kernels = _kernels(prof)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ctp.matmul_reduce_scatter(a, w, 0, schedule=tp)
        torch.cuda.synchronize()
    rs_kernels = _kernels(prof)
    report["tp_kernels"] = {"gemm_steps_alone": sorted(allowed), "ag_gemm": ag_kernels, "gemm_rs": rs_kernels}
    cases.append(("tp ag_gemm runs no kernel but its GEMMs'", bool(ag_kernels) and set(ag_kernels) <= allowed))
    extra = set(rs_kernels) - allowed
    cases.append(("tp gemm_rs runs no kernel but its GEMMs' and the reduction's",
                  bool(rs_kernels) and all(k.startswith("reduce_") for k in extra) and len(extra) <= 1))


def _tp_layers(rank, world, cases):
    """conccl.tp's autograd layers on CUDA: a SwiGLU MLP block sharded with ColumnParallelLinear
    and RowParallelLinear (fp32) trains like the unsharded block: each rank's weight shard and
    the summed loss after 3 SGD steps, against the same block computed whole on this rank."""
    from conccl.integrations import tp as ctp

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


def _hier(rank, world, cases):
    """Simulated hosts on one GPU (``CONCCL_SIMULATED_HOSTS=2x<world/2>``, set for this group
    only): the hierarchical group (conccl.group.hierarchical) through the public functions,
    node-local halves on copy engines, gloo between the pretend hosts; every collective, dtype
    and op against the flat reference, bit for bit (small whole numbers: every partial sum is
    exact, and AVG over 4 ranks scales by a power of two)."""
    from torch.distributed import ReduceOp

    import conccl
    from conccl.collectives import REGISTRY
    from conccl.group.hierarchical import HierarchicalGroup
    from conccl.group.topology import SIMULATED_HOSTS_ENV

    if world % 2 or world < 4:
        cases.append((f"hier needs an even world of 4 or more, got {world}", False))
        return
    pg = dist.new_group(list(range(world)))
    os.environ[SIMULATED_HOSTS_ENV] = f"2x{world // 2}"
    try:
        group = conccl.get_group(pg)  # the variable is read here, once
    finally:
        del os.environ[SIMULATED_HOSTS_ENV]
    cases.append(("hier: a group over 2 simulated hosts is hierarchical", isinstance(group, HierarchicalGroup)))
    premul = dist._make_nccl_premul_sum(0.5)
    tag = 500
    for n in (1, 1000, 12345 * world, (4 << 20) // 2 + 3):
        for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.int32):
            tag += 1
            every = [_ints((n,), 1009 * tag + r, dtype) for r in range(world)]
            out = torch.empty(world * n, dtype=dtype, device="cuda")
            conccl.all_gather_into_tensor(out, every[rank], group=pg)
            torch.cuda.synchronize()
            cases.append((f"hier all_gather {dtype} n={n}", _same(out, REGISTRY["all_gather"].reference(every, rank))))
            every = [_ints((world * n,), 1009 * tag + 7 + r, dtype) for r in range(world)]
            out = torch.empty(world * n, dtype=dtype, device="cuda")
            conccl.all_to_all_single(out, every[rank], group=pg)
            torch.cuda.synchronize()
            cases.append((f"hier all_to_all {dtype} n={n}", _same(out, REGISTRY["all_to_all"].reference(every, rank))))
            if dtype is torch.int32:
                continue
            for op in (ReduceOp.SUM, ReduceOp.AVG, premul):
                opname = getattr(op, "name", None) or str(op)
                args = [(op,)] * world
                out = torch.full((n,), float("nan"), dtype=dtype, device="cuda")
                conccl.reduce_scatter_tensor(out, every[rank], op=op, group=pg)
                torch.cuda.synchronize()
                cases.append((f"hier reduce_scatter {dtype} {opname} n={n}",
                              _same(out, REGISTRY["reduce_scatter"].reference(every, rank, args))))
                t = every[rank].clone()
                conccl.all_reduce(t, op=op, group=pg)
                torch.cuda.synchronize()
                cases.append((f"hier all_reduce {dtype} {opname} n={world * n}",
                              _same(t, REGISTRY["all_reduce"].reference(every, rank, args))))
                t = every[rank][:n + 1].clone()  # a count the hosts' rank count does not divide
                conccl.all_reduce(t, op=op, group=pg)
                torch.cuda.synchronize()
                cases.append((f"hier all_reduce {dtype} {opname} n={n + 1}",
                              _same(t, REGISTRY["all_reduce"].reference([e[:n + 1] for e in every], rank, args))))
    # persistent ops: agreed across the pretend hosts once, started with new contents each time
    n, dtype = 4099, torch.bfloat16
    shard, out = torch.empty(n, dtype=dtype, device="cuda"), torch.empty(world * n, dtype=dtype, device="cuda")
    summed = torch.empty(world * n + 1, dtype=dtype, device="cuda")
    ops = (conccl.persistent_all_gather_into_tensor(out, shard, group=pg), conccl.persistent_all_reduce(summed, group=pg))
    for step in range(3):
        tag += 1
        gather_in = [_ints((n,), 1009 * tag + r, dtype) for r in range(world)]
        reduce_in = [_ints((world * n + 1,), 1009 * tag + 50 + r, dtype) for r in range(world)]
        shard.copy_(gather_in[rank])
        summed.copy_(reduce_in[rank])
        for op in ops:
            op.start()
        torch.cuda.synchronize()
        cases.append((f"hier persistent all_gather start {step}", _same(out, REGISTRY["all_gather"].reference(gather_in, rank))))
        cases.append((f"hier persistent all_reduce start {step}",
                      _same(summed, REGISTRY["all_reduce"].reference(reduce_in, rank))))
    for op in ops:
        op.close()


def _hier_faults(rank, world, cases, report):
    """A rank killed on another simulated host (issue 32): the last rank (host 1) exits after
    one good all-gather; every survivor's next call raises CollectiveTimeout (or GroupBroken,
    where a rank of its host already broke the group) within the group's timeout plus one
    second, and the call after that GroupBroken. Run last and alone (--only hier_faults): the
    world's process group is unusable afterwards."""
    import time

    import conccl
    from conccl.group import Options
    from conccl.group.topology import SIMULATED_HOSTS_ENV

    if world % 2 or world < 4:
        cases.append((f"hier_faults needs an even world of 4 or more, got {world}", False))
        return
    timeout = 3.0
    pg = dist.new_group(list(range(world)))
    os.environ[SIMULATED_HOSTS_ENV] = f"2x{world // 2}"
    try:
        conccl.get_group(pg, Options(timeout=timedelta(seconds=timeout)))
    finally:
        del os.environ[SIMULATED_HOSTS_ENV]
    x = torch.full((1 << 20,), float(rank), device="cuda")
    out = torch.empty(world << 20, device="cuda")
    conccl.all_gather_into_tensor(out, x, group=pg)
    torch.cuda.synchronize()
    cases.append(("hier_faults: the call before the kill is right",
                  bool((out.view(world, -1) == torch.arange(world, device="cuda").float()[:, None]).all())))
    victim = world - 1
    if rank == victim:
        cases.append(("hier_faults: the victim exits", True))
        report["cases"] = cases
        report["victim"] = True
        _QUEUE.put(report)
        _QUEUE.close()
        _QUEUE.join_thread()
        os._exit(1)
    start = time.monotonic()
    try:
        conccl.all_gather_into_tensor(out, x, group=pg)
        torch.cuda.synchronize()
        first = "no error"
    except conccl.CollectiveError as e:
        first = type(e).__name__
    waited = time.monotonic() - start
    report["hier_faults_waited_s"] = waited
    cases.append((f"hier_faults: survivor raised {first} after {waited:.2f} s (timeout {timeout} s)",
                  first in ("CollectiveTimeout", "GroupBroken") and waited < timeout + 1.0))
    try:
        conccl.all_gather_into_tensor(out, x, group=pg)
        later = "no error"
    except conccl.CollectiveError as e:
        later = type(e).__name__
    cases.append((f"hier_faults: the next call raised {later}", later == "GroupBroken"))


def _bench_tp(rank, world, cases, report):
    """`conccl bench tp`'s multi-rank runner (what issue 31's two-GPU run starts) on small
    shapes: every conccl implementation runs, agrees with the serial result and is timed.
    NCCL is the gloo group here, so serial_nccl may be refused (recorded, not counted)."""
    from conccl.bench import tp as bench_tp

    shape = (world * 256, 256, 384)
    cfg = bench_tp.TPBenchConfig(shapes={"ag_gemm": (shape,), "gemm_rs": (shape,)},
                                 schedules=("serial", "ring", "direct-p2", "direct-p4-g2"),
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


class _IpcHandle:
    def __init__(self, buffer_ptrs, keep):
        self.buffer_ptrs, self._keep = buffer_ptrs, keep


class IpcPeerMemory:
    """What conccl's executor asks of ``torch.distributed._symmetric_memory`` (``empty``,
    ``rendezvous(t, group).buffer_ptrs``), over CUDA IPC handles: every rank's storage base
    address as this process reaches it, for the process group of that name."""

    def empty(self, *size, dtype=None, device=None):
        return torch.empty(*size, dtype=dtype, device=device)

    def rendezvous(self, t, group_name):
        # the named group: the world's, or a simulated host's (the hier part's node-local groups)
        pg = dist.distributed_c10d._resolve_process_group(group_name)
        storage = t.untyped_storage()
        mine = storage._share_cuda_()
        every = [None] * dist.get_world_size(pg)
        dist.all_gather_object(every, mine, group=pg)
        keep = [torch.UntypedStorage._new_shared_cuda(*h) if r != dist.get_rank(pg) else storage
                for r, h in enumerate(every)]
        return _IpcHandle([s.data_ptr() for s in keep], keep)


def free_port_any() -> int:
    """A free TCP port on 127.0.0.1 (the rig's gloo rendezvous), whatever conccl checkout runs."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _use_ipc_peer_memory():
    from conccl import api, fsdp
    from conccl.executors import cuda_ce
    from conccl.group import make

    # FSDP's pool then finds no get_mem_pool and takes plain blocks (conccl stages through its
    # workspace); make_group finds no get_backend and leaves the backend alone
    api.symm_mem = cuda_ce.symm_mem = fsdp.symm_mem = make.symm_mem = IpcPeerMemory()


FSDP = os.environ.get("CONCCL_SMOKE_FSDP") == "1"  # set by --fsdp for the spawned ranks
ONLY = os.environ.get("CONCCL_SMOKE_ONLY", "")  # --only: comma-separated parts (default every part)


_QUEUE = None  # the worker's report queue (the hier_faults victim reports before it exits)


def _worker(rank, world, port, queue):
    global _QUEUE
    _QUEUE = queue
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    cases, report = [], {"rank": rank}
    if os.environ.get("CONCCL_SMOKE_DUMP_AFTER"):  # a hang shows where every thread waits
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["CONCCL_SMOKE_DUMP_AFTER"]), exit=True)
    try:
        torch.cuda.set_device(0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        _use_ipc_peer_memory()
        wanted = set(ONLY.split(",")) if ONLY else {"eager", "persistent", "graph", "tp", "tp_layers", "bench_tp"} | (
            {"hier", "fsdp_hosts"} if world >= 4 and world % 2 == 0 else set())  # hier_faults: by --only
        for name, part in (("eager", _eager), ("persistent", _persistent)):
            if name in wanted:
                part(rank, world, cases)
        if "graph" in wanted:
            _graph(rank, world, cases, report)
        if "tp" in wanted:
            _tp(rank, world, cases, report)
        if "tp_layers" in wanted:
            _tp_layers(rank, world, cases)
        if "bench_tp" in wanted:
            _bench_tp(rank, world, cases, report)
        if "hier" in wanted:
            _hier(rank, world, cases)
        if "fsdp_hosts" in wanted:
            _fsdp_hosts(rank, world, cases)
        if FSDP:
            _fsdp(rank, world, cases, report)
            _fsdp(rank, world, cases, report, direct=True)
        if "hier_faults" in wanted:  # last: it kills a rank
            _hier_faults(rank, world, cases, report)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        report["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    finally:
        try:
            import conccl

            conccl.destroy()
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    report["cases"] = cases
    queue.put(report)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--fsdp", action="store_true", help="also FSDP2 with conccl.fsdp.enable, plain and direct=True (4 steps, 3 blocks)")
    ap.add_argument("--fsdp-dim", type=int, default=256, help="the FSDP blocks' width (default 256)")
    ap.add_argument("--only", default="", help="comma-separated parts of eager, persistent, graph, tp, tp_layers, bench_tp, hier, "
                    "fsdp_hosts, hier_faults (default: all but hier_faults, which kills a rank; hier and fsdp_hosts at an "
                    "even world of 4 or more: 2 simulated hosts)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU visible", file=sys.stderr)
        return 2
    from conccl.launch import free_port

    os.environ["CONCCL_SMOKE_ONLY"] = a.only
    if a.fsdp:
        os.environ["CONCCL_SMOKE_FSDP"] = "1"  # spawned ranks re-import this module and read it
        os.environ["CONCCL_SMOKE_FSDP_DIM"] = str(a.fsdp_dim)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, a.world, port, queue)) for r in range(a.world)]
    for p in procs:
        p.start()
    reports = [queue.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():  # a survivor of hier_faults stuck tearing down a broken process group
            p.kill()
    reports.sort(key=lambda r: r["rank"])
    failed = [(r["rank"], name) for r in reports for name, ok in r["cases"] if not ok]
    errors = [(r["rank"], r["error"]) for r in reports if "error" in r]
    total = sum(len(r["cases"]) for r in reports)
    print(f"world {a.world} on one GPU: {total - len(failed)}/{total} cases right; graph kernels "
          f"{reports[0].get('graph_kernels')}; eager all-gather kernels {reports[0].get('eager_all_gather_kernels')}; "
          f"tp kernels {reports[0].get('tp_kernels')}")
    for rank, name in failed:
        print(f"  WRONG rank {rank}: {name}")
    for rank, err in errors:
        print(f"  ERROR rank {rank}: {err}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"world": a.world, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "reports": reports}, f, indent=1)
    return 1 if failed or errors or total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
