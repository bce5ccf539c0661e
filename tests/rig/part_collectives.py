"""The rig's collective parts: ``eager`` (every collective, dtype, size and op), ``persistent``
(persistent ops started with new contents, eager calls between), ``graph`` (the calls captured
into one CUDA graph, replayed with new inputs; which kernels a replay launches).
With ``CONCCL_ONE_SHOT_BELOW`` set the small calls run as one-shot kernels (``graph`` then
allows their kernel): ``CUDA_VISIBLE_DEVICES=0 CONCCL_ONE_SHOT_BELOW=1M pytest -q tests/rig``.

conccl is imported inside each part: the harness also serves scripts/launch_path_bench.py run
against another checkout's conccl, which may lack what a part uses."""
from __future__ import annotations

import torch
import torch.distributed as dist

from rig.common import DTYPES, bits_equal, seeded, sm_kernels


def eager(rank, world, cases, report):
    from torch.distributed import ReduceOp

    import conccl
    from conccl.collectives import REGISTRY

    group = conccl.get_group()
    staged_push = getattr(conccl.Algorithm, "STAGED_PUSH", None)  # None in an older checkout
    premul = dist._make_nccl_premul_sum(0.25)
    tag = 0
    for dtype in DTYPES:
        for n in (1, 1000, 12345, (8 << 20) // 2 + 3):
            tag += 1
            every = [seeded(tag, r, 0, n, dtype) for r in range(world)]
            out = torch.empty(world * n, dtype=dtype, device="cuda")
            conccl.all_gather_into_tensor(out, every[rank])
            torch.cuda.synchronize()
            cases.append((f"all_gather {dtype} n={n}", bits_equal(out, REGISTRY["all_gather"].reference(every, rank))))
            if staged_push is not None:  # pushed into the peers' workspace, copied out there
                out = torch.empty(world * n, dtype=dtype, device="cuda")
                group.all_gather_into_tensor(out, every[rank], algorithm=staged_push)
                torch.cuda.synchronize()
                cases.append((f"all_gather staged push {dtype} n={n}",
                              bits_equal(out, REGISTRY["all_gather"].reference(every, rank))))
            if hasattr(group.options, "own_chunk_via_peer"):  # a push, the own chunk read back from a peer
                out = conccl.empty(world * n, dtype=dtype)
                group.options.own_chunk_via_peer = rank % 2 == 0  # each rank's own choice: mixed here
                conccl.all_gather_into_tensor(out, every[rank])
                group.options.own_chunk_via_peer = False
                torch.cuda.synchronize()
                cases.append((f"all_gather push own chunk via peer {dtype} n={n}",
                              bits_equal(out, REGISTRY["all_gather"].reference(every, rank))))
                conccl.release(out)

            tag += 1
            every = [seeded(tag, r, 0, world * n, dtype) for r in range(world)]
            out = torch.empty(world * n, dtype=dtype, device="cuda")
            conccl.all_to_all_single(out, every[rank])
            torch.cuda.synchronize()
            cases.append((f"all_to_all {dtype} n={n}", bits_equal(out, REGISTRY["all_to_all"].reference(every, rank))))

            for op in (ReduceOp.SUM, ReduceOp.AVG, premul):
                opname = getattr(op, "name", None) or str(op)
                out = torch.full((n,), float("nan"), dtype=dtype, device="cuda")
                conccl.reduce_scatter_tensor(out, every[rank], op=op)
                torch.cuda.synchronize()
                want = REGISTRY["reduce_scatter"].reference(every, rank, [(op,)] * world)
                cases.append((f"reduce_scatter {dtype} n={n} {opname}", bits_equal(out, want)))

                # one pass or two by size (n is small here: one), and two asked for
                for mode, algo in ((conccl.StreamMode.BATCH, None), (conccl.StreamMode.PER_PEER, None),
                                   (conccl.StreamMode.PER_PEER, conccl.Algorithm.PUSH)):
                    x = every[rank].clone()
                    if mode is conccl.StreamMode.BATCH:
                        conccl.all_reduce(x, op=op)
                        got = x
                    else:
                        got = torch.full_like(x, float("nan"))
                        group.all_reduce(got, x, op, stream_mode=mode, algorithm=algo)
                    torch.cuda.synchronize()
                    want = REGISTRY["all_reduce"].reference(every, rank, [(op,)] * world)
                    cases.append((f"all_reduce {dtype} n={world * n} {opname} {mode.value} "
                                  f"{algo.value if algo else 'auto'}", bits_equal(got, want)))
    _settled(rank, world, group, cases)
    _settled_graphs(rank, world, group, cases)
    _routed_then_other_stream(rank, world, group, cases)


def _routed_then_other_stream(rank, world, group, cases):
    """A blocking all-reduce routed to the fallback backend (gloo here) on stream A behind a GPU
    sleep, then an all-gather of ours (copy engines) on stream B reading its result: the group
    orders the second after the first (the routed call's end event, which B's call waits for)."""
    import conccl

    n = 4096
    saved = dict(group.options.nccl_below)
    group.options.nccl_below = {"all_reduce": 1 << 30}  # only the all-reduce routes
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    try:
        for step in range(3):
            x = torch.full((n,), float(rank + step + 1), device="cuda")
            out = torch.zeros(world * n, device="cuda")
            torch.cuda.synchronize()
            with torch.cuda.stream(a):
                torch.cuda._sleep(20_000_000)  # the routed call lands well after B could start
                routed = conccl.all_reduce(x)  # in place: the sum of rank + step + 1 over the ranks
            with torch.cuda.stream(b):
                ours = conccl.all_gather_into_tensor(out, x)  # reads what the routed call wrote
            torch.cuda.synchronize()
            want = float(sum(r + step + 1 for r in range(world)))
            paths = (getattr(routed, "path", None), getattr(ours, "path", None))
            # ours is one-shot where the rig runs with CONCCL_ONE_SHOT_BELOW above its size
            own = "one_shot" if out.numel() * out.element_size() < group.options.one_shot_below else "copy_engines"
            cases.append((f"routed all_reduce then our all_gather on another stream, step {step} {paths}",
                          bool((out == want).all()) and paths == ("nccl", own)))
    finally:
        group.options.nccl_below = saved


def _settled(rank, world, group, cases):
    """The same tensors called again and again with new contents: once settled, the calls post
    their row on the host board and go on without waiting for the peers' (Options.post_settled);
    every result still the reference's bits, and the posts seen on the board."""
    import conccl
    from conccl.collectives import REGISTRY
    from conccl.group.agreement import POST_AFTER

    n, calls = 4099, POST_AFTER + 4
    ag_in, ag_out = torch.empty(n, device="cuda"), torch.empty(world * n, device="cuda")
    rs_in, rs_out = torch.empty(world * n, dtype=torch.bfloat16, device="cuda"), torch.empty(n, dtype=torch.bfloat16,
                                                                                              device="cuda")
    a2a_in, a2a_out = torch.empty(world * n, device="cuda"), torch.empty(world * n, device="cuda")
    before = group.board.posts
    for step in range(calls):
        ag_every = [seeded(70, r, step, n, torch.float32) for r in range(world)]
        rs_every = [seeded(71, r, step, world * n, torch.bfloat16) for r in range(world)]
        a2a_every = [seeded(72, r, step, world * n, torch.float32) for r in range(world)]
        ag_in.copy_(ag_every[rank])
        rs_in.copy_(rs_every[rank])
        a2a_in.copy_(a2a_every[rank])
        conccl.all_gather_into_tensor(ag_out, ag_in)
        conccl.reduce_scatter_tensor(rs_out, rs_in)
        conccl.all_to_all_single(a2a_out, a2a_in)
        torch.cuda.synchronize()
        cases.append((f"settled all_gather step {step}", bits_equal(ag_out, REGISTRY["all_gather"].reference(ag_every, rank))))
        cases.append((f"settled reduce_scatter step {step}",
                      bits_equal(rs_out, REGISTRY["reduce_scatter"].reference(rs_every, rank, [(None,)] * world))))
        cases.append((f"settled all_to_all step {step}", bits_equal(a2a_out, REGISTRY["all_to_all"].reference(a2a_every, rank))))
    if group.options.one_shot_below or group.options.nccl_below:
        return  # one-shot calls (CONCCL_ONE_SHOT_BELOW) and calls routed to NCCL never post
    # each collective whose plan no peer's row can change posts from its (POST_AFTER + 1)-th
    # call on: the all-gather and the reduce-scatter; an all-to-all never (its plan reads what
    # the peers send each other, Collective.plan_fixed_by_own_row)
    posting = [c for c in ("all_gather", "reduce_scatter", "all_to_all") if REGISTRY[c].plan_fixed_by_own_row(world)]
    assert posting == ["all_gather", "reduce_scatter"], posting
    cases.append((f"settled calls posted ({group.board.posts - before} of {3 * calls})",
                  group.board.posts - before == len(posting) * (calls - POST_AFTER)))


def _settled_graphs(rank, world, group, cases):
    """Calls on conccl.empty tensors repeated with new contents: from each program's third
    call on it runs as one CUDA graph launch (conccl.executors.cuda.graph_launch), whose signal
    values each call rewrites; every result still the reference's bits, and the launches seen."""
    import conccl
    from conccl.collectives import REGISTRY
    from conccl.executors.cuda import graph_launch as cuda_graph_launch

    ex = group.executor
    n, calls = 1031, 8
    ag_in, ag_out = conccl.empty(n), conccl.empty(world * n)
    rs_in, rs_out = conccl.empty(world * n, dtype=torch.bfloat16), conccl.empty(n, dtype=torch.bfloat16)
    before = ex.graph_launches
    for step in range(calls):
        ag_every = [seeded(73, r, step, n, torch.float32) for r in range(world)]
        rs_every = [seeded(74, r, step, world * n, torch.bfloat16) for r in range(world)]
        ag_in.copy_(ag_every[rank])
        rs_in.copy_(rs_every[rank])
        conccl.all_gather_into_tensor(ag_out, ag_in)
        conccl.reduce_scatter_tensor(rs_out, rs_in)
        torch.cuda.synchronize()
        cases.append((f"settled graph all_gather step {step}",
                      bits_equal(ag_out, REGISTRY["all_gather"].reference(ag_every, rank))))
        cases.append((f"settled graph reduce_scatter step {step}",
                      bits_equal(rs_out, REGISTRY["reduce_scatter"].reference(rs_every, rank, [(None,)] * world))))
    if group.options.one_shot_below or group.options.nccl_below or not cuda_graph_launch.available():
        return  # one-shot calls are one kernel launch already; routed calls are NCCL's
    cases.append((f"settled calls launched as graphs ({ex.graph_launches - before}, {ex.graph_failures} failed)",
                  ex.graph_launches - before >= 2 and ex.graph_failures == 0))
    for t in (ag_in, ag_out, rs_in, rs_out):
        conccl.release(t)


def persistent(rank, world, cases, report):
    import conccl
    from conccl.collectives import REGISTRY

    n = 4099
    ag_in = torch.empty(n, device="cuda")
    ag_out = torch.empty(world * n, device="cuda")
    ar = torch.empty(world * n + 5, dtype=torch.bfloat16, device="cuda")
    ag = conccl.persistent_all_gather_into_tensor(ag_out, ag_in)
    red = conccl.persistent_all_reduce(ar)
    for step in range(5):
        ag_every = [seeded(50, r, step, n, torch.float32) for r in range(world)]
        ar_every = [seeded(51, r, step, ar.numel(), torch.bfloat16) for r in range(world)]
        ag_in.copy_(ag_every[rank])
        ar.copy_(ar_every[rank])
        ag.start()
        red.start()
        side = torch.empty(world * 64, device="cuda")
        conccl.all_gather_into_tensor(side, torch.full((64,), float(rank + step), device="cuda"))
        torch.cuda.synchronize()
        cases.append((f"persistent all_gather step {step}", bits_equal(ag_out, REGISTRY["all_gather"].reference(ag_every, rank))))
        cases.append((f"persistent all_reduce step {step}", bits_equal(ar, REGISTRY["all_reduce"].reference(ar_every, rank))))
        side_want = torch.cat([torch.full((64,), float(r + step), device="cuda") for r in range(world)])
        cases.append((f"eager between persistent starts {step}", bits_equal(side, side_want)))


def graph(rank, world, cases, report):
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
    ar2 = torch.empty(12345, dtype=torch.bfloat16, device="cuda")
    pers_out = torch.empty(world * n, device="cuda")
    pers = conccl.persistent_all_gather_into_tensor(pers_out, ag_in)
    staged_push = getattr(conccl.Algorithm, "STAGED_PUSH", None)  # None in an older checkout
    sp_out = torch.empty(world * n, device="cuda")

    def calls():
        pers.start()
        conccl.all_gather_into_tensor(ag_out, ag_in)
        if staged_push is not None:
            conccl.get_group().all_gather_into_tensor(sp_out, ag_in, algorithm=staged_push)
        conccl.all_gather_into_tensor(sym_out, ag_in)
        conccl.all_to_all_single(a2a_out, a2a_in)
        conccl.reduce_scatter_tensor(rs_out, rs_in)
        conccl.all_reduce(ar)  # one pass at this size
        conccl.get_group().all_reduce(ar2, ar2, algorithm=conccl.Algorithm.PUSH)  # two passes

    def fill(step):
        every = {"ag": [seeded(60, r, step, n, torch.float32) for r in range(world)],
                 "a2a": [seeded(61, r, step, world * n, torch.float32) for r in range(world)],
                 "rs": [seeded(62, r, step, world * n, torch.bfloat16) for r in range(world)],
                 "ar": [seeded(63, r, step, ar.numel(), torch.bfloat16) for r in range(world)],
                 "ar2": [seeded(64, r, step, ar2.numel(), torch.bfloat16) for r in range(world)]}
        for t, key in ((ag_in, "ag"), (a2a_in, "a2a"), (rs_in, "rs"), (ar, "ar"), (ar2, "ar2")):
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
        cases += [(f"graph replay {step} all_gather", bits_equal(ag_out, ag_want)),
                  (f"graph replay {step} all_gather into symmetric output", bits_equal(sym_out, ag_want)),
                  (f"graph replay {step} persistent all_gather", bits_equal(pers_out, ag_want)),
                  (f"graph replay {step} all_gather staged push", staged_push is None or bits_equal(sp_out, ag_want)),
                  (f"graph replay {step} all_to_all", bits_equal(a2a_out, REGISTRY["all_to_all"].reference(every["a2a"], rank))),
                  (f"graph replay {step} reduce_scatter", bits_equal(rs_out, REGISTRY["reduce_scatter"].reference(every["rs"], rank))),
                  (f"graph replay {step} all_reduce", bits_equal(ar, REGISTRY["all_reduce"].reference(every["ar"], rank))),
                  (f"graph replay {step} all_reduce in two passes",
                   bits_equal(ar2, REGISTRY["all_reduce"].reference(every["ar2"], rank)))]
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    report["graph_kernels"] = sm_kernels(prof)
    dist.barrier()
    x, out = torch.randn(1 << 20, device="cuda"), torch.empty(world << 20, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        conccl.all_gather_into_tensor(out, x)
        torch.cuda.synchronize()
    report["eager_all_gather_kernels"] = sm_kernels(prof)
    cases.append(("eager all_gather launches no kernel", not report["eager_all_gather_kernels"]))
    # Same-GPU copies in a graph may run as the driver's memcpy kernels (seen on one H100 with
    # ranks sharing it): reported, not failed; anything else is wrong.
    # With a one-shot limit (CONCCL_ONE_SHOT_BELOW), small calls are one-shot kernels
    # (conccl.collectives.one_shot).
    one_shot = ("conccl_one_shot",) if conccl.get_group().options.one_shot_below else ()
    # The reductions' signals awaited by the spin-wait kernel (unless CONCCL_DISABLE=spin_waits)
    spin = bool(conccl.get_group().executor.spin_waits)
    spins = ("conccl_spin_wait",) if spin else ()
    cases.append(("captured graph launches no kernel but the reduction, the spin waits and the driver's copy kernels",
                  all(k.startswith(("reduce_", "memcpy", *one_shot, *spins)) for k in report["graph_kernels"])))
    if spin and not one_shot:
        cases.append(("captured reductions wait by the spin-wait kernel", "conccl_spin_wait" in report["graph_kernels"]))
