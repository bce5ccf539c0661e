"""A group over several hosts: a node-local :class:`~conccl.group.Group` (copy engines; the
CPU reference executor in tests) composed with a cross-node ``torch.distributed`` group of
the ranks of equal local index (the group's backend: NCCL on GPUs, gloo in tests). conccl
moves nothing between hosts itself.

Layout (:mod:`conccl.group.topology`): N hosts of L ranks, rank ``n * L + l`` is local rank l
of host n. ``c``: one rank's chunk. What each collective moves, and where::

    all-gather      cross-node all-gather of the own chunk       -> tmp[N chunks], ordered by host
                    node-local all-gather of tmp into parts      -> output rows n*L + l
                    (network: (N-1) c per rank, not L (N-1) c as node-local first would move;
                    the parts call writes host n's L chunks straight into the output's block n,
                    no permutation copy: Group.all_gather_into_parts)
    reduce-scatter  node-local reduce-scatter from parts         -> tmp[N chunks]: host n's sum of
                    (the input's host blocks, row l of each)        chunk (n', l) for every n'
                    cross-node reduce-scatter (SUM) of tmp       -> output
    all-reduce      node-local reduce-scatter (1/L of the tensor), cross-node all-reduce (SUM)
                    of that piece, node-local all-gather back into the tensor (a tensor whose
                    count L does not divide goes through a zero-padded copy, on SMs)
    all-to-all      cross-node all-to-all (host blocks are contiguous in the input), one
                    permutation copy, node-local all-to-all, one permutation copy (both on
                    SMs); equal splits only: other splits run the flat collective on the
                    group's backend, with one warning

Order of summation (reductions): each host sums its L ranks' operands in rank order, each
operand times the op's scale (AVG: 1/world, PREMUL_SUM: its factor), in fp32, rounded to the
dtype once (the node-local reduction kernel); then the backend sums the N hosts' partial
results (NCCL's order, gloo's). Equal to the flat collective bit for bit where every partial
sum is exact (integer-valued data within the dtype's mantissa, a power-of-two scale);
otherwise within the dtype's rounding of it.

Agreement before anything moves (``options.checks``): the call's descriptor (sequence number,
collective, dtype, input and output bytes, reduction op) is exchanged with the cross-node
peers over a gloo control group (host memory: no GPU sync), then with the node's ranks on the
node-local board together with what each saw across hosts, so a mismatch anywhere raises
:class:`~conccl.errors.CollectiveError` on every rank and moves nothing. A failure of the
backend (a dead or hung rank on another host: the backend's timeout, set to the group's at
creation) breaks the group on this rank and, through the node-local board's abort word, on
its host's ranks; a later call raises :class:`~conccl.errors.GroupBroken`.

Calls are blocking (stream-ordered on CUDA): ``async_op=True`` returns a completed
:class:`~conccl.group.work.Work`, the call already ordered on the caller's stream. Persistent ops
(:class:`~conccl.group.persistent.HierarchicalPersistent`) agree across hosts once and skip that
exchange on every start. Not yet: CUDA graph capture, ``nccl_below`` routing, ``conccl.empty``
on such a group.
"""
from __future__ import annotations

import time
import warnings
import weakref

import torch

from ..collectives import Collective
from ..collectives.all_gather import ALL_GATHER
from ..collectives.all_reduce import ALL_REDUCE
from ..collectives.all_to_all import ALL_TO_ALL
from ..collectives.reduce_scatter import REDUCE_SCATTER, reduce_op
from ..errors import CollectiveError, CollectiveTimeout, GroupBroken, InvalidArgument
from .persistent import HierarchicalPersistent
from .work import Work
from .group import Group
from .methods import CollectiveMethods
from .row import ALGO, ARG, COLL, DTYPE, IN_BYTES, OUT_BYTES, SEQ, code, describe
from .topology import HostLayout

# The call's descriptor, field by field as the group's board row names them (for row.describe).
_FIELDS = ((SEQ, "sequence number"), (COLL, "collective"), (DTYPE, "dtype"), (IN_BYTES, "input size"),
           (OUT_BYTES, "output size"), (ARG, "reduction op"), (ALGO, "default algorithm (set_options)"))


class CrossNode:
    """The cross-node part: ``torch.distributed`` calls on the ranks of one local index, one
    per host (``data``, the group's backend), and a host-memory exchange of small descriptors
    (``control``, gloo). ``lib`` is ``torch.distributed``. Tensors a CPU backend (gloo) cannot
    take from the GPU go through host copies, as gloo's own CUDA paths do."""

    def __init__(self, lib, data, control, host_staged: bool):
        self.lib, self.data, self.control, self.host_staged = lib, data, control, host_staged

    def exchange(self, row: list[int]) -> list[list[int]]:
        """Every host's ``row`` (int64), host by host."""
        mine = torch.tensor(row, dtype=torch.int64)
        every = torch.empty(self.lib.get_world_size(self.control) * len(row), dtype=torch.int64)
        self.lib.all_gather_into_tensor(every, mine, group=self.control)
        return every.view(-1, len(row)).tolist()

    def _run(self, fn, output, *inputs):
        if not (self.host_staged and output.is_cuda):
            fn(output, *inputs)
            return
        host_out = output.cpu()
        fn(host_out, *(t.cpu() for t in inputs))
        output.copy_(host_out)

    def all_gather(self, output, input):
        self._run(lambda o, i: self.lib.all_gather_into_tensor(o, i, group=self.data), output, input)

    def reduce_scatter_sum(self, output, input):
        self._run(lambda o, i: self.lib.reduce_scatter_tensor(o, i, group=self.data), output, input)

    def all_reduce_sum(self, tensor):
        self._run(lambda t: self.lib.all_reduce(t, group=self.data), tensor)

    def all_to_all(self, output, input):
        self._run(lambda o, i: self.lib.all_to_all_single(o, i, group=self.data), output, input)


class HierarchicalGroup(CollectiveMethods):
    """A conccl group over ``layout.num_hosts`` hosts (see the module doc): ``node`` is this
    rank's host's :class:`Group`, ``cross`` its :class:`CrossNode`; ``fallback`` (library,
    process group) runs a collective flat where no composition serves it. Made by
    :func:`conccl.get_group` for a process group spanning hosts, or by
    :func:`conccl.testing.spawn_hosts` on the CPU; released by :meth:`close` (the node-local
    group; the process groups are torch's)."""

    def __init__(self, node: Group, cross: CrossNode, layout: HostLayout, rank: int, fallback=None, name: str = ""):
        if node.world != layout.per_host:
            raise InvalidArgument(f"the node-local group has {node.world} ranks, the layout {layout}")
        self.node, self.cross, self.layout, self.rank = node, cross, layout, rank
        self.world, self.name, self.fallback = layout.world, name, fallback
        self.host, self.local_rank = layout.host_of(rank), layout.local_of(rank)
        self.options = node.options  # one set of defaults: the node-local calls read them
        self.seq = 0
        self.broken: BaseException | None = None
        self.closed = False
        self._warned = False
        self.persistent_ops = 0  # persistent collectives made on this group (their ids)
        self._ops: weakref.WeakSet = weakref.WeakSet()  # the open ones, closed with the group

    @property
    def executor(self):
        raise InvalidArgument(f"conccl group {self.name!r} spans {self.layout}: conccl.empty and graph workspaces "
                              "serve groups of one host only")

    # ------------------------------------------------------------------ calls
    def call(self, coll: Collective, output, input, args: tuple = (), async_op: bool = False, *, algorithm=None,
             stream_mode=None, timeout=None, route: bool = False) -> Work:
        """Run ``coll`` on (output, input, *args) over every host; see the API function of
        ``coll.api_name`` and the module doc. ``algorithm`` must be None (each node-local step
        picks its own); ``route`` is ignored (no ``nccl_below`` on such a group yet)."""
        timeout_s, flat = self._validate_and_agree(coll, output, input, args, algorithm, timeout)
        return self.run_agreed(coll, output, input, args, timeout_s, stream_mode, flat)

    def _validate_and_agree(self, coll: Collective, output, input, args, algorithm, timeout) -> tuple[float, bool]:
        """(timeout seconds, whether the call runs flat) once this rank's arguments are valid and
        every rank of every host made the call alike (:meth:`_agree`); raises before anything moves."""
        if self.closed:
            raise InvalidArgument(f"conccl group {self.name!r} is closed")
        if algorithm is not None:
            raise InvalidArgument("a group spanning hosts picks its node-local algorithms itself; pass algorithm=None")
        if coll not in _COMPOSED:
            raise InvalidArgument(f"{coll.api_name} is not served on a group spanning hosts")
        call = coll.local(output, input, tuple(args), self.world, self.rank, self.node.executor.device_type)
        self.check_usable()
        timeout_s = self.timeout_s(timeout)
        flat = _flat_only(coll, args)
        if flat and self.fallback is None:
            raise InvalidArgument(f"{coll.api_name} with split sizes is not served on this group spanning hosts")
        self._agree(coll, call, input, output, self.seq + 1, timeout_s, flat)
        return timeout_s, flat

    def run_agreed(self, coll: Collective, output, input, args, timeout_s: float, stream_mode, flat: bool) -> Work:
        """Move a call every rank agreed (:meth:`call`, a persistent op's start): flat on the
        backend, or composed (node-local, cross-node)."""
        if flat:
            return self._flat(coll, output, input, args)
        self.seq += 1
        start = time.monotonic()
        try:
            _COMPOSED[coll](self, output, input, args, timeout_s, stream_mode)
        except (CollectiveTimeout, GroupBroken) as e:
            self.fail(e)
            raise
        except RuntimeError as e:  # the backend's: a rank on another host died or hung
            if isinstance(e, (CollectiveError, InvalidArgument)):
                raise
            err = self._backend_failure(coll, self.seq, start, e)
            self.fail(err)
            raise err from e
        return Work()

    def persistent(self, coll: Collective, output, input, args: tuple = (), *, algorithm=None, stream_mode=None,
                   timeout=None) -> "HierarchicalPersistent":
        """Validate and agree ``coll`` on these buffers with every rank of every host once; the
        returned op's ``start`` skips that agreement (see :class:`HierarchicalPersistent`)."""
        timeout_s, flat = self._validate_and_agree(coll, output, input, args, algorithm, timeout)
        self.seq += 1  # the agreement is a call of its own: every rank counts it alike
        self.persistent_ops += 1
        op = HierarchicalPersistent(self, self.persistent_ops, coll, input, output, tuple(args), timeout_s,
                                    stream_mode, flat)
        self._ops.add(op)
        return op

    def agree(self, text: str, what: str, hint: str = "", timeout=None) -> None:
        """As :meth:`Group.agree`, over every host: this host's ranks on its board, then the
        ranks of this local index across hosts (so every rank of the group, in two steps); a
        host that differs raises InvalidArgument on every rank of this column."""
        self.node.agree(text, what, hint, timeout)
        digest = code(text)
        hosts = [row[0] for row in self.cross.exchange([digest])]
        differ = [h for h, d in enumerate(hosts) if d != digest]
        if differ:
            raise InvalidArgument(f"conccl {what}: host {differ[0]} has another {what} than host {self.host} "
                                  f"({text[:200]})" + (f"; {hint}" if hint else ""))

    def resource(self, key: str, make):
        """As :meth:`Group.resource`: kept on the node-local group, closed with it."""
        return self.node.resource(key, make)

    def set_nccl_below(self, table: dict, timeout=None) -> None:
        if table:
            raise InvalidArgument(f"nccl_below routing is not yet served on a group spanning hosts ({self.layout})")

    def _flat(self, coll: Collective, output, input, args) -> Work:
        lib, pg = self.fallback
        if not self._warned:
            self._warned = True
            warnings.warn(f"conccl: {coll.api_name} with uneven splits on a group spanning hosts runs flat on the "
                          "group's backend (this warning is shown once per group)", stacklevel=3)
        self.seq += 1  # counted before it runs, as a composed call: the ranks stay in step either way
        start = time.monotonic()
        try:
            coll.call_with(lib, output, input, tuple(args), group=pg)
        except RuntimeError as e:  # the backend's: a dead or hung rank breaks the group, as a composed call's
            if isinstance(e, (CollectiveError, InvalidArgument)):
                raise
            err = self._backend_failure(coll, self.seq, start, e)
            self.fail(err)
            raise err from e
        return Work(path="nccl")

    # ------------------------------------------------------------------ agreement and failure
    def _agree(self, coll: Collective, call, input, output, seq: int, timeout_s: float, flat: bool = False) -> None:
        """Raise CollectiveError on every rank, before anything moves, unless every rank of
        every host made this call alike (see the module doc). ``flat``: the call runs flat on
        the backend, which checks its sizes (they may differ between ranks); the ranks must
        still agree that it runs flat (its sizes are published as -1)."""
        if not self.options.checks:
            return
        sizes = (-1, -1) if flat else (input.numel() * input.element_size(), output.numel() * output.element_size())
        # the node-local steps read each rank's default algorithm: every host must have the same
        default = self.options.algorithm
        desc = [seq, code(coll.name), code(str(input.dtype)), *sizes, call.agreed,
                -1 if default is None else code(default.value)]
        what = f"conccl {coll.name} (hierarchical, sequence number {seq})"
        try:
            hosts = self.cross.exchange(desc)
        except RuntimeError as e:
            if isinstance(e, CollectiveError):
                raise
            err = self._backend_failure(coll, seq, time.monotonic(), e)
            self.fail(err)
            raise err from e
        seen = [0, -1, -1]  # (descriptor field + 1, that host's rank) of the first cross-node difference
        for n, row in enumerate(hosts):
            diff = [i for i, (a, b) in enumerate(zip(row, desc)) if a != b]
            if diff:
                seen = [diff[0] + 1, self.layout.cross_ranks(self.local_rank)[n], row[diff[0]]]
                break
        try:
            rows = self.node.board.exchange(desc + seen, what, timeout_s, seq)
        except (CollectiveTimeout, GroupBroken) as e:
            self.fail(e)
            raise
        base = self.host * self.layout.per_host
        for field, (f, name) in enumerate(_FIELDS):
            bad = [l for l in range(self.layout.per_host) if rows[l, field] != desc[field]]
            if bad:
                raise CollectiveError(
                    f"{what} on rank {self.rank}: rank {base + bad[0]} called with a different {name} "
                    f"({describe(f, rows[bad[0], field], input.dtype)} vs {describe(f, desc[field], input.dtype)} "
                    "here); nothing was moved")
        for l in range(self.layout.per_host):
            f1, other, value = (int(v) for v in rows[l, len(desc):])
            if f1:
                f, name = _FIELDS[f1 - 1]
                raise CollectiveError(
                    f"{what} on rank {self.rank}: rank {other} (another host) called with a different {name} "
                    f"({describe(f, value, input.dtype)} vs {describe(f, desc[f1 - 1], input.dtype)} on rank "
                    f"{base + l}); nothing was moved")

    def _backend_failure(self, coll: Collective, seq: int, start: float, e: BaseException) -> CollectiveTimeout:
        peers = [r for r in self.layout.cross_ranks(self.local_rank) if r != self.rank]
        return CollectiveTimeout(f"conccl {coll.name} (cross-node)", seq, peers, time.monotonic() - start,
                                 note=f"the cross-node backend failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")

    def timeout_s(self, timeout) -> float:
        """As :meth:`Group.timeout_s` (the node-local group's options are this group's)."""
        return self.node.timeout_s(timeout)

    def check_usable(self) -> None:
        """As :meth:`Group.check_usable`, for this group and its node-local one."""
        if self.broken is not None:
            raise GroupBroken(
                f"this conccl group is broken since an earlier collective failed ({self.broken}); nothing was moved. "
                "Destroy the group (conccl.destroy) and create a new one.", self.broken) from self.broken
        self.node.check_usable()

    def fail(self, error: BaseException) -> None:
        """Break the group with ``error``, and the node-local group with it (its board's abort
        word tells this host's ranks at once)."""
        if self.broken is None:
            self.broken = error
        self.node.fail(error)

    def close(self) -> None:
        """Close the node-local group (local, idempotent). The process groups stay torch's."""
        if not self.closed:
            self.closed = True
            for op in list(self._ops):
                op.close()
            self.node.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"seq {self.seq}"
        return f"HierarchicalGroup({self.name!r}, rank {self.rank}/{self.world}, {self.layout}, {state})"


# ---------------------------------------------------------------------- compositions
def _node_op(op, world: int):
    """The node-local step's op: the flat call's scale applied once, to every operand, there
    (SUM stays SUM; AVG becomes PREMUL_SUM(1/world) of the whole group); the cross-node sum is
    then a plain SUM."""
    _, scale = reduce_op("SUM" if op is None else op, world)
    if scale == 1.0:
        return None
    return torch.distributed._make_nccl_premul_sum(scale)


def _all_gather(g: HierarchicalGroup, output, input, args, timeout_s, stream_mode) -> None:
    k, hosts, per = input.numel(), g.layout.num_hosts, g.layout.per_host
    if k == 0:
        return
    tmp = torch.empty(hosts * k, dtype=input.dtype, device=input.device)
    g.cross.all_gather(tmp, input.reshape(-1))
    flat = output.view(-1)
    parts = [flat[n * per * k:(n + 1) * per * k] for n in range(hosts)]
    g.node.all_gather_into_parts(None, tmp, parts, timeout=timeout_s)


def _reduce_scatter(g: HierarchicalGroup, output, input, args, timeout_s, stream_mode) -> None:
    k, hosts, per = output.numel(), g.layout.num_hosts, g.layout.per_host
    if k == 0:
        return
    tmp = torch.empty(hosts * k, dtype=output.dtype, device=output.device)
    flat = input.reshape(-1)
    parts = [flat[n * per * k:(n + 1) * per * k] for n in range(hosts)]
    g.node.reduce_scatter_from_parts(tmp, parts, [k] * hosts, _node_op(args[0] if args else None, g.world),
                                     timeout=timeout_s)
    g.cross.reduce_scatter_sum(output.view(-1), tmp)


def _all_reduce(g: HierarchicalGroup, output, input, args, timeout_s, stream_mode) -> None:
    m, per = input.numel(), g.layout.per_host
    if m == 0:
        return
    piece = -(-m // per)
    if piece * per == m:
        src, dst = input.reshape(-1), output.view(-1)
    else:  # L does not divide the count: a zero-padded copy (the padding is summed and dropped)
        src = dst = torch.zeros(piece * per, dtype=input.dtype, device=input.device)
        src[:m] = input.reshape(-1)
    mine = torch.empty(piece, dtype=input.dtype, device=input.device)
    g.node.call(REDUCE_SCATTER, mine, src, (_node_op(args[0] if args else None, g.world),), timeout=timeout_s,
                stream_mode=stream_mode)
    g.cross.all_reduce_sum(mine)
    g.node.call(ALL_GATHER, dst, mine, (), timeout=timeout_s, stream_mode=stream_mode)
    if dst.data_ptr() != output.data_ptr() or dst.numel() != m:
        output.view(-1).copy_(dst[:m])


def _flat_only(coll: Collective, args) -> bool:
    """Whether the call runs flat on the backend: an all-to-all with split sizes given."""
    return coll is ALL_TO_ALL and any(a is not None for a in args)


def _all_to_all(g: HierarchicalGroup, output, input, args, timeout_s, stream_mode) -> None:
    hosts, per = g.layout.num_hosts, g.layout.per_host
    n = input.numel()
    if n == 0:
        return
    if n % g.world:
        raise InvalidArgument(f"all_to_all_single with equal splits needs the input's {n} elements divisible by the "
                              f"world size ({g.world})")
    k = n // g.world
    # input: [dest host][dest local][k]; cross-node exchange of host blocks
    got = torch.empty(n, dtype=input.dtype, device=input.device)
    g.cross.all_to_all(got, input.reshape(-1))
    # got: [source host][dest local][k] -> node-local send order [dest local][source host][k]
    send = got.view(hosts, per, k).transpose(0, 1).contiguous().view(-1)
    recv = torch.empty(n, dtype=input.dtype, device=input.device)
    g.node.call(ALL_TO_ALL, recv, send, (None, None), timeout=timeout_s, stream_mode=stream_mode)
    # recv: [source local][source host][k] -> output order [source host][source local][k]
    output.view(hosts, per, k).copy_(recv.view(per, hosts, k).transpose(0, 1))


_COMPOSED = {ALL_GATHER: _all_gather, REDUCE_SCATTER: _reduce_scatter, ALL_REDUCE: _all_reduce,
             ALL_TO_ALL: _all_to_all}
