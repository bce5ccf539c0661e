"""A call's local step: what its own arguments decide, remembered by their metadata.

The local step validates the arguments (the collective's :meth:`~conccl.collectives.base.Collective.local`),
looks up whether peers can reach the tensors (the executor's ``peer_view``) and builds the row
this rank publishes (:func:`conccl.group.row.build_row`). A pure function of the arguments'
metadata, so :class:`LocalSteps` remembers it by a key of that metadata: a loop passes the
same tensors call after call, and a call's host time is the cost at small sizes. A
:class:`LocalStep` also carries the agreement's memo of the rows it settled on and whether it
posts (:class:`conccl.group.agreement.Agreement` writes them).
"""
from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as _field

import torch

from ..collectives import Collective, LocalCall
from ..collectives.reduce_scatter import reduce_op
from ..errors import InvalidArgument
from ..schedule.base import Algorithm, StreamMode
from . import row as board_row
from .options import Options

__all__ = ["MAX_REMEMBERED", "LocalStep", "LocalSteps"]

MAX_REMEMBERED = 64  # argument sets (and peers' rows per set) a group remembers


@dataclass(eq=False)
class LocalStep:
    """A call's local step: what its own arguments decide."""

    coll: Collective
    dtype: object
    row: list  # published on the board; the sequence number is written per call
    views: tuple  # the executor's peer_view of (input, output)
    algorithm: Algorithm | None  # as asked for, by the call or the group's default (the row's; None: automatic)
    stream_mode: StreamMode
    call: LocalCall  # what the collective's validation decided
    via_peer: bool = False  # Options.own_chunk_via_peer when it was made (part of its key)
    settled: dict = _field(default_factory=dict)  # rows (sequence numbers zeroed) -> (schedule, views)
    # The rows of its last exchanged calls and how many in a row were alike; once POST_AFTER
    # were, the next calls post their row instead (``posted``: rows, schedule and views).
    last_rows: bytes | None = None
    alike: int = 0
    posted: tuple | None = None

    def captured(self) -> "LocalStep":
        """This step as a call being captured into a graph takes it: its row flagged so (a peer
        capturing another call, or running one eagerly, is a mismatch), its own memo."""
        row = list(self.row)
        row[board_row.FLAGS] |= board_row.FLAG_GRAPH
        return LocalStep(self.coll, self.dtype, row, self.views, self.algorithm, self.stream_mode, self.call,
                         self.via_peer)


def _plain(arg):
    """``arg`` as a key, by value: split sizes only as plain ints (a tensor hashes by identity,
    and its value can change in place), a reduction op as its (name, factor). torch's ReduceOp
    compares PREMUL_SUM(2.0) equal to PREMUL_SUM(3.0), so as a key it would replay the first
    call's factor. Raises TypeError for anything else not remembered."""
    if isinstance(arg, (list, tuple)):
        arg = tuple(arg)
        if not all(type(x) is int for x in arg):
            raise TypeError("split sizes that are not plain ints are not remembered")
        return arg
    if isinstance(arg, (torch.distributed.ReduceOp, torch.distributed.ReduceOp.RedOpType)):
        try:
            return reduce_op(arg, 1)
        except InvalidArgument:  # validation refuses it, in words
            raise TypeError("an unsupported reduction op is not remembered") from None
    return arg


def _check_algorithm(algorithm) -> None:
    if algorithm is not None and not isinstance(algorithm, Algorithm):
        raise InvalidArgument(f"algorithm must be a conccl.Algorithm, got {algorithm!r}")


class LocalSteps:
    """One group's local steps, made and remembered (at most :data:`MAX_REMEMBERED`; then all
    are forgotten at once). ``options`` is the group's own :class:`Options` object, read at
    every call."""

    def __init__(self, executor, rank: int, world: int, options: Options):
        self.executor, self.rank, self.world, self.options = executor, rank, world, options
        self._steps: dict[tuple, LocalStep] = {}

    def __len__(self) -> int:
        return len(self._steps)

    def step(self, coll: Collective, output, input, args, algorithm, stream_mode) -> LocalStep:
        """The local step of a call of ``coll`` on (output, input, *args), remembered or made now."""
        key, local = self.remembered(coll.name, output, input, algorithm, stream_mode, *args)
        return local if local is not None else self.make(coll, output, input, args, algorithm, stream_mode, key)

    def remembered(self, coll_name: str, output, input, *args):
        """(key, remembered local step or None); the key is None when it cannot be had.

        The key is everything the local step reads. Validation depends on the tensors' address,
        shape, strides, dtype and device; the peer-reachable views on the address and the
        executor's allocations (its generation grows with every symmetric allocation); the row
        on the options too."""
        try:
            if not (output.numel() and input.numel()):
                # an empty tensor's address names no storage (a slice's end is another block's
                # start): what validation reads from it differs at the same address
                return None, None
            opts = self.options
            key = (coll_name, output.data_ptr(), input.data_ptr(), output.shape, input.shape, output.stride(),
                   input.stride(), output.dtype, input.dtype, output.device, input.device,
                   self.executor.views_generation, opts.algorithm, opts.stream_mode,
                   opts.checks, opts.one_shot_below, opts.own_chunk_via_peer,
                   *map(_plain, args))
            return key, self._steps.get(key)  # hashes the key once; raises if it cannot
        except (AttributeError, TypeError, RuntimeError):  # not tensors, odd splits: not remembered
            return None, None

    def make(self, coll: Collective, output, input, args, algorithm, stream_mode, key) -> LocalStep:
        """Validate the call and build its row now; remembered under ``key`` unless None."""
        ex = self.executor
        call = coll.local(output, input, tuple(args), self.world, self.rank, ex.device_type)
        local = self.from_call(coll, call, input.dtype, input.numel() * input.element_size(),
                               output.numel() * output.element_size(), (ex.peer_view(input), ex.peer_view(output)),
                               algorithm, stream_mode)
        return local if key is None else self.remember(key, local)

    def lookup(self, key) -> LocalStep | None:
        """The local step remembered under ``key`` (a caller's own key: conccl.group.parts)."""
        return self._steps.get(key)

    def remember(self, key, local: LocalStep) -> LocalStep:
        """Remember ``local`` under ``key``; returns it."""
        if len(self._steps) >= MAX_REMEMBERED:
            self._steps.clear()
        self._steps[key] = local
        return local

    def forget(self) -> None:
        """Forget every local step (the group closes)."""
        self._steps.clear()

    def from_call(self, coll: Collective, call: LocalCall, dtype, in_bytes: int, out_bytes: int, views, algorithm,
                  stream_mode) -> LocalStep:
        """The local step of a validated ``call``: its board row. The row names the algorithm the
        call asks for, its own or else the group's default: the default is each rank's own
        (``set_options``), and ranks that asked for different ones must be refused alike (a
        push on one rank and a pull on the other each wait for signals that say nothing of
        the other's copies: a silently wrong output)."""
        _check_algorithm(algorithm)
        asked = algorithm or self.options.algorithm
        if algorithm is None and (not coll.follows_group_default
                                  or (asked is Algorithm.STAGED_PUSH and not coll.staged_push)):
            asked = None  # a default for the collectives that take it (the gathers), not a request
        row = board_row.build_row(coll.name, dtype, in_bytes, out_bytes, views, asked, call)
        return LocalStep(coll, dtype, row, views, asked, stream_mode or self.options.stream_mode, call,
                         self.options.own_chunk_via_peer)
