"""Making the :class:`Group` for a ``torch.distributed`` process group: where the executor is
chosen. The copy-engine executor is the one a process group gets (the CPU reference executor's
groups are made by the test harness, :mod:`conccl.testing`). A process group whose ranks run on
several hosts (real host names, or simulated ones: :func:`~conccl.group.topology.simulated_hosts`,
read here, once per group) gets a :class:`~conccl.group.hierarchical.HierarchicalGroup`."""
from __future__ import annotations

import socket
import uuid

import torch
import torch.distributed as dist
from torch.distributed import _symmetric_memory as symm_mem

from .. import env
from .board import HostBoard
from ..errors import InvalidArgument, UnsupportedGroup
from ..executors.cuda.executor import CudaCopyEngineExecutor
from .group import Group
from .hierarchical import CrossNode, HierarchicalGroup
from .options import Options
from .protocol import CollectiveGroup
from .row import board_row_len
from .topology import SIMULATED_HOSTS_ENV, host_layout, simulated_host_keys, simulated_hosts


def make_group(group, options: Options | None = None) -> CollectiveGroup:
    """A new :class:`Group` for the process group ``group`` over the copy-engine executor, or a
    :class:`HierarchicalGroup` where its ranks run on several hosts. A collective call (every
    rank of ``group``): the ranks exchange their hosts and GPUs, create the host board and map
    each other's signal pads."""
    if not torch.cuda.is_available():
        raise InvalidArgument("conccl collectives need CUDA GPUs; none is visible to this process")
    world = dist.get_world_size(group)
    me = {"host": socket.gethostname(), "simulated": simulated_hosts()}
    peers: list = [None] * world
    dist.all_gather_object(peers, me, group=group)
    specs = sorted({p["simulated"] for p in peers})
    if len(specs) > 1:
        raise InvalidArgument(f"{SIMULATED_HOSTS_ENV} differs between the group's ranks ({specs}); set it alike on "
                              "every rank, or on none")
    if specs[0]:  # the spec names the default group's ranks: a subgroup takes its members' hosts
        every = simulated_host_keys(specs[0], dist.get_world_size())
        keys = [every[r] for r in dist.get_process_group_ranks(group)]
    else:
        keys = [p["host"] for p in peers]
    if len(set(keys)) > 1:
        return make_hierarchical(group, keys, options)
    return make_node_group(group, options)


def make_hierarchical(group, keys: list[str], options: Options | None = None) -> HierarchicalGroup:
    """The :class:`HierarchicalGroup` of ``group``, whose rank r runs on host ``keys[r]``: a
    node-local :class:`Group` per host and the cross-node process groups of equal local rank on
    the group's backend (plus a gloo group for the call descriptors where that backend is not
    gloo). :class:`UnsupportedGroup` for a layout it cannot serve (unequal ranks per host, a
    host's ranks not consecutive).

    The process groups are made by every rank of the default group, in one order, where
    ``group`` is the whole world; otherwise by their members only
    (``use_local_synchronization``: PyTorch then needs every member to have made as many
    process groups before)."""
    try:
        layout = host_layout(keys)
    except InvalidArgument as e:
        raise UnsupportedGroup(f"{e}. Use torch.distributed with the group's backend for this group.") from None
    options = options or Options()
    rank = dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group)  # global ranks, by group rank
    backend = dist.get_backend(group)
    host, local = layout.host_of(rank), layout.local_of(rank)
    wanted = ([("node", [ranks[r] for r in layout.node_ranks(n)], backend) for n in range(layout.num_hosts)]
              + [("data", [ranks[r] for r in layout.cross_ranks(l)], backend) for l in range(layout.per_host)])
    if backend != "gloo":
        wanted += [("control", [ranks[r] for r in layout.cross_ranks(l)], "gloo") for l in range(layout.per_host)]
    whole = len(ranks) == dist.get_world_size()
    made: dict[str, object] = {}
    for role, members, be in wanted:
        if not whole and ranks[rank] not in members:
            continue  # local synchronization: only the members make it
        pg = dist.new_group(members, timeout=options.timeout, backend=be, use_local_synchronization=not whole)
        if ranks[rank] in members:
            made[role] = pg
    node = make_node_group(made["node"], options)
    cross = CrossNode(dist, made["data"], made.get("control", made["data"]), host_staged=backend == "gloo")
    return HierarchicalGroup(node, cross, layout, rank, fallback=(dist, group), name=group.group_name)


def make_node_group(group, options: Options | None = None) -> Group:
    """A new :class:`Group` over the copy-engine executor for ``group``, whose ranks all run on
    this host (see :func:`make_group`)."""
    name = group.group_name
    env.get("CONCCL_DISABLE")  # a bad value is the caller's to fix, raised as it is (not a peer-memory failure)
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
