"""conccl.fsdp.enable where conccl cannot serve: FSDP2 on CPU processes (gloo) keeps its own
collectives, with one warning, and trains as before (a module fully_shard never wrapped,
refused with a clear error: tests/unit/test_fsdp_enable_refusals.py). The ranks see no GPU even on a GPU machine (CUDA_VISIBLE_DEVICES
empty from their start): the situation tested is "no CUDA", whatever the machine has."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from conccl import fsdp  # noqa: E402
from conccl.launch import collect_results, free_port, report_result  # noqa: E402


def _fallback(rank, world, port, queue):
    try:
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            comms = fsdp.enable(model)
        model(torch.ones(2, 8)).sum().backward()  # stock collectives still run
        grads = [p.grad is not None for p in model.parameters()]
        report_result(queue, rank, ([str(w.message) for w in caught], comms.modules, comms.fallback, grads,
                                    torch.cuda.is_available()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, "error", f"{type(e).__name__}: {e}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_group_conccl_cannot_serve_stays_on_the_stock_collectives_with_one_warning(monkeypatch):
    world, port = 2, free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_fallback, args=(r, world, port, queue)) for r in range(world)]
    with monkeypatch.context() as env:
        env.setenv("CUDA_VISIBLE_DEVICES", "")  # the spawned ranks' environment: no GPU
        for p in procs:
            p.start()
    for msgs, served, fallback, grads, cuda in collect_results(queue, procs, world, timeout_s=120, join_s=10):
        assert not cuda
        assert len(msgs) == 1 and "keeps its gloo collectives" in msgs[0] and "CUDA" in msgs[0], msgs
        assert served == [] and len(fallback) == 2 and all(grads), (served, fallback)
