"""The shared-GPU rig: several conccl ranks on ONE GPU, every rank a process bound to cuda:0, over
a gloo group.

Where no multi-GPU machine is lent, this runs the protocol between ranks on real CUDA: peer
pads and workspaces mapped through CUDA IPC, stream memory-op signals between processes, the
reduction kernel reading a peer's workspace, captured graphs replayed with new inputs,
persistent ops. It says nothing about speed (the ranks share one GPU's engines) and nothing
about NVLink; the tests under tests/gpu/ need one GPU per rank.

PyTorch's symmetric memory refuses two ranks on one device, so the executor's allocator is
swapped in the ranks (the rig's processes only) for plain CUDA IPC: ``torch.empty`` plus the
caching allocator's IPC handles, exchanged over the gloo group. Everything above the allocator
is conccl's own code.

Expected values need no communication: every rank regenerates every rank's inputs from seeds
and applies the registry's stated arithmetic (``Collective.reference``), which tests/gpu/
compares against NCCL bit for bit. A case passes only if the output's bits equal the
reference's.

Run as tests (``test_shared_gpu.py``, one test per part and world) or through the CLI
``scripts/shared_gpu_smoke.py``. The parent process never initialises CUDA: only the spawned
ranks do.
"""
from __future__ import annotations

import os
import queue as queue_module
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rig import part_collectives, part_ep, part_fsdp, part_hier, part_tp
from rig.common import RankLeaves


@dataclass(frozen=True)
class Part:
    """One part of the rig: ``run(rank, world, cases, report)`` appends ``(name, ok)`` cases."""
    name: str
    run: Callable
    hosts: bool = False  # over 2 simulated hosts: needs an even world of 4 or more
    default: bool = True  # in a run that names no parts
    alone: bool = False  # leaves the group unusable (kills a rank): last, and in a run of its own


# In the order a run takes them.
PARTS = (
    Part("eager", part_collectives.eager),
    Part("persistent", part_collectives.persistent),
    Part("graph", part_collectives.graph),
    Part("tp", part_tp.tp),
    Part("tp_layers", part_tp.tp_layers),
    Part("bench_tp", part_tp.bench_tp),
    Part("ep", part_ep.ep),
    Part("hier", part_hier.hier, hosts=True),
    Part("fsdp_hosts", part_fsdp.fsdp_hosts, hosts=True),
    Part("fsdp", part_fsdp.fsdp, default=False),  # the CLI's --fsdp
    Part("hier_faults", part_hier.hier_faults, hosts=True, default=False, alone=True),
)
BY_NAME = {p.name: p for p in PARTS}


def fits(part: Part, world: int) -> bool:
    return not part.hosts or (world >= 4 and world % 2 == 0)


def default_parts(world: int) -> tuple[str, ...]:
    """What a run that names no parts runs: every default part this world can run."""
    return tuple(p.name for p in PARTS if p.default and fits(p, world))


def parse_parts(text: str) -> tuple[str, ...]:
    """Comma-separated part names, in the order a run takes them; an unknown name raises
    ValueError naming the parts there are."""
    names = {s.strip() for s in text.split(",") if s.strip()}
    unknown = sorted(names - set(BY_NAME))
    if unknown:
        raise ValueError(f"unknown rig part {', '.join(map(repr, unknown))}; expected some of {', '.join(BY_NAME)}")
    if not names:
        raise ValueError(f"no rig part named; expected some of {', '.join(BY_NAME)}")
    return tuple(p.name for p in PARTS if p.name in names)


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
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def use_ipc_peer_memory():
    from conccl import api, fsdp
    from conccl.executors.cuda import executor as cuda_ce
    from conccl.group import make

    # FSDP's pool then finds no get_mem_pool and takes plain blocks (conccl stages through its
    # workspace); make_group finds no get_backend and leaves the backend alone
    api.symm_mem = cuda_ce.symm_mem = fsdp.symm_mem = make.symm_mem = IpcPeerMemory()


def _worker(rank, world, port, queue, parts):
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    cases, report = [], {"rank": rank, "parts": []}  # parts: [name, first case, end] in the order run
    if os.environ.get("CONCCL_SMOKE_DUMP_AFTER"):  # a hang shows where every thread waits
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["CONCCL_SMOKE_DUMP_AFTER"]), exit=True)
    try:
        torch.cuda.set_device(0)
        report["gpu"] = torch.cuda.get_device_name(0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        use_ipc_peer_memory()
        for name in parts:
            report["parts"].append([name, len(cases), None])
            BY_NAME[name].run(rank, world, cases, report)
            report["parts"][-1][2] = len(cases)
    except RankLeaves:  # reported, then gone with no teardown, as a crashed rank is
        report["cases"] = cases
        queue.put(report)
        queue.close()
        queue.join_thread()
        os._exit(1)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        report["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        report["error_part"] = report["parts"][-1][0] if report["parts"] else None  # None: the set-up
    finally:
        try:
            import conccl

            conccl.destroy()
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    report["cases"] = cases
    queue.put(report)


def run(world: int, parts, timeout: float = 900.0) -> dict:
    """Run ``parts`` (names, taken in the order of PARTS) on ``world`` ranks sharing cuda:0.

    Returns ``{"world", "parts", "gpu", "torch", "wall_s", "reports"}``; ``reports`` has one
    dict per rank, by rank: ``cases`` (``(name, ok)`` pairs), ``parts`` (``[name, first case,
    end]``), what the parts recorded, and ``error`` (with ``error_part``) where the rank raised.
    A rank that sends no report within ``timeout`` seconds (or dies without one) gets one that
    says so; every rank's process is gone when this returns."""
    names = parse_parts(",".join(parts))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port_any()
    start = time.monotonic()
    procs = [ctx.Process(target=_worker, args=(r, world, port, queue, names)) for r in range(world)]
    for p in procs:
        p.start()
    reports: dict[int, dict] = {}
    while len(reports) < world and time.monotonic() - start < timeout:
        try:
            r = queue.get(timeout=2.0)
        except queue_module.Empty:
            if any(p.is_alive() for rank, p in enumerate(procs) if rank not in reports):
                continue
            try:  # every rank yet to report is gone: a report may still be in the pipe
                r = queue.get(timeout=5.0)
            except queue_module.Empty:
                break
        reports[r["rank"]] = r
    wall = time.monotonic() - start
    grace = time.monotonic() + (60 if len(reports) == world else 5)
    for p in procs:
        p.join(timeout=max(0.1, grace - time.monotonic()))
        if p.is_alive():  # a survivor of hier_faults stuck tearing down a broken group, or a hang
            p.kill()
            p.join(timeout=10)
    for rank, p in enumerate(procs):
        if rank not in reports:
            why = (f"no report within {timeout:.0f} s (hung, then killed)" if wall >= timeout
                   else f"no report: the process ended with exit code {p.exitcode} (killed or crashed)")
            reports[rank] = {"rank": rank, "parts": [], "cases": [], "error": why, "error_part": None}
    every = [reports[r] for r in range(world)]
    return {"world": world, "parts": list(names), "gpu": next((r["gpu"] for r in every if "gpu" in r), None),
            "torch": torch.__version__, "wall_s": round(wall, 1), "reports": every}


def failures(result: dict) -> tuple[int, list, list]:
    """(cases run, wrong cases as (rank, name), errors as (rank, text)) of a run's result."""
    reports = result["reports"]
    wrong = [(r["rank"], name) for r in reports for name, ok in r["cases"] if not ok]
    errors = [(r["rank"], r["error"]) for r in reports if "error" in r]
    return sum(len(r["cases"]) for r in reports), wrong, errors


def part_problems(result: dict, part: str) -> list[str]:
    """What went wrong with one part of a run, one line per rank and problem (empty: passed)."""
    problems = []
    for r in result["reports"]:
        rank, where = r["rank"], {name: (first, end) for name, first, end in r["parts"]}
        error = r.get("error", "")
        if part not in where:
            why = f" ({r.get('error_part') or 'the set-up'} raised first: {error.splitlines()[0]})" if error else ""
            problems.append(f"rank {rank}: not run{why}")
            continue
        first, end = where[part]
        cases = r["cases"][first:end]
        if error and r.get("error_part") == part:
            problems.append(f"rank {rank}: raised {error}")
        problems += [f"rank {rank}: WRONG {name}" for name, ok in cases if not ok]
        if not cases and not error:
            problems.append(f"rank {rank}: no case ran")
    return problems
