"""CPU tier: a rank's result reaches the parent after the rank has exited.

torch.multiprocessing's queue passes a CPU tensor's storage as a file descriptor that the
parent fetches from the sender when it reads; a rank that has already exited (the usual case:
it returns, tears down and ends) leaves the parent an error. tests/gpu/test_gpu_fsdp.py failed
so on 2 x H100. ``report_result`` sends the bytes instead."""
from __future__ import annotations

import torch
import torch.multiprocessing as mp

from conccl.launch import collect_results, report_result


def _rank(queue, rank, raw):
    t = torch.arange(1000 + rank, dtype=torch.float32)
    if raw:
        queue.put((rank, "ok", t))
    else:
        report_result(queue, rank, {"rank": rank, "t": t})


def _exited_ranks(raw: bool, world: int = 2):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(queue, r, raw)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)  # every sender is gone before the parent reads
    return queue, procs


def test_results_of_exited_ranks_arrive_whole():
    queue, procs = _exited_ranks(raw=False)
    results = collect_results(queue, procs, 2, timeout_s=30, join_s=5)
    for rank, r in enumerate(results):
        assert r["rank"] == rank and torch.equal(r["t"], torch.arange(1000 + rank, dtype=torch.float32))


def test_the_control_a_tensor_put_as_is_is_lost_once_its_rank_exited():
    # what report_result avoids: if this starts passing, torch changed how it shares tensors
    queue, _ = _exited_ranks(raw=True, world=1)
    try:
        got = queue.get(timeout=30)
    except (OSError, EOFError) as e:  # ConnectionRefused / FileNotFound: the sender is gone
        assert isinstance(e, (ConnectionError, FileNotFoundError, EOFError)), e
    else:
        raise AssertionError(f"a shared tensor outlived its sender: {got[2][:3]}")
