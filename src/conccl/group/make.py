"""Making the :class:`Group` for a ``torch.distributed`` process group: where the executor is
chosen. The copy-engine executor is the one a process group gets (the CPU reference executor's
groups are made by the test harness, :mod:`conccl.launch`)."""
from __future__ import annotations

import socket
import uuid

import torch
import torch.distributed as dist
from torch.distributed import _symmetric_memory as symm_mem

from ..board import HostBoard
from ..errors import InvalidArgument, UnsupportedGroup
from ..executors.cuda_ce import CudaCopyEngineExecutor
from .group import Group, Options, board_row_len


def make_group(group, options: Options | None = None) -> Group:
    """A new :class:`Group` for the process group ``group`` over the copy-engine executor. A
    collective call (every rank of ``group``): the ranks exchange their hosts and GPUs, create
    the host board and map each other's signal pads."""
    name = group.group_name
    if not torch.cuda.is_available():
        raise InvalidArgument("conccl collectives need CUDA GPUs; none is visible to this process")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = torch.device("cuda", torch.cuda.current_device())
    me = {"host": socket.gethostname(), "device": device.index, "board": f"conccl_{uuid.uuid4().hex[:12]}",
          "uuid": str(torch.cuda.get_device_properties(device).uuid)}
    peers: list = [None] * world
    dist.all_gather_object(peers, me, group=group)
    _check_peer_access(peers, rank)
    if rank == 0:
        board = HostBoard(peers[0]["board"], rank, world, board_row_len(world), create=True)
    dist.barrier(group=group)  # the board exists before anyone attaches
    if rank != 0:
        board = HostBoard(peers[0]["board"], rank, world, board_row_len(world), create=False)
    if hasattr(symm_mem, "get_backend") and symm_mem.get_backend(device) is None:
        symm_mem.set_backend("CUDA")
    try:
        ex = CudaCopyEngineExecutor(name, rank, world, device)
    except Exception as e:
        board.close()
        raise UnsupportedGroup(
            f"could not map peer memory for group {name!r} ({e}); use torch.distributed with NCCL for this group") from e
    return Group(ex, board, rank, world, options, name=name, fallback=(dist, group))


def _check_peer_access(peers: list[dict], rank: int) -> None:
    hosts = sorted({p["host"] for p in peers})
    if len(hosts) > 1:
        raise UnsupportedGroup(
            f"the group spans {len(hosts)} hosts ({', '.join(hosts)}); conccl's copy-engine collectives need every "
            "GPU of the group to reach every other by peer access (one NVLink node). Use torch.distributed with the "
            "NCCL backend for this group.")
    visible = {str(torch.cuda.get_device_properties(i).uuid): i for i in range(torch.cuda.device_count())}
    mine = visible.get(peers[rank]["uuid"])
    for p, info in enumerate(peers):
        other = visible.get(info["uuid"])
        if p == rank or mine is None or other is None or mine == other:
            continue  # not visible here: the symmetric-memory rendezvous checks it
        if not torch.cuda.can_device_access_peer(mine, other):
            raise UnsupportedGroup(
                f"GPU {mine} (rank {rank}) cannot access GPU {other} (rank {p}) by peer access; conccl's copy-engine "
                "collectives need a fully connected NVLink/PCIe peer mesh. Use torch.distributed with NCCL for this group.")
