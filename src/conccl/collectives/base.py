"""The Collective protocol: everything the rest of conccl knows about one collective.

A collective lives in one module of this package, as one instance of a :class:`Collective`
subclass in :data:`conccl.collectives.REGISTRY`. The group (validation, agreement with the
peers, planning), the CPU reference, the benchmark, the study, the planner and the runtime
ask it; none of them compares a collective's name.

What it answers, by who asks:

- the group, per call: :meth:`Collective.local` (validate this rank's arguments: what it sends
  and receives), :meth:`Collective.check` (do the peers' published arguments fit together?),
  :meth:`Collective.plan` (this rank's :class:`~conccl.schedule.base.Schedule`) and
  :meth:`Collective.plan_one_shot` (the same call as one small SM kernel, where it has one);
  the group's methods (``group.<api_name>``, ``group.persistent_<api_name>``) are made from
  :data:`~conccl.collectives.REGISTRY`;
- tests: :meth:`Collective.reference` (the expected output, computed with plain tensor ops);
- the benchmark, the study and the runtime: how to call it (:attr:`Collective.api_name`, the
  same function name in ``torch.distributed`` and in ``conccl``), the equal-chunk
  :class:`Layout` their buffers use, and its sizes (:meth:`Collective.input_bytes`,
  :meth:`Collective.bus_factor`, :meth:`Collective.hbm_bytes`).

Sizes: a collective's *size* is the bytes of its output on each rank (the convention of the
benchmark, the study and the planner, as in nccl-tests).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, Sequence

from ..errors import CollectiveError, InvalidArgument
from ..schedule.base import Algorithm, Schedule, StreamMode
from .direct import WORKSPACE_ALIGN


@dataclass(frozen=True)
class Layout:
    """Where each byte goes when every rank's buffers are cut into equal chunks.

    The input has ``input_chunks`` chunks, the output ``output_chunks``, all of
    ``size // output_chunks`` bytes. ``sources[c]`` names the (rank, input chunk) whose bytes
    output chunk ``c`` of this rank holds (several entries: their reduction, for reducing
    collectives). ``in_place_chunk``: the output chunk that can be this rank's input itself
    (no own-shard copy), or None.
    """

    input_chunks: int
    output_chunks: int
    sources: tuple[tuple[tuple[int, int], ...], ...]
    in_place_chunk: int | None = None

    def chunk_bytes(self, size: int) -> int:
        return size // self.output_chunks


@dataclass(frozen=True)
class LocalCall:
    """What validating one rank's arguments decided (:meth:`Collective.local`).

    ``send[p]`` / ``recv[p]``: bytes this rank sends to / receives from rank ``p``, published to
    the peers so every rank can check the call and derive the same plan. ``in_place``: the
    input is the output's own chunk. ``extra``: what the collective's :meth:`~Collective.plan`
    needs besides the peers' rows, as the collective's own frozen dataclass, read by field
    name (``AllGatherPlanArgs``, ...; None where the rows say it all). ``agreed``: a code
    every rank's call must have alike besides the collective and dtype (a reduction's op and
    factor), 0 when none.
    """

    send: tuple[int, ...]
    recv: tuple[int, ...]
    in_place: bool = False
    extra: object = None
    agreed: int = 0


@dataclass(frozen=True)
class PeerCalls:
    """Every rank's published call, as plain ints: ``send[src][dst]`` and ``recv[dst][src]``
    bytes, and each rank's whole input and output bytes."""

    send: tuple[tuple[int, ...], ...]
    recv: tuple[tuple[int, ...], ...]
    input_bytes: tuple[int, ...]
    output_bytes: tuple[int, ...]


class Collective(abc.ABC):
    """One collective. Subclasses set the class attributes and implement the abstract methods."""

    name: ClassVar[str]  # registry key; the spelling of the CLI, results files and profiles
    api_name: ClassVar[str]  # the function in torch.distributed and in conccl: (output, input, *args)
    # Names of the call's extra arguments after (output, input), as torch.distributed spells them.
    arg_names: ClassVar[tuple[str, ...]] = ()
    # Whether `conccl study` measures it and the planner has a model for it (its hardware
    # profile holds the collective's sweeps). A collective that is not yet studied still runs,
    # benchmarks and checks like every other; its default scenarios and plans wait for data.
    studied: ClassVar[bool] = True
    # torch.distributed's function takes one tensor, reduced in place (``all_reduce(tensor,
    # op)``); the group's call still takes (output, input, *args), in place when they are one.
    single_tensor: ClassVar[bool] = False
    # Whether it plans Algorithm.STAGED_PUSH (pushes into the peers' workspace, copied out there)
    staged_push: ClassVar[bool] = False
    # Whether a group's default algorithm (set_options) applies to it; False where its algorithm
    # is a choice by size that a default meant for the gathers would fix at every size.
    follows_group_default: ClassVar[bool] = True

    def plan_ignores_tensor_kinds(self, algorithm: Algorithm | None) -> bool:
        """Whether a call asking for ``algorithm`` (None: the automatic choice) plans from no
        rank's tensor kinds (peer-reachable, in place): its copies cross GPUs only into and out
        of the group workspace, so what the peers pass cannot change its plan, and a settled
        call may post its row whatever its tensors are (``Options.post_settled``)."""
        return False

    def own_chunk_via_peer(self, schedule: Schedule) -> Schedule:
        """``schedule`` with its same-GPU own-chunk copy (an SM kernel, which waits behind a
        running GEMM) replaced by copy-engine copies through a peer, where this collective
        can (``Options.own_chunk_via_peer``: a push all-gather); else ``schedule`` as it is.
        A rank's own choice: the peers' schedules do not change."""
        return schedule

    def plan_fixed_by_own_row(self, world: int) -> bool:
        """Whether this rank's board row and the check that the peers' agree with it fix every
        size this rank's plan reads: then a peer's row cannot change the plan without a
        mismatch (a group's settled calls may post their row, ``Options.post_settled``). True
        where every rank's chunks must be equal; an all-to-all's plan also reads what the
        peers send each other."""
        return True

    # ------------------------------------------------------------------ sizes
    @abc.abstractmethod
    def layout(self, world: int, rank: int) -> Layout:
        """The equal-chunk layout of this rank's buffers."""

    def bus_factor(self, world: int) -> float:
        """nccl-tests' bus-bandwidth factor: busbw = size / time * factor."""
        return (world - 1) / world

    def bandwidth_bytes(self, size: int, world: int) -> int:
        """The bytes nccl-tests divides by the time for algbw (its "size" column) for a call of
        ``size`` output bytes per rank: the output, but for a reduce-scatter (its input)."""
        return size

    def input_bytes(self, size: int, world: int) -> int:
        """Input bytes per rank for ``size`` output bytes per rank (equal chunks)."""
        lay = self.layout(world, 0)
        return lay.chunk_bytes(size) * lay.input_chunks

    def graph_workspace_bytes(self, size: int, world: int, staged_push: bool = False) -> int:
        """An upper bound of the graph workspace (:func:`conccl.reserve_graph_workspace`) one
        captured call of ``size`` output bytes per rank takes, run as it runs by default or,
        ``staged_push``, with ``Algorithm.STAGED_PUSH``: its input's bytes, each peer's slot
        rounded up to 256 bytes."""
        return self.input_bytes(size, world) + world * WORKSPACE_ALIGN

    def in_place(self, world: int) -> bool:
        """Whether the benchmark and the study run it in place (as FSDP gathers parameters)."""
        return self.layout(world, 0).in_place_chunk is not None

    def buffer_bytes(self, size: int, world: int) -> int:
        """Device bytes its buffers take per rank, run as the study runs it."""
        return size + (0 if self.in_place(world) else self.input_bytes(size, world))

    def hbm_bytes(self, size: int, world: int) -> int:
        """Bytes one rank's HBM reads and writes in the collective, run as the study runs it.

        Every chunk from a peer is written here and every chunk sent is read here; the own
        chunk, unless in place, is read and written once more."""
        lay = self.layout(world, 0)
        chunk = lay.chunk_bytes(size)
        remote = sum(1 for srcs in lay.sources for (r, _) in srcs if r != 0)
        own = 0 if lay.in_place_chunk is not None else sum(1 for srcs in lay.sources for (r, _) in srcs if r == 0)
        return 2 * remote * chunk + 2 * own * chunk

    # ------------------------------------------------------------------ a call
    @abc.abstractmethod
    def local(self, output, input, args: tuple, world: int, rank: int, device_type: str) -> LocalCall:
        """Validate this rank's arguments (raise :class:`~conccl.errors.InvalidArgument`);
        ``args`` are the call's extra arguments in :attr:`arg_names` order."""

    def check(self, peers: PeerCalls, rank: int, seq: int) -> None:
        """Raise :class:`~conccl.errors.CollectiveError` (on every rank alike: it sees the same
        rows) unless the peers' calls fit together. The group has already checked that every
        rank made this collective with the same dtype."""
        w = len(peers.send)
        for src in range(w):
            for dst in range(w):
                if peers.send[src][dst] != peers.recv[dst][src]:
                    raise CollectiveError(
                        f"conccl {self.name} (sequence number {seq}): rank {src} sends {peers.send[src][dst]} bytes "
                        f"to rank {dst}, but rank {dst} expects {peers.recv[dst][src]} bytes from rank {src}; "
                        "nothing was moved")

    def algorithm(self, requested: Algorithm | None, output_symmetric: bool, call: LocalCall | None = None,
                  world: int = 0) -> Algorithm:
        """The algorithm a call runs (``requested``: the caller's or the group's; None: choose,
        from what every rank agrees on: ``call``, this rank's validated call, and ``world``).
        Raise :class:`~conccl.errors.InvalidArgument` for one it cannot run. By default push
        where every rank's output is peer-reachable (measured fastest on H200), else pull."""
        if requested is None:
            return Algorithm.PUSH if output_symmetric else Algorithm.PULL
        if requested is Algorithm.PUSH and not output_symmetric:
            raise InvalidArgument("Algorithm.PUSH needs every rank's output allocated with conccl.empty")
        if requested is Algorithm.STAGED_PUSH and not self.staged_push:
            raise InvalidArgument(f"{self.api_name} has no Algorithm.STAGED_PUSH")
        return requested

    @abc.abstractmethod
    def plan(self, world: int, rank: int, local: LocalCall, peers: PeerCalls, *, algorithm: Algorithm,
             stream_mode: StreamMode, input_symmetric: bool, output_symmetric: bool,
             peers_in_place: bool) -> Schedule:
        """This rank's schedule (a pure function; cache it)."""

    def plan_one_shot(self, world: int, rank: int, local: LocalCall, peers: PeerCalls) -> Schedule | None:
        """This rank's one-shot schedule of the call (:mod:`conccl.collectives.one_shot`: one
        kernel of one CTA), from what every rank agrees on, or None where there is none (this
        collective, a world the kernel does not serve: :func:`~conccl.collectives.one_shot.serves`).
        A pure function; the group runs it where every rank's call would."""
        return None

    def call_with(self, lib, output, input, args: tuple = (), **kwargs):
        """Call ``lib.<api_name>`` (``torch.distributed``'s or ``conccl``'s, which share names
        and arguments) on (output, input, *args). A single-tensor collective runs in place on
        ``output``, after copying ``input`` into it unless they are one tensor."""
        fn = getattr(lib, self.api_name)
        # conccl's functions take None for "the default" (op=None is SUM), torch.distributed's
        # refuse it (AllreduceOptions.reduceOp = None raises): leave trailing Nones to lib's defaults.
        args = tuple(args)
        while args and args[-1] is None:
            args = args[:-1]
        if self.single_tensor:
            if output is not input:
                output.copy_(input)
            return fn(output, *args, **kwargs)
        return fn(output, input, *args, **kwargs)

    # ------------------------------------------------------------------ reference
    @abc.abstractmethod
    def reference(self, inputs: Sequence, rank: int, args: Sequence[tuple] | None = None):
        """The output ``rank`` must hold when rank ``r`` passed ``inputs[r]`` (and ``args[r]``)."""

    def __repr__(self) -> str:
        return f"<collective {self.name}>"
