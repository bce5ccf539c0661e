"""CPU multi-process tier: FSDP2 with the all-gather filling each parameter's unsharded tensor
itself and FSDP's copy-out skipped (``conccl.fsdp_direct``), against stock FSDP2, on gloo.

The wrap of FSDP2's internals is what runs here; the filling is done with torch.distributed
(the copy-engine filling, ``Group.all_gather_into_parts``, needs GPUs: its copies are checked
in tests/unit/test_into_parts.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from conccl import fsdp_direct  # noqa: E402

pytestmark = pytest.mark.skipif(fsdp_direct.supported() is not None, reason=str(fsdp_direct.supported()))


def _gloo_gather(output, input, group, parts):
    """The reference filling: the flat all-gather, then every part's rows."""
    dist.all_gather_into_tensor(output, input, group=group)
    if parts is None:
        return
    world, off = group.size(), 0
    flat = output.view(world, -1)
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(tuple(parts)):
        for t in parts:
            n = t.numel() // world
            t.view(world, n).copy_(flat[:, off:off + n])
            off += n


def _train(rank, world, direct: bool, param_dtype):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    dims = [(13, 37), (37, 21), (21, 7)]  # sizes no world divides: FSDP pads the shards
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.Tanh()) for a, b in dims])
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in model:
        fully_shard(block, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    if direct:
        for m in model.modules():
            if hasattr(m, "set_custom_all_gather") and m._get_fsdp_state()._fsdp_param_group is not None:
                m.set_custom_all_gather(fsdp_direct.DirectAllGather(gather=_gloo_gather))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    losses = []
    for _ in range(3):
        x = torch.randn(8, 13, generator=g)
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.to_local().detach().clone() for p in model.parameters()]


def _worker(rank, world, port, param_dtype, queue):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        assert fsdp_direct.install() is None
        before = fsdp_direct.skipped_copy_outs
        stock = _train(rank, world, False, param_dtype)
        skipped_stock = fsdp_direct.skipped_copy_outs - before
        direct = _train(rank, world, True, param_dtype)
        skipped = fsdp_direct.skipped_copy_outs - before - skipped_stock
        same = [torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(stock[1], direct[1])]
        queue.put((rank, stock[0], direct[0], same, skipped_stock, skipped, fsdp_direct.declined_gathers))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("param_dtype", [None, torch.bfloat16])
def test_direct_gather_trains_bit_for_bit_like_stock_and_skips_every_copy_out(world, param_dtype):
    from conccl.launch import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, param_dtype, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    for rank, stock_losses, direct_losses, same, skipped_stock, skipped, declined in results:
        assert direct_losses == stock_losses, (rank, stock_losses, direct_losses)
        assert all(same), (rank, same)
        assert skipped_stock == 0  # stock FSDP's gathers are left alone
        # forward and backward unshard each of the 3 blocks once a step (the root has no parameters)
        assert skipped == 3 * 3 * 2 and declined == 0, (rank, skipped, declined)
