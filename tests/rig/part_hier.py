"""The rig's parts over simulated hosts: ``hier`` (the hierarchical group's collectives and
persistent ops against the flat reference, bit for bit) and ``hier_faults`` (a rank killed on
another simulated host). Both need an even world of 4 or more (2 hosts).

conccl is imported inside each part: the harness also serves scripts/launch_path_bench.py run
against another checkout's conccl, which may lack what a part uses."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from rig.common import RankLeaves, bits_equal, small_ints


def hier(rank, world, cases, report):
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
            every = [small_ints((n,), 1009 * tag + r, dtype) for r in range(world)]
            out = torch.empty(world * n, dtype=dtype, device="cuda")
            conccl.all_gather_into_tensor(out, every[rank], group=pg)
            torch.cuda.synchronize()
            cases.append((f"hier all_gather {dtype} n={n}", bits_equal(out, REGISTRY["all_gather"].reference(every, rank))))
            every = [small_ints((world * n,), 1009 * tag + 7 + r, dtype) for r in range(world)]
            out = torch.empty(world * n, dtype=dtype, device="cuda")
            conccl.all_to_all_single(out, every[rank], group=pg)
            torch.cuda.synchronize()
            cases.append((f"hier all_to_all {dtype} n={n}", bits_equal(out, REGISTRY["all_to_all"].reference(every, rank))))
            if dtype is torch.int32:
                continue
            for op in (ReduceOp.SUM, ReduceOp.AVG, premul):
                opname = getattr(op, "name", None) or str(op)
                args = [(op,)] * world
                out = torch.full((n,), float("nan"), dtype=dtype, device="cuda")
                conccl.reduce_scatter_tensor(out, every[rank], op=op, group=pg)
                torch.cuda.synchronize()
                cases.append((f"hier reduce_scatter {dtype} {opname} n={n}",
                              bits_equal(out, REGISTRY["reduce_scatter"].reference(every, rank, args))))
                t = every[rank].clone()
                conccl.all_reduce(t, op=op, group=pg)
                torch.cuda.synchronize()
                cases.append((f"hier all_reduce {dtype} {opname} n={world * n}",
                              bits_equal(t, REGISTRY["all_reduce"].reference(every, rank, args))))
                t = every[rank][:n + 1].clone()  # a count the hosts' rank count does not divide
                conccl.all_reduce(t, op=op, group=pg)
                torch.cuda.synchronize()
                cases.append((f"hier all_reduce {dtype} {opname} n={n + 1}",
                              bits_equal(t, REGISTRY["all_reduce"].reference([e[:n + 1] for e in every], rank, args))))
    # persistent ops: agreed across the pretend hosts once, started with new contents each time
    n, dtype = 4099, torch.bfloat16
    shard, out = torch.empty(n, dtype=dtype, device="cuda"), torch.empty(world * n, dtype=dtype, device="cuda")
    summed = torch.empty(world * n + 1, dtype=dtype, device="cuda")
    ops = (conccl.persistent_all_gather_into_tensor(out, shard, group=pg), conccl.persistent_all_reduce(summed, group=pg))
    for step in range(3):
        tag += 1
        gather_in = [small_ints((n,), 1009 * tag + r, dtype) for r in range(world)]
        reduce_in = [small_ints((world * n + 1,), 1009 * tag + 50 + r, dtype) for r in range(world)]
        shard.copy_(gather_in[rank])
        summed.copy_(reduce_in[rank])
        for op in ops:
            op.start()
        torch.cuda.synchronize()
        cases.append((f"hier persistent all_gather start {step}", bits_equal(out, REGISTRY["all_gather"].reference(gather_in, rank))))
        cases.append((f"hier persistent all_reduce start {step}",
                      bits_equal(summed, REGISTRY["all_reduce"].reference(reduce_in, rank))))
    for op in ops:
        op.close()


def hier_faults(rank, world, cases, report):
    """A rank killed on another simulated host: the last rank (host 1) exits after
    one good all-gather; every survivor's next call raises CollectiveTimeout (or GroupBroken,
    where a rank of its host already broke the group) within the group's timeout plus one
    second, and the call after that GroupBroken. Run last and alone (a rig run of its own): the
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
        report["victim"] = True
        raise RankLeaves
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
