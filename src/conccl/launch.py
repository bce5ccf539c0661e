"""Start one process per visible GPU, or join a ``torchrun`` launch (:func:`run_per_gpu`).
The CPU ranks of the tests are started by :mod:`conccl.testing.ranks`.

Every process gets NVLink multicast switched off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1): it is not needed here and, on
shared hosts, a program using it can take the host's GPUs out of service.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import queue as _q
import socket
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import env


SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def apply_safe_env() -> None:
    for k, v in SAFE_ENV.items():
        os.environ[k] = v


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_rank(rank: int, world: int, init_method: str | None, backend: str = "nccl"):
    """Bind this process to its GPU and initialise the default process group."""
    apply_safe_env()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    kwargs = {"device_id": torch.device("cuda", local)}
    if init_method:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, **kwargs)
    else:
        dist.init_process_group(backend, **kwargs)
    return local


def report_result(queue, rank: int, result) -> None:
    """Send ``result`` to the parent by value. torch.multiprocessing's queue would pass a CPU
    tensor's storage as a file descriptor that the parent fetches from this process later, and
    a rank that has exited by then leaves the parent a FileNotFoundError (seen on 2 x H100 with
    tests/gpu/test_gpu_fsdp.py's parameters); plain pickle copies the bytes. Return CPU
    tensors: a CUDA tensor is rebuilt on the parent's GPU."""
    queue.put((rank, "ok", pickle.dumps(result)))


def _worker(rank, world, init_method, fn, args, queue):
    dump_after_s = env.get("CONCCL_DUMP_AFTER_S")
    if dump_after_s > 0:  # debugging hangs: print every thread's stack
        faulthandler.dump_traceback_later(dump_after_s, exit=True)
    try:
        init_rank(rank, world, init_method)
        result = fn(rank, world, *args)
        report_result(queue, rank, result)
    except BaseException as e:  # noqa: BLE001 - report to the parent
        queue.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        try:
            from . import api  # here: the CUDA executor behind it loads only in GPU workers

            api.destroy()
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def run_per_gpu(fn, *args, nprocs: int | None = None, timeout_s: float = 1800.0, allow_missing=(),
                exitcodes: list | None = None) -> list:
    """Run ``fn(rank, world, *args)`` in one process per GPU (or in place under torchrun).

    Returns the per-rank results (under torchrun: a one-element list with this rank's).
    Raises RuntimeError with each failing rank's traceback. Ranks in ``allow_missing`` may
    die without a result (None); ``exitcodes``, if given, receives every process's exit code.
    """
    apply_safe_env()
    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        init_rank(rank, world, None)
        return [fn(rank, world, *args)]
    world = nprocs or torch.cuda.device_count()
    if world < 1:
        raise RuntimeError("no CUDA GPU is visible")
    init = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, init, fn, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    return collect_results(queue, procs, world, timeout_s, join_s=30, allow_missing=allow_missing,
                           exitcodes=exitcodes)


def collect_results(queue, procs, world: int, timeout_s: float, join_s: float, allow_missing=(),
                    exitcodes: list | None = None) -> list:
    """Gather (rank, status, value) reports from ``procs``; bounded by ``timeout_s``.

    Raises RuntimeError naming every rank that failed, or that returned nothing (killed, hung
    or crashed) unless it is in ``allow_missing`` (its result is then None); processes still
    alive at the end are killed.
    """
    results, errors = {}, []
    deadline = time.monotonic() + timeout_s
    try:
        needed = set(range(world)) - set(allow_missing)
        reported: set[int] = set()
        while not needed <= reported and time.monotonic() < deadline:
            try:
                rank, status, value = queue.get(timeout=0.5)
            except _q.Empty:
                if not any(p.is_alive() for p in procs):
                    break
                continue
            reported.add(rank)
            if status == "ok":
                try:
                    results[rank] = pickle.loads(value)
                except Exception as e:  # noqa: BLE001 - reported with the other ranks' errors
                    errors.append(f"rank {rank}: its result could not be read back: {type(e).__name__}: {e}")
            else:
                errors.append(f"rank {rank}: {value}")
    finally:
        for p in procs:
            p.join(timeout=join_s)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        if exitcodes is not None:
            exitcodes[:] = [p.exitcode for p in procs]
    failed = {int(e.split(":")[0].split()[1]) for e in errors}
    missing = sorted(set(range(world)) - set(results) - failed - set(allow_missing))
    if missing:
        errors.append(f"ranks {missing} returned nothing (killed, hung or crashed)")
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results.get(r) for r in range(world)]
