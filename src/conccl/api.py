"""Public collectives, shaped like ``torch.distributed``, and the groups behind them.

Each function resolves its process group to the :class:`~conccl.group.Group` conccl keeps for
it (made on first use: a collective call) and hands the call to the group with the
collective's registry entry. :func:`destroy` closes groups; nothing here outlives them.
"""
from __future__ import annotations

import atexit
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import _symmetric_memory as symm_mem

from .collectives import REGISTRY
from .collectives.all_gather import ALL_GATHER
from .collectives.all_reduce import ALL_REDUCE
from .collectives.all_to_all import ALL_TO_ALL
from .collectives.reduce_scatter import REDUCE_SCATTER
from .errors import InvalidArgument
from .group import Options
from .group.make import make_group
from .group.protocol import CollectiveGroup
from .schedule.base import Algorithm, StreamMode

# The open groups by process-group name; an entry lives until destroy() closes its group.
_GROUPS: dict[str, CollectiveGroup] = {}


def _resolve_group(group):
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgument(
            "the default process group is not initialised: call torch.distributed.init_process_group() first "
            "(or launch with torchrun / `conccl bench`)")
    group = group if group is not None else dist.group.WORLD
    if group == dist.GroupMember.NON_GROUP_MEMBER:
        raise InvalidArgument("this rank is not a member of the given process group")
    return group


def get_group(group=None, options: Options | None = None) -> CollectiveGroup:
    """The group conccl keeps for ``group`` (default: the world), made on first use: a
    :class:`~conccl.group.Group`, or a :class:`~conccl.group.hierarchical.HierarchicalGroup` where
    the ranks span hosts (both :class:`~conccl.group.protocol.CollectiveGroup`). A collective
    call the first time (every rank of ``group``): the ranks exchange their hosts and GPUs,
    create the host board and map each other's signal pads."""
    group = _resolve_group(group)
    g = _GROUPS.get(group.group_name)
    if g is None:
        g = _GROUPS[group.group_name] = make_group(group, options)
    return g


def get_communicator(group=None):
    """:func:`get_group` under the name of earlier releases (a DeprecationWarning says so)."""
    warnings.warn("conccl.get_communicator is conccl.get_group's old name; call conccl.get_group", DeprecationWarning,
                  stacklevel=2)
    return get_group(group)


def empty(*size, dtype=None, device=None, group=None):
    """Allocate an uninitialised CUDA tensor that every peer of ``group`` can read and write.

    A collective call (every rank of the group calls it with the same size and dtype). Passing
    such tensors to the collectives skips the staging copy of the input (pull) and enables
    the push algorithm (output). Backed by PyTorch symmetric memory (CUDA backend).
    """
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    g = get_group(group)
    device = device if device is not None else g.executor.device
    t = symm_mem.empty(*size, dtype=dtype or torch.get_default_dtype(), device=device)
    g.executor.symmetric.add(t, symm_mem.rendezvous(t, g.name))
    return t


def release(tensor, group=None) -> None:
    """Give back a tensor from :func:`empty`: conccl forgets it, and its memory returns to the
    GPU once the caller drops its last reference (each rank its own allocation; a peer's mapping
    of it goes when that peer releases too, so every rank should release at the same point).

    Local (no peer takes part) and on the host; the caller must know no copy still runs on it
    (synchronise first) and close the persistent ops made on it. Raises InvalidArgument for a
    tensor that :func:`empty` did not allocate on ``group``.
    """
    g = get_group(group)
    forget = getattr(getattr(g.executor, "symmetric", None), "remove", None)
    if forget is None or not forget(tensor):
        raise InvalidArgument("conccl.release takes a tensor from conccl.empty on this group")


def all_gather_into_tensor(output, input, group=None, async_op=False, *, timeout=None):
    """Gather ``input`` from every rank into ``output`` on copy engines.

    (Under :func:`conccl.set_eager_path` "auto", a call below the group's ``nccl_below`` size
    runs on the process group's backend, NCCL, instead: SM kernels; the returned ``Work.path``
    says which ran. So for every public collective.)

    Args:
        output: CUDA tensor, contiguous, ``world_size * input.numel()`` elements of ``input``'s
            dtype; rank r's input lands in its r-th chunk. May hold ``input`` as its own chunk
            (in place).
        input: CUDA tensor, contiguous, any shape and dtype, the same size on every rank.
        group: process group (default: the world). All GPUs of it must be peer-accessible, or it
            spans hosts of equally many GPUs (copy engines within each, the group's backend
            between them: docs/design.md, "Beyond one node").
        async_op: return a :class:`conccl.Work` instead of ordering the caller's stream.
        timeout: ``timedelta`` or seconds; default the group's (``set_options``, 10 minutes).

    Stream semantics: starts after the work already queued on the caller's current stream;
    with ``async_op=False`` later work on that stream sees the output; with ``async_op=True``
    ``work.wait()`` makes the current stream wait (the host never blocks). The call returns
    once every rank of the group has made it (a host handshake, microseconds), or, where it
    repeats a settled call (the same arguments as its last two calls, on every rank), once it
    posted its arguments on the host board (``set_options(post_settled=)``).

    Failures: a peer that does not arrive within ``timeout`` (or whose process exited) raises
    :class:`conccl.CollectiveTimeout` naming it, on the host if it never called, otherwise
    from ``work.wait()`` / ``work.synchronize()`` once the group's watchdog gives up on the
    GPU side; the group is then broken and every later call raises :class:`conccl.GroupBroken`.
    A peer calling with another size, dtype or collective raises :class:`conccl.CollectiveError`
    on every rank before anything moves; where this rank had repeated a settled call without
    waiting, at its next call instead, and the group breaks.

    SMs used: the peers' chunks move on copy engines; the own chunk's same-GPU copy and a
    plain input's staging copy the driver runs as copy kernels, so beside a GEMM holding every
    SM the call ends when that GEMM does. None where every rank's output is from
    :func:`conccl.empty` and the call pushes (the default there) and is in place, or is not
    in place with ``set_options(own_chunk_via_peer=True)`` (the own chunk read back from a
    peer on a copy engine). With ``CONCCL_ONE_SHOT_BELOW`` set, a call whose
    output is smaller runs as one kernel of one CTA instead (conccl.collectives.one_shot;
    docs/api.md), where every rank's would.
    Workspace: ``input`` bytes of symmetric memory per rank unless every rank's input was
    allocated with :func:`conccl.empty` (or is in place in such an output); none with push.
    """
    return get_group(group).call(ALL_GATHER, output, input, (), async_op, timeout=timeout,
                                 route=True)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False,
                      *, timeout=None):
    """Scatter chunks of ``input`` to every rank and gather theirs into ``output``, on copy engines.

    Args:
        output: CUDA tensor, contiguous; along dim 0 it holds ``output_split_sizes[r]`` rows
            from rank r, in rank order (equal splits when None).
        input: CUDA tensor, contiguous, same dtype and row shape; ``input_split_sizes[r]`` rows
            go to rank r. Splits may be uneven or zero; they must match the peers' (rank a
            sends rank b what b expects from a), or every rank raises before anything moves.
        group, async_op, timeout: as in :func:`all_gather_into_tensor`.

    Stream semantics, failures, SMs used (none; one CTA for a one-shot call): as
    :func:`all_gather_into_tensor`.
    Workspace: the largest input of any rank, in symmetric memory, unless every input was
    allocated with :func:`conccl.empty`; none with push.
    """
    return get_group(group).call(ALL_TO_ALL, output, input, (output_split_sizes, input_split_sizes), async_op,
                                 timeout=timeout, route=True)


def reduce_scatter_tensor(output, input, op=None, group=None, async_op=False, *, timeout=None):
    """Reduce ``input`` over the ranks and leave chunk r of the result on rank r, copy engines
    moving every byte and one small kernel reducing.

    Args:
        output: CUDA tensor, contiguous, bf16, fp16 or fp32, any number of elements ``n``
            (the same on every rank); may be ``input``'s own chunk (in place).
        input: CUDA tensor, contiguous, same dtype, ``world_size * n`` elements; chunk d
            (elements ``d*n .. (d+1)*n``) is this rank's contribution to rank d's output.
        op: ``torch.distributed.ReduceOp.SUM`` (default), ``AVG`` or ``PREMUL_SUM(factor)``
            (a Python float; what FSDP2 passes). Every rank must pass the same.
        group, async_op, timeout: as in :func:`all_gather_into_tensor`.

    Order of summation: rank 0, 1, ..., in fp32, rounded to the dtype once (AVG and
    PREMUL_SUM multiply each operand first). Two ranks: SUM is NCCL's result bit for bit, and
    AVG in bf16 and fp32; where a product is inexact NCCL fuses the own operand's multiply
    into the add (docs/api.md), within one rounding of this.
    Stream semantics and failures: as :func:`all_gather_into_tensor`.

    SMs used: the reduction kernel, at most half the GPU's SMs' worth of CTAs (66 on H100/H200),
    after the copies; copies use none (one CTA for the whole call when it runs one-shot: see
    :func:`all_gather_into_tensor`).
    Workspace: ``input`` bytes of symmetric memory per rank (peers push their chunks there).
    In `conccl bench`; not yet in `conccl study` or the planner (no profile data).
    """
    return get_group(group).call(REDUCE_SCATTER, output, input, (op,), async_op, timeout=timeout,
                                 route=True)


def all_reduce(tensor, op=None, group=None, async_op=False, *, timeout=None):
    """Reduce ``tensor`` over the ranks, in place, copy engines moving every byte and one small
    kernel reducing.

    Args:
        tensor: CUDA tensor, contiguous, bf16, fp16 or fp32, any number of elements (the same
            on every rank); it needs no special allocation.
        op: ``torch.distributed.ReduceOp.SUM`` (default), ``AVG`` or ``PREMUL_SUM(factor)``
            (a Python float). Every rank must pass the same.
        group, async_op, timeout: as in :func:`all_gather_into_tensor`.

    Two ways, chosen by size alike on every rank (the group's call takes ``algorithm=`` to
    ask for one; a group default from ``set_options`` does not choose here): **one pass**
    (``Algorithm.STAGED_PUSH``) while it sends at most 8 MiB more than two passes and its
    workspace stays double-buffered (every size to 32 MiB at two ranks, 5 MiB at four, 1.5 MiB
    at eight): every rank pushes its whole tensor into every peer's workspace and reduces
    what landed, one signal on the critical path; above,
    **two passes** (``Algorithm.PUSH``): a reduce-scatter into the workspace, rank r
    reducing elements ``r*c .. (r+1)*c`` (``c``: the count divided by the world size,
    rounded up to 16 bytes), then an all-gather of the chunks out of it. Either way every
    element is summed in the order rank 0, 1, ..., in fp32, rounded to the dtype once (AVG
    and PREMUL_SUM multiply each operand first): the same bits. Two ranks: NCCL's result bit
    for bit as :func:`reduce_scatter_tensor` says; more: within the dtype's rounding of
    NCCL's ring order. Stream semantics and failures: as :func:`all_gather_into_tensor`.

    SMs used: the reduction kernel, at most half the GPU's SMs' worth of CTAs, over the whole
    tensor (one pass) or one chunk (two); copies use none (one CTA for the whole call when it
    runs one-shot: see :func:`all_gather_into_tensor`). Workspace, symmetric memory per rank:
    ``world`` x the tensor's bytes in one pass, the tensor's bytes in two (rounded up to 256
    per slot), twice where double-buffered (:mod:`conccl.schedule.base`). In `conccl bench`; not
    yet in `conccl study` or the planner.
    """
    return get_group(group).call(ALL_REDUCE, tensor, tensor, (op,), async_op, timeout=timeout,
                                 route=True)


def persistent_all_gather_into_tensor(output, input, group=None, *, timeout=None):
    """Agree an all-gather of ``input`` into ``output`` with the peers once; start it many times.

    A collective call (every rank of ``group``, like :func:`all_gather_into_tensor`, with the
    same arguments' rules); nothing moves yet. Returns a :class:`conccl.PersistentCollective`
    whose ``start(async_op=False)`` queues the gather with no host handshake: at 1 MiB on
    H200 it skips the validation, the peer exchange and the plan lookup of a one-shot call.
    Every rank must start its persistent ops in the same order (as with NCCL calls); see
    :mod:`conccl.group.persistent` for what is and is not checked.

    Shapes, dtypes, stream semantics of ``start``, SMs used (none) and workspace: as
    :func:`all_gather_into_tensor`. The tensors must keep their memory while the op lives;
    their contents may change between starts.
    """
    return get_group(group).persistent(ALL_GATHER, output, input, (), timeout=timeout)


def persistent_all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, *,
                                 timeout=None):
    """Agree an all-to-all with the peers once; start it many times (see
    :func:`persistent_all_gather_into_tensor`). The split sizes are read here, once: later
    changes to them do not reach the op. Arguments as :func:`all_to_all_single`.
    """
    return get_group(group).persistent(ALL_TO_ALL, output, input, (output_split_sizes, input_split_sizes),
                                       timeout=timeout)


def persistent_reduce_scatter_tensor(output, input, op=None, group=None, *, timeout=None):
    """Agree a reduce-scatter with the peers once; start it many times (see
    :func:`persistent_all_gather_into_tensor`). Arguments as :func:`reduce_scatter_tensor`."""
    return get_group(group).persistent(REDUCE_SCATTER, output, input, (op,), timeout=timeout)


def persistent_all_reduce(tensor, op=None, group=None, *, timeout=None):
    """Agree an in-place all-reduce of ``tensor`` with the peers once; start it many times (see
    :func:`persistent_all_gather_into_tensor`). Arguments as :func:`all_reduce`."""
    return get_group(group).persistent(ALL_REDUCE, tensor, tensor, (op,), timeout=timeout)


def reserve_graph_workspace(nbytes: int, group=None) -> None:
    """Reserve ``nbytes`` of symmetric memory for the workspaces of conccl calls captured into
    CUDA graphs later (a collective call, made before the first capture on ``group``).

    A captured call runs at every replay with a workspace region of its own (nothing it
    touches is shared with another call: :mod:`conccl.schedule.captured`): a reduce-scatter, or an
    all-reduce in two passes, needs its input's bytes (each chunk's slot rounded up to 256);
    an all-reduce in one pass (:func:`all_reduce`: by default to 32 MiB at two ranks)
    ``world`` x its bytes; an all-gather or all-to-all from ordinary tensors its input's, from
    :func:`empty` tensors none (an all-gather's ``Algorithm.STAGED_PUSH``: its output's).
    :meth:`~conccl.collectives.base.Collective.graph_workspace_bytes` gives the bound. Capturing a call that
    does not fit raises :class:`InvalidArgument` naming what it needs.
    """
    if not isinstance(nbytes, int) or nbytes < 0:
        raise InvalidArgument(f"nbytes must be a whole number of bytes >= 0, got {nbytes!r}")
    get_group(group).executor.reserve_graph_workspace(nbytes)


def set_options(group=None, *, algorithm: Algorithm | None = None, stream_mode: StreamMode | None = None,
                timeout: timedelta | None = None, checks: bool | None = None, nccl_below: dict | None = None,
                post_settled: bool | None = None, own_chunk_via_peer: bool | None = None) -> None:
    """Change a group's defaults (algorithm, stream mode, timeout) on this rank.

    ``own_chunk_via_peer=True``: a push all-gather (every output from :func:`conccl.empty`,
    not in place) reads its own chunk back from a peer's output on a copy engine instead of
    copying it on this GPU. A same-GPU copy is an SM kernel, which waits behind a GEMM that
    holds every SM (cuBLAS's do, to their end); the read-back does not, so the call completes
    beside a running GEMM in about its own time. It costs the chunk once more over the link
    from that peer (docs/api.md has the figures). Per rank; ranks may differ; the other
    collectives are unchanged. ``CONCCL_OWN_CHUNK_VIA_PEER=1`` sets it for new groups.

    ``post_settled=False``: every call waits on the host board for every peer's row, so a
    mismatch always raises before anything moves (default True: a call that repeats a
    settled one posts its row and goes on, its peers' rows compared at the next call;
    ``CONCCL_DISABLE=post_settled`` sets False for new groups). Per rank; ranks may differ.

    ``checks=False`` turns off the mismatch checks and the watchdog; it exists to measure
    what they cost (a dead peer then hangs the GPU stream) and must be set on every rank.
    ``nccl_below``: {collective name: output bytes per rank}; an eager call below its
    collective's size runs on the process group's own backend (NCCL) instead of the copy
    engines (``{}``: never). Setting it is a collective call: every rank must give the same
    table (compared, InvalidArgument otherwise). :func:`conccl.set_eager_path` sets it from a
    hardware profile.
    """
    table = None if nccl_below is None else check_nccl_below(nccl_below)
    g = get_group(group)
    opts = g.options
    if table is not None:
        g.set_nccl_below(table)
    if algorithm is not None:
        opts.algorithm = Algorithm(algorithm)
    if stream_mode is not None:
        opts.stream_mode = StreamMode(stream_mode)
    if timeout is not None:
        opts.timeout = timeout
    if checks is not None:
        opts.checks = bool(checks)
    if post_settled is not None:
        opts.post_settled = bool(post_settled)
    if own_chunk_via_peer is not None:
        opts.own_chunk_via_peer = bool(own_chunk_via_peer)


def check_nccl_below(table) -> dict:
    """``table`` as {registered collective name: int bytes >= 0}; InvalidArgument otherwise."""
    if not isinstance(table, dict):
        raise InvalidArgument(f"nccl_below must be a dict of collective name -> bytes, got {type(table).__name__}")
    out = {}
    for name, limit in table.items():
        if name not in REGISTRY:
            raise InvalidArgument(f"nccl_below names an unknown collective {name!r}; known: {', '.join(REGISTRY)}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidArgument(f"nccl_below[{name!r}] must be a whole number of bytes >= 0, got {limit!r}")
        out[name] = limit
    return out


def destroy(group=None) -> None:
    """Close a group's conccl state (every group's when ``group`` is None): its persistent ops,
    workspace, signal pad, board, watchdog and what upper layers attached to it. A later call
    on the process group makes a new one. Local: each rank destroys its own."""
    names = list(_GROUPS) if group is None else [_resolve_group(group).group_name]
    for name in names:
        g = _GROUPS.pop(name, None)
        if g is not None:
            g.close()


atexit.register(destroy)
