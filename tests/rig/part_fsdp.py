"""The rig's FSDP2 parts: ``fsdp`` (``conccl.fsdp.enable``, plain and ``direct=True``, against
unsharded training) and ``fsdp_hosts`` (HSDP and full sharding over 2 simulated hosts).

conccl is imported inside each part: the harness also serves scripts/launch_path_bench.py run
against another checkout's conccl, which may lack what a part uses."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from rig.common import bits_equal, sm_kernels

_shards: dict = {}  # direct -> the final shards of that run, to compare the two


def _fsdp_copy_kernel(name: str) -> bool:
    """FSDP's copies around its collectives: the all-gather copy-in (``_foreach_copy_``), the
    copy-out (``split_with_sizes_copy``), the reduce-scatter copy-in (``chunk_cat``)."""
    return ("chunk_cat" in name or "split_with_sizes" in name
            or ("multi_tensor_apply" in name and "Copy<" in name))


def _fsdp_run(rank, world, cases, report, direct, mixed=False):
    """FSDP2 with conccl's hooks against the same model trained unsharded in this process
    (``direct``: ``conccl.fsdp.enable(direct=True)``, no copy-out or copy-in).

    Every rank trains on the same batch, so the averaged gradient is each rank's own (the
    average of equal fp32 values is exact where the world is a power of two) and the sharded
    run must equal the unsharded one shard for shard, bit for bit, after a few AdamW steps; at
    any world within 1e-5, and the direct run must equal the plain hooks' run bit for bit.

    ``mixed``: under FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), whose
    bf16 compute the unsharded fp32 model does not share: only the direct run against the plain
    hooks' (FSDP's cast copy-in, a flat fp32 reduce-scatter), bit for bit at any world, with
    the cast gathers and the widening reduction in place of FSDP's copies."""
    import copy

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import conccl.fsdp
    from conccl.fsdp import copy_free as fsdp_direct

    torch.manual_seed(0)
    dim = int(os.environ.get("CONCCL_SMOKE_FSDP_DIM", "256"))
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                                      torch.nn.Linear(4 * dim, dim)) for _ in range(3)]).cuda()
    ref = copy.deepcopy(model)
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cuda")
    kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} if mixed else {}
    for block in model:
        fully_shard(block, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    comms = conccl.fsdp.enable(model, direct=direct)
    name = "fsdp2 + conccl" + (" direct" if direct else "") + (" mixed precision" if mixed else "")
    report[name] = {"modules": len(comms.modules), "fallback": comms.fallback}
    c = fsdp_direct.COUNTS
    counts = lambda: (c.skipped_copy_outs, c.declined_gathers,  # noqa: E731
                      c.skipped_copy_ins, c.declined_reduces, c.skipped_gather_copy_ins, c.cast_gathers,
                      getattr(c, "reused_casts", 0))
    before = counts()
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
    g = torch.Generator(device="cuda").manual_seed(7)  # the same batch on every rank
    executors = [p.group.executor for p in comms.pools.values()]
    compiled = []  # copy-engine programs compiled per step: buffers that move re-address programs instead
    readdressed = []
    peaks = []  # bytes the sharded model's forward + backward allocated above its start, per step
    # direct: the sharded model's optimizer steps by FsdpComms.step_and_prefetch (the first
    # block's update, its gather for the next forward, the rest), the reference's by opt.step()
    prefetched = []
    for _ in range(4):
        x = torch.randn(64, dim, device="cuda", generator=g)
        start = sum(e.programs_compiled for e in executors)
        start_re = sum(e.programs_readdressed for e in executors)
        for m, opt in zip((model, ref), opts):
            if m is model:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            m(x).float().square().mean().backward()
            if m is model:
                torch.cuda.synchronize()
                peaks.append(torch.cuda.max_memory_allocated() - base)
            if m is model and direct and hasattr(comms, "step_and_prefetch"):
                prefetched.append(comms.step_and_prefetch(opt))
            else:
                opt.step()
            opt.zero_grad()
        compiled.append(sum(e.programs_compiled for e in executors) - start)
        readdressed.append(sum(e.programs_readdressed for e in executors) - start_re)
    report[name]["programs_compiled_per_step"] = compiled
    report[name]["programs_readdressed_per_step"] = readdressed
    cases.append((f"{name}: no copy-engine program compiled in the last step (re-addressed: {readdressed})",
                  compiled[-1] == 0))
    report[name]["step_peak_bytes"] = peaks
    if direct and hasattr(comms, "step_and_prefetch"):
        cases.append((f"{name}: every step but the first (it installs the hooks) issued the next forward's "
                      f"first gather ({prefetched})", prefetched == [False] + [True] * 3))
    if direct:  # the blocks' unsharded parameters made in the alternating pools (fsdp_direct.reuse)
        parities = [{(getattr(p, "_conccl_reuse", None) or (None, None))[1]
                     for p in block._get_fsdp_state()._fsdp_param_group.fsdp_params} for block in model]
        cases.append((f"{name}: each block's unsharded parameters in one pool, neighbours in the other ({parities})",
                      all(len(b) == 1 and None not in b for b in parities)
                      and all(a != b for a, b in zip(parities, parities[1:]))))
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # one more step, forward and backward
        model(x).square().mean().backward()
        torch.cuda.synchronize()
    report[name]["kernels"] = sm_kernels(prof)
    report[name]["copy_kernels"] = [k for k in report[name]["kernels"] if _fsdp_copy_kernel(k)]
    model.zero_grad()
    same, close = [], []
    for p, q in zip(model.parameters(), ref.parameters()):
        mine = p.to_local()
        want = q.detach().chunk(world, dim=0)[rank] if q.shape[0] >= world else q.detach()
        want = want[:mine.shape[0]]
        same.append(bits_equal(mine.contiguous(), want.contiguous()))
        close.append(bool(torch.allclose(mine, want, rtol=1e-5, atol=1e-6)))
    _shards[mixed, direct] = [p.to_local().detach().clone() for p in model.parameters()]
    if direct and (mixed, False) in _shards:  # the same arithmetic as the plain hooks at any world size
        cases.append((f"{name}: every shard equals the plain hooks' run's, bit for bit",
                      all(bits_equal(a, b) for a, b in zip(_shards[mixed, True], _shards[mixed, False]))))
    if world & (world - 1) == 0 and not mixed:  # AVG of equal values is exact only where 1/world is (a power of two)
        cases.append((f"{name}: every shard equals unsharded training's, bit for bit", all(same)))
    if not mixed:
        cases.append((f"{name}: every shard within 1e-5 of unsharded training's", all(close)))
    cases.append((f"{name}: every FSDP module with parameters on conccl", not comms.fallback and len(comms.modules) == 3))
    report[name].update(zip(("skipped_copy_outs", "declined_gathers", "skipped_copy_ins", "declined_reduces",
                             "skipped_gather_copy_ins", "cast_gathers", "reused_casts"),
                            (b - a for a, b in zip(before, counts()))))
    r = report[name]
    if direct:  # every gather and reduce of these plain Linear shards uses the parameters and gradients in place
        # (mixed: each gather's copy-in one cast into the cast home; the bf16 gradients summed into fp32)
        cases.append((f"{name}: copy-outs and both copy-ins skipped, none declined",
                      r["skipped_copy_outs"] > 0 and r["skipped_copy_ins"] > 0
                      and r["cast_gathers" if mixed else "skipped_gather_copy_ins"] > 0
                      and r["declined_gathers"] == r["declined_reduces"] == 0))
        if mixed and hasattr(comms, "step_and_prefetch"):  # each backward gather reads its forward's cast
            cases.append((f"{name}: {r['reused_casts']} backward gathers read the forward's cast, "
                          f"{r['cast_gathers']} cast", r["reused_casts"] >= 3 * 4 and r["cast_gathers"] >= 3 * 4))
        if mixed:
            cases.append((f"{name}: the reduction sums bf16 gradients into fp32 ({r['kernels']})",
                          any(k.startswith("reduce_wide_bf16") for k in r["kernels"])))
        plain = report.get("fsdp2 + conccl" + (" mixed precision" if mixed else ""), {}).get("copy_kernels")
        if mixed:  # the cast stays (into the cast home): FSDP's packing copies around the collectives do not
            packing = [k for k in r["copy_kernels"] if "chunk_cat" in k or "split_with_sizes" in k]
            cases.append((f"{name}: no chunk_cat or split copy ({plain} under the plain hooks; {packing})",
                          not packing))
        else:
            cases.append((f"{name}: none of FSDP's copy kernels the plain hooks ran ({plain})",
                          bool(plain) and not set(plain) & set(r["copy_kernels"])))


def fsdp_hosts(rank, world, cases, report):
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
            same.append(bits_equal(mine.contiguous(), want.contiguous()))
        cases.append((f"fsdp_hosts {layout}: every shard equals unsharded training's after 4 steps, bit for bit",
                      all(same)))


def fsdp(rank, world, cases, report):
    """FSDP2 with conccl's hooks, plain then ``direct=True`` (the direct run is compared with the
    plain one), then both again under FSDP2's bf16/fp32 mixed precision."""
    _shards.clear()
    _fsdp_run(rank, world, cases, report, direct=False)
    _fsdp_run(rank, world, cases, report, direct=True)
    _fsdp_run(rank, world, cases, report, direct=False, mixed=True)
    _fsdp_run(rank, world, cases, report, direct=True, mixed=True)
