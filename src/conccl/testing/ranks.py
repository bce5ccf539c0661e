"""The CPU multi-process harness: a reference group's ranks (:func:`spawn`) or those of
simulated hosts (:func:`spawn_hosts`: a reference group per host, gloo between them), for the
tests and the shared-GPU rig.

The CPU ranks are forked (cheap, and they see the parent's state as tests set it up); each
hides the GPUs from itself first, so that nothing in it takes a CUDA path because a GPU is
visible. A process that has initialised CUDA cannot fork them safely: :func:`spawn` and
:func:`spawn_hosts` then raise at once instead of leaving ranks that fail or hang.

Every segment of shared memory the ranks make is named after the launch's prefix; the
launcher unlinks what is left of them when the ranks are done, killed ranks' included.
"""
from __future__ import annotations

import os
import traceback
import uuid
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..device import shm
from ..executors.reference import ReferenceExecutor
from ..group import Group, Options, board_row_len
from ..group.board import HostBoard
from ..group.hierarchical import CrossNode, HierarchicalGroup
from ..group.topology import host_layout, simulated_host_keys
from ..launch import collect_results, free_port, report_result


FORK_AFTER_CUDA = ("{what}: {who}; a CPU reference rank forked from such a process inherits a CUDA runtime it "
                   "cannot use (it fails or hangs). Start CPU reference groups before anything in the process uses "
                   "CUDA (the test suite runs its CPU tiers before tests/gpu: tests/conftest.py), or from a "
                   "fresh process.")


def _refuse_fork_after_cuda(what: str) -> None:
    """In the parent, before forking: refuse where CUDA is initialised here."""
    if torch.cuda.is_initialized():
        raise RuntimeError(FORK_AFTER_CUDA.format(what=what, who="this process has initialised CUDA"))


def _cpu_only_child(what: str) -> None:
    """First in a forked CPU rank: hide the GPUs from it, before anything asks torch about
    CUDA (FSDP2, for one, picks the accelerator torch reports: a visible GPU would send a CPU
    rank down CUDA paths). Both of torch's device counts honour it: NVML's (the env switch
    keeps ``torch.cuda.is_available`` on that path) and the CUDA runtime's, first computed in
    this child. A parent that had asked the CUDA runtime (``cudaGetDeviceCount`` or CUDA
    initialisation) left this child its cached count and a runtime it cannot use: refused."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    if torch.cuda._is_in_bad_fork():
        raise RuntimeError(FORK_AFTER_CUDA.format(
            what=what, who="this rank was forked from a process that had asked the CUDA runtime (CUDA initialised, "
                           "or GPUs counted by cudaGetDeviceCount, as torch.cuda.is_available() does by default)"))


def reference_group(prefix: str, rank: int, world: int, timeout: timedelta = timedelta(seconds=60)) -> Group:
    """Join the reference group ``prefix`` (its board ``{prefix}_board`` must exist: see :func:`spawn`)."""
    board = HostBoard(f"{prefix}_board", rank, world, board_row_len(world), create=False)
    return _reference_group_on(board, prefix, rank, world, timeout)


def _reference_group_on(board: HostBoard, prefix: str, rank: int, world: int, timeout: timedelta) -> Group:
    ex = ReferenceExecutor(prefix, rank, world, board, timeout.total_seconds())
    return Group(ex, board, rank, world, Options(timeout=timeout), name=prefix)


def new_reference_group(parent: Group, tag: str, timeout: timedelta | None = None) -> Group:
    """A new reference group of ``parent``'s ranks, named ``{parent.name}_{tag}`` (a collective
    call on ``parent``: rank 0 creates the new board, ``parent``'s board orders the attaching)."""
    timeout = timeout or parent.options.timeout
    prefix = f"{parent.name}_{tag}"
    rank, world = parent.rank, parent.world
    board = HostBoard(f"{prefix}_board", rank, world, board_row_len(world), create=True) if rank == 0 else None
    parent.board.exchange([], "conccl reference group", timeout.total_seconds())
    if board is None:
        board = HostBoard(f"{prefix}_board", rank, world, board_row_len(world), create=False)
    return _reference_group_on(board, prefix, rank, world, timeout)


def _reference_child(fn, prefix, rank, world, timeout, args, queue):
    comm = None
    try:
        _cpu_only_child("conccl.testing.spawn")
        comm = reference_group(prefix, rank, world, timeout)
        report_result(queue, rank, fn(comm, *args))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        queue.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if comm is not None:
            comm.close()


def spawn(world: int, fn, *args, timeout: timedelta = timedelta(seconds=60), join_timeout_s: float = 120.0,
          allow_missing=()):
    """Run ``fn(comm, *args)`` on ``world`` processes of a reference group; return per-rank results.

    Raises RuntimeError with every failing rank's traceback. Bounded: processes still alive
    after ``join_timeout_s`` are killed and reported. Ranks in ``allow_missing`` may die
    without reporting (fault tests kill them); their result is None. The ranks are forked and
    see no GPU; a process that has used CUDA cannot fork them (RuntimeError at once: see the
    module's docstring).
    """
    _refuse_fork_after_cuda("conccl.testing.spawn")
    prefix = f"conccl_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    board = HostBoard(f"{prefix}_board", 0, world, board_row_len(world), create=True)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_reference_child, args=(fn, prefix, r, world, timeout, args, queue), daemon=True)
             for r in range(world)]
    try:
        for p in procs:
            p.start()
        return collect_results(queue, procs, world, join_timeout_s, join_s=5, allow_missing=allow_missing)
    except RuntimeError as e:
        raise RuntimeError(f"reference group failed:\n{e}") from None
    finally:
        board.close()
        shm.unlink_prefix(prefix)


# ------------------------------------------------------------------ simulated hosts on the CPU
def _hosts_child(fn, prefix, spec, rank, port, timeout, args, queue):
    comm = None
    try:
        _cpu_only_child("conccl.testing.spawn_hosts")
        keys = simulated_host_keys(spec)
        layout = host_layout(keys)
        world, host, local = layout.world, layout.host_of(rank), layout.local_of(rank)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timeout)
        # every rank makes every cross-node group, in one order (torch's rule for new_group)
        cross = [dist.new_group(list(layout.cross_ranks(l)), timeout=timeout) for l in range(layout.per_host)]
        node = reference_group(f"{prefix}_h{host}", local, layout.per_host, timeout)
        comm = HierarchicalGroup(node, CrossNode(dist, cross[local], cross[local], host_staged=False), layout, rank,
                                 fallback=(dist, dist.group.WORLD), name=prefix)
        # every rank has mapped its host's signal pads before any may close (unlink) its own:
        # an fn making no collective call would otherwise let a fast rank unlink its pad
        # before a slow one attached it (FileNotFoundError, seen in test_bad_calls)
        dist.barrier()
        report_result(queue, rank, fn(comm, *args))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        queue.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if comm is not None:
            comm.close()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a peer may be gone (fault tests)
                pass


def spawn_hosts(spec: str, fn, *args, timeout: timedelta = timedelta(seconds=60), join_timeout_s: float = 120.0,
                allow_missing=()):
    """Run ``fn(comm, *args)`` on the ranks of simulated hosts ``spec`` (as
    :data:`~conccl.group.topology.SIMULATED_HOSTS_ENV` takes it: ``"2x4"``, or ``"0,0,1,1"``),
    each ``comm`` a :class:`~conccl.group.hierarchical.HierarchicalGroup` of a reference group
    per host (shared memory) and gloo between hosts (TCP on 127.0.0.1, group timeout
    ``timeout``); return per-rank results. Failures and bounds: as :func:`spawn`."""
    keys = simulated_host_keys(spec)
    layout = host_layout(keys)  # a layout the group would refuse raises here, in the parent
    _refuse_fork_after_cuda("conccl.testing.spawn_hosts")
    prefix = f"conccl_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    boards = [HostBoard(f"{prefix}_h{n}_board", 0, layout.per_host, board_row_len(layout.per_host), create=True)
              for n in range(layout.num_hosts)]
    port = free_port()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_hosts_child, args=(fn, prefix, spec, r, port, timeout, args, queue), daemon=True)
             for r in range(layout.world)]
    try:
        for p in procs:
            p.start()
        return collect_results(queue, procs, layout.world, join_timeout_s, join_s=5, allow_missing=allow_missing)
    except RuntimeError as e:
        raise RuntimeError(f"simulated hosts {spec} failed:\n{e}") from None
    finally:
        for b in boards:
            b.close()
        shm.unlink_prefix(prefix)
