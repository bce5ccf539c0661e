"""Persistent collectives: agree with the peers once, start many times.

A call of :func:`conccl.all_gather_into_tensor` spends most of its host time at small sizes
on agreeing with its peers (publishing its row on the host board and reading theirs, then
looking the rows up among the remembered ones), not on queueing copies. A loop that gathers
the same buffers every step (FSDP's parameter all-gather, a decode step's all-to-all) can
agree once instead, as MPI's persistent collectives (``MPI_Allgather_init``) do::

    op = conccl.persistent_all_gather_into_tensor(out, shard)   # every rank: validate, agree, plan
    for step in range(n):
        shard.copy_(...)                                        # contents may change
        op.start()                                              # queue the copies only
        use(out)
    op.close()

What :meth:`PersistentCollective.start` skips: the validation, the board exchange and the
rows' lookup. What it keeps: the sequence number and signal protocol of every conccl call
(so persistent starts and ordinary calls can be mixed on a group), the stream semantics, the
watchdog (a peer that never starts its op times out with its rank named).

What it cannot check: that every rank starts the *same* op. As with NCCL, the ranks of a
group must issue the same collectives in the same order; a rank that starts another op
than its peers (or makes an ordinary call while they start one) is not told at once: the
peers' stream waits or host exchange time out and the group breaks.
"""
from __future__ import annotations

from ..errors import InvalidArgument


class PersistentCollective:
    """One collective's agreed schedule and buffers, started with :meth:`start`.

    Made by :func:`conccl.persistent_all_gather_into_tensor` and
    :func:`conccl.persistent_all_to_all_single` (a collective call: every rank of the group).
    Holds references to its tensors: they must keep their storage (no ``resize_``, no
    ``set_``); their contents may change between starts.
    """

    def __init__(self, group, op_id: int, coll, schedule, views, input, output, timeout_s: float, args=()):
        self._comm, self.op_id, self.coll = group, op_id, coll
        self._schedule, self._views = schedule, views
        self._input, self._output, self._timeout_s = input, output, timeout_s
        # The call's extra arguments as given (an all-to-all's split sizes, copied), so a
        # runtime that plans NCCL for this pair can run the same collective with them.
        self.args = tuple(list(a) if isinstance(a, (list, tuple)) else a for a in args)
        self._ptrs = (input.data_ptr(), output.data_ptr())

    @property
    def collective(self) -> str:
        """The collective's registry name (``"all_gather"``, ...)."""
        return self.coll.name

    @property
    def input(self):
        return self._input

    @property
    def output(self):
        return self._output

    @property
    def closed(self) -> bool:
        return self._comm is None

    def start(self, async_op: bool = False):
        """Queue the collective on the caller's current stream, as the one-shot call would.

        Stream semantics: starts after the work already queued on the caller's current stream;
        with ``async_op=False`` later work on that stream sees the output, with ``async_op=True``
        the returned :class:`conccl.Work` orders it (``wait()``). SMs used: none. No host
        handshake with the peers: the call returns once its copies are queued.
        """
        comm = self._startable()
        if comm.executor.capturing():  # into a CUDA graph: a graph slot of its own (conccl.schedule.captured)
            return comm.capture_schedule(self._schedule, self._input, self._output, self._views, self._timeout_s)
        return comm.execute(self._schedule, self._input, self._output, async_op, self._timeout_s, self._views)

    def _startable(self):
        """The op's group, or InvalidArgument if the op is closed or a tensor moved."""
        comm = self._comm
        if comm is None or comm.closed:
            raise InvalidArgument(f"persistent {self.collective} #{self.op_id} is closed (or its group was destroyed); "
                                  "make a new one")
        if (self._input.data_ptr(), self._output.data_ptr()) != self._ptrs:
            raise InvalidArgument(
                f"persistent {self.collective} #{self.op_id}: a tensor moved since the op was made (resize_ or "
                "set_); its peers would reach the old memory. Make a new persistent op")
        return comm

    def close(self) -> None:
        """Drop the op's references (its tensors, its schedule). Local: no peer takes part.
        Closing its group closes it too."""
        self._comm = self._input = self._output = self._schedule = self._views = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"rank {self._comm.rank}/{self._comm.world}"
        return f"{type(self).__name__}(#{self.op_id} {self.collective}, {state})"


class HierarchicalPersistent(PersistentCollective):
    """A persistent collective on a group spanning hosts (:mod:`conccl.group.hierarchical`).

    Made by the same ``conccl.persistent_*`` functions. Made: validated and agreed with every
    rank of every host once (the cross-node descriptor exchange and the node-local board).
    :meth:`start` skips that agreement, the round trip between hosts that dominates a small
    call's host time, and runs the composition: the node-local steps are ordinary calls of the
    host's group (they still agree among the host's ranks and keep its watchdog), the
    cross-node steps are the backend's. Not capturable into a CUDA graph.
    """

    def __init__(self, group, op_id: int, coll, input, output, args: tuple, timeout_s: float, stream_mode,
                 flat: bool):
        super().__init__(group, op_id, coll, None, None, input, output, timeout_s, args)
        self._stream_mode, self._flat = stream_mode, flat
        # The composition re-reads the tensors' sizes on every start and no agreement checks
        # them again: a tensor resized in place (same address) must be refused here.
        self._agreed = _sizes(input, output)

    def start(self, async_op: bool = False):
        """Run the collective (stream semantics as :meth:`PersistentCollective.start`; a
        completed :class:`conccl.Work` either way, as a call on such a group returns)."""
        comm = self._startable()
        if _sizes(self._input, self._output) != self._agreed:
            raise InvalidArgument(f"persistent {self.collective} #{self.op_id}: a tensor's size or dtype changed since "
                                  "the op was made; make a new persistent op")
        comm.check_usable()
        if comm.node.executor.capturing():
            raise InvalidArgument(f"persistent {self.collective} #{self.op_id}: CUDA graph capture is not served on a "
                                  "group spanning hosts")
        return comm.run_agreed(self.coll, self._output, self._input, self.args, self._timeout_s, self._stream_mode,
                         self._flat)


def _sizes(input, output) -> tuple:
    return input.numel(), output.numel(), input.dtype, output.dtype
