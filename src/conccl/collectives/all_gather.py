"""All-gather: every rank's ``nbytes`` input lands at offset ``rank * nbytes`` of every output."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from ..errors import CollectiveError
from ..schedule.base import Algorithm, Buf, Copy, Phase, Schedule, StreamMode, Transfer
from ..validate import InvalidArgument, byte_range, check_pair, overlaps
from .base import Collective, Layout, LocalCall, PeerCalls
from .direct import WORKSPACE_ALIGN, build_direct_schedule, build_staged_push_schedule, number_slots, peer_order
from .one_shot import build_one_shot, serves as one_shot_serves

NAME = "all_gather"


@dataclass(frozen=True)
class AllGatherPlanArgs:
    """What an all-gather's plan needs besides the peers' rows (``LocalCall.extra``): the
    bytes each rank contributes, and whether this rank's input is its output's own chunk."""

    nbytes: int
    in_place: bool


@lru_cache(maxsize=1024)
def plan_all_gather(
    world: int,
    rank: int,
    nbytes: int,
    *,
    algorithm: Algorithm = Algorithm.PULL,
    stream_mode: StreamMode = StreamMode.PER_PEER,
    input_symmetric: bool = False,
    output_symmetric: bool = False,
    in_place: bool = False,
    peers_in_place: bool = False,
) -> Schedule:
    """Schedule of one rank's all-gather of ``nbytes`` per rank (a pure, cached function).

    ``in_place``: this rank's input is its output's ``rank``-th chunk, so there is no own-shard
    copy. ``peers_in_place``: every rank's is, so with a symmetric output a pull reads each
    peer's chunk straight from the peer's output. Otherwise PULL reads peers' symmetric inputs
    or, if any rank's input is not symmetric, the group workspace they were staged into. PUSH
    writes into peers' outputs, which must be symmetric.
    """
    if not 0 <= rank < world:
        raise InvalidArgument(f"rank {rank} outside a world of {world}")
    if algorithm is Algorithm.STAGED_PUSH:
        return _plan_staged_push(world, rank, nbytes, stream_mode, in_place)
    if algorithm is Algorithm.PUSH and not output_symmetric:
        raise InvalidArgument("push all-gather needs a peer-reachable output (allocate it with conccl.empty)")
    from_output = peers_in_place and output_symmetric
    src_symmetric = input_symmetric or from_output
    staged = algorithm is Algorithm.PULL and not src_symmetric and world > 1
    peers: dict[int, Transfer | None] = {}
    for p in range(world):
        if p == rank or nbytes == 0:
            continue
        if algorithm is Algorithm.PULL:
            if staged:
                src = (p, Buf.WORKSPACE, 0)
            elif from_output:
                src = (p, Buf.OUTPUT, p * nbytes)
            else:
                src = (p, Buf.INPUT, 0)
            peers[p] = Transfer(*src, rank, Buf.OUTPUT, p * nbytes, nbytes, 0, Phase.PEER)
        else:
            peers[p] = Transfer(rank, Buf.INPUT, 0, p, Buf.OUTPUT, rank * nbytes, nbytes, 0, Phase.PEER)
    stage = Transfer(rank, Buf.INPUT, 0, rank, Buf.WORKSPACE, 0, nbytes, 0, Phase.STAGE) if staged and nbytes else None
    local = None
    if not in_place and nbytes:
        local = Transfer(rank, Buf.INPUT, 0, rank, Buf.OUTPUT, rank * nbytes, nbytes, 0, Phase.LOCAL)
    return build_direct_schedule(
        NAME, world, rank,
        algorithm=algorithm, stream_mode=stream_mode, peer_transfers=peers,
        stage=stage, local=local, staged=staged, workspace_bytes=nbytes if staged else 0,
    )


@lru_cache(maxsize=1024)
def plan_one_shot_all_gather(world: int, rank: int, nbytes: int, in_place: bool) -> Schedule:
    """One rank's one-shot all-gather (:mod:`conccl.collectives.one_shot`): every rank stages
    its ``nbytes`` and reads each peer's into chunk p (its own from its input, unless in place)."""
    pieces = {p: (0, p * nbytes, 0 if (p == rank and in_place) else nbytes) for p in range(world)}
    return build_one_shot(NAME, world, rank, nbytes, pieces)


def _plan_staged_push(world: int, rank: int, nbytes: int, stream_mode: StreamMode, in_place: bool) -> Schedule:
    """Algorithm.STAGED_PUSH (:func:`~conccl.collectives.direct.build_staged_push_schedule`):
    the slots the peers filled copied into the output once their DONE came; a same-GPU copy of
    what lands, for a protocol with one signal on the critical path and no tensor that need be
    peer-reachable."""
    def copy_out(slot):
        return [Copy(Transfer(rank, Buf.WORKSPACE, p * slot, rank, Buf.OUTPUT, p * nbytes, nbytes, 0, Phase.LOCAL))
                for p in range(world) if p != rank]

    local = None
    if not in_place and nbytes:
        local = Transfer(rank, Buf.INPUT, 0, rank, Buf.OUTPUT, rank * nbytes, nbytes, 0, Phase.LOCAL)
    return build_staged_push_schedule(NAME, world, rank, nbytes, stream_mode, copy_out, local)


def check_all_gather(output, input, world: int, rank: int, device_type: str) -> bool:
    """Validate arguments; return True when the call is in place (input is output's own chunk)."""
    check_pair(output, input, device_type)
    if output.numel() != world * input.numel():
        raise InvalidArgument(
            f"all_gather_into_tensor: output has {output.numel()} elements, expected world_size ({world}) x "
            f"input ({input.numel()}) = {world * input.numel()}"
        )
    if not overlaps(output, input):
        return False
    chunk = input.numel() * input.element_size()
    offset = byte_range(input)[0] - byte_range(output)[0]
    if offset != rank * chunk:
        raise InvalidArgument(
            f"input overlaps output but is not its chunk for rank {rank} (byte offset {offset}, expected {rank * chunk})"
        )
    return True


class AllGather(Collective):
    """``all_gather_into_tensor(output, input)``: rank r's input lands in chunk r of every output."""

    name = NAME
    api_name = "all_gather_into_tensor"
    staged_push = True

    def layout(self, world: int, rank: int) -> Layout:
        return Layout(1, world, tuple(((src, 0),) for src in range(world)), in_place_chunk=rank)

    def plan_ignores_tensor_kinds(self, algorithm) -> bool:
        return algorithm is Algorithm.STAGED_PUSH  # into the peers' workspace, copied out there

    def graph_workspace_bytes(self, size: int, world: int, staged_push: bool = False) -> int:
        # a staged push lands every peer's input in a slot of the workspace: the output's bytes
        return (size if staged_push else self.input_bytes(size, world)) + world * WORKSPACE_ALIGN

    def own_chunk_via_peer(self, schedule: Schedule) -> Schedule:
        return own_chunk_via_peer(schedule)

    def local(self, output, input, args, world, rank, device_type) -> LocalCall:
        in_place = check_all_gather(output, input, world, rank, device_type)
        return self.local_for(input.numel() * input.element_size(), world, in_place)

    def local_for(self, nbytes: int, world: int, in_place: bool = False) -> LocalCall:
        """The validated call of an all-gather of ``nbytes`` per rank (``in_place``: the input
        is the output's own chunk), as :meth:`local` makes it from tensors."""
        return LocalCall((nbytes,) * world, (nbytes,) * world, in_place, AllGatherPlanArgs(nbytes, in_place))

    def check(self, peers: PeerCalls, rank: int, seq: int) -> None:
        mine = peers.input_bytes[rank]
        bad = [p for p, n in enumerate(peers.input_bytes) if n != mine]
        if bad:
            raise CollectiveError(
                f"conccl all_gather (sequence number {seq}): rank {bad[0]} contributes {peers.input_bytes[bad[0]]} "
                f"bytes, rank {rank} {mine}; every rank must pass the same input size; nothing was moved")

    def plan(self, world, rank, local, peers, *, algorithm, stream_mode, input_symmetric, output_symmetric,
             peers_in_place) -> Schedule:
        args = local.extra
        return plan_all_gather(world, rank, args.nbytes, algorithm=algorithm, stream_mode=stream_mode,
                               input_symmetric=input_symmetric, output_symmetric=output_symmetric,
                               in_place=args.in_place, peers_in_place=peers_in_place)

    def plan_one_shot(self, world, rank, local, peers) -> Schedule | None:
        args = local.extra
        if not one_shot_serves(world):
            return None
        return plan_one_shot_all_gather(world, rank, args.nbytes, args.in_place)

    def reference(self, inputs, rank, args=None):
        import torch  # tests and checks only: the plans above stay importable without torch

        return torch.cat([t.reshape(-1) for t in inputs])


ALL_GATHER = AllGather()


def own_chunk_via_peer(schedule: Schedule) -> Schedule:
    """``schedule``, a push all-gather's, with its own chunk read back by a copy engine from
    the first peer's output instead of copied on this GPU (``Options.own_chunk_via_peer``).

    Why: a same-GPU copy is an SM kernel by every route (docs/results.md, "Latency beside a
    running GEMM"),
    so beside a GEMM that holds every SM it waits until the GEMM ends (~1 ms beside an 8192^3
    bf16 GEMM), and with it the call. A push has just written this rank's input into chunk
    ``rank`` of every peer's output; reading it back from one of them is a peer copy, which
    a copy engine runs whatever the SMs do. It costs the chunk once more over the link from
    that peer, and one copy before the DONE that peer waits for (on one stream, after every
    push and before every DONE).

    Safe because the read-back sits between the push (same stream, before it) and the DONE
    that tells the peer this rank no longer touches its memory: the peer's call, and any reuse
    of its output, waits for that DONE. So it is this rank's choice alone, agreed with nobody:
    the peers' schedules are unchanged. Unchanged here: not a push, in place (no own copy), a
    world of one or an empty chunk."""
    rank, world = schedule.rank, schedule.world
    if schedule.algorithm is not Algorithm.PUSH or world < 2 or schedule.parts:
        return schedule
    own = [op for ops in schedule.slots for op in ops
           if isinstance(op, Copy) and op.transfer.phase is Phase.LOCAL and op.transfer.src is Buf.INPUT]
    if len(own) != 1:
        return schedule
    t = own[0].transfer
    via = peer_order(world, rank)[0]
    slots = []
    for ops in schedule.slots:
        out = [op for op in ops if op is not own[0]]
        if any(isinstance(op, Copy) and op.transfer.src_rank == rank and op.transfer.dst_rank == via for op in out):
            # after every copy of the slot (one stream: the pushes to every peer go first) and
            # before any signal that follows them (the DONE to ``via`` among them)
            at = max(i for i, op in enumerate(out) if isinstance(op, Copy)) + 1
            out.insert(at, Copy(Transfer(via, Buf.OUTPUT, t.dst_offset, rank, Buf.OUTPUT, t.dst_offset, t.nbytes, 0,
                                         Phase.PEER)))
        slots.append(out)
    return dataclasses.replace(schedule, slots=number_slots(slots))


def into_parts(schedule: Schedule, chunk: int, parts: tuple[tuple[int, int, int], ...]) -> Schedule:
    """``schedule``, an all-gather of ``chunk`` bytes per rank, with every byte that would land
    in this rank's output sent to *parts* instead (FSDP's per-parameter tensors, with no
    copy-out after): part ``i`` = (``off``, ``n``, ``dst``) takes bytes [off, off + n) of every
    rank's chunk, rank r's at output offset ``dst + r * n`` (the caller names as the output the
    part with the lowest address, so every offset is >= 0). Peer copies keep their slot and
    signals; the own chunk's parts come from the input where the schedule had no own copy (in
    place). A pure function of plain data, as the plans are."""
    if schedule.algorithm is not Algorithm.PULL:
        raise InvalidArgument("into_parts retargets a pull all-gather (a push writes into the peers' outputs)")
    rank = schedule.rank
    covered = False
    slots, last = [], None  # last: (slot, index) just after the last retargeted copy
    for k, ops in enumerate(schedule.slots):
        out = []
        for op in ops:
            t = op.transfer if isinstance(op, Copy) else None
            if t is None or t.dst is not Buf.OUTPUT or t.dst_rank != rank:
                out.append(op)
                continue
            r, within = divmod(t.dst_offset, chunk)
            covered |= r == rank
            for off, n, dst in parts:
                a, b = max(within, off), min(within + t.nbytes, off + n)
                if a < b:
                    out.append(Copy(dataclasses.replace(t, src_offset=t.src_offset + a - within, dst_offset=dst + r * n + a - off,
                                                        nbytes=b - a)))
            last = (k, len(out))
        slots.append(out)
    if not covered:
        # Beside the peer copies (one batch where the stream mode batches), not behind the waits
        # that end the call: the own chunk needs no peer.
        slots = slots or [[]]  # a world of one has no slot yet
        k, i = last if last is not None else (len(slots) - 1, len(slots[-1]))
        slots[k][i:i] = [Copy(Transfer(rank, Buf.INPUT, off, rank, Buf.OUTPUT, dst + rank * n, n, k, Phase.LOCAL))
                         for off, n, dst in parts if n]
    return dataclasses.replace(schedule, slots=tuple(tuple(s) for s in slots), parts=True)
