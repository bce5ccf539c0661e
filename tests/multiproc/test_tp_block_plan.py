"""CPU multi-process tier for ``conccl bench tp --block``'s ``torch_tp_plan``: PyTorch's own
tensor-parallel plan of the MLP block (DTensor, gloo) runs the block's math, returning what the
other implementations return in their order, against the unsharded block."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from conccl.bench import tp_block  # noqa: E402


def _worker(rank, world, port, queue):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        d, ffn, tokens = 8, 12, 6
        g = torch.Generator().manual_seed(0)  # every rank the same weights and batches
        full_w = [torch.randn(n_out, n_in, generator=g) / n_in ** 0.5 for n_out, n_in in ((ffn, d), (ffn, d), (d, ffn))]
        xs = [torch.randn(tokens // world, d, generator=g) for _ in range(world)]
        dys = [torch.randn(tokens // world, d, generator=g) for _ in range(world)]
        step, params = tp_block.dtensor_plan(torch, dist, rank, world, full_w, xs, dys)
        got = [t.detach().clone() for t in step()]
        ref = tp_block._unsharded(torch, full_w, xs, dys, rank, tokens // world, ffn // world)
        shapes = [tuple(t.shape) for t in got] == [tuple(t.shape) for t in ref]
        queue.put((rank, shapes, tp_block._relative(torch, got, ref)))
    finally:
        dist.destroy_process_group()


def test_pytorchs_plan_of_the_block_is_the_unsharded_blocks_math():
    from conccl.launch import free_port

    ctx = mp.get_context("fork")  # inherits torch's imports (spawn: ~3 s a rank); the CPU tiers run before CUDA
    queue, port, world = ctx.Queue(), free_port(), 2
    procs = [ctx.Process(target=_worker, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    for rank, shapes, rel in results:
        assert shapes, rank  # output, input gradient, the weights' local gradient shards
        assert rel < 1e-5, (rank, rel)  # fp32 sums in another order than one GEMM's


def _conccl_plan(comm, schedule):
    d, ffn, tokens, world = 8, 12, 6, comm.world
    g = torch.Generator().manual_seed(0)
    full_w = [torch.randn(n_out, n_in, generator=g) / n_in ** 0.5 for n_out, n_in in ((ffn, d), (ffn, d), (d, ffn))]
    xs = [torch.randn(tokens // world, d, generator=g) for _ in range(world)]
    dys = [torch.randn(tokens // world, d, generator=g) for _ in range(world)]
    step, params = tp_block.conccl_plan(torch, comm.rank, xs, dys, full_w, schedule, comm)
    got = [t.detach().clone() for t in step()]
    ref = tp_block._unsharded(torch, full_w, xs, dys, comm.rank, tokens // world, ffn // world)
    return [tuple(t.shape) for t in got] == [tuple(t.shape) for t in ref], tp_block._relative(torch, got, ref)


@pytest.mark.parametrize("schedule", ["serial", "direct"])
def test_conccl_plan_of_the_block_is_the_unsharded_blocks_math(schedule):
    """The same model of plain layers under ``conccl.tp.parallelize_module`` (the reference
    executor): what ``conccl_plan`` times is the block, in the other implementations' order."""
    from conccl.testing import spawn

    for shapes, rel in spawn(2, _conccl_plan, schedule):
        assert shapes and rel < 1e-5, rel
