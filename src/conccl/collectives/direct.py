"""The direct algorithm over a full mesh, shared by every copy-engine collective.

Each rank exchanges one transfer with each peer (possibly empty), so a collective is fully
described by its per-peer transfers, an optional staging copy and an optional own-shard copy.
This module turns those into a :class:`~conccl.schedule.base.Schedule` with the signal protocol
of ``conccl.schedule.base`` and the chosen stream mapping.
"""
from __future__ import annotations

from ..schedule.base import (
    Algorithm,
    Buf,
    Copy,
    Op,
    Phase,
    Schedule,
    SetSignal,
    Signal,
    StreamMode,
    Transfer,
    WaitSignal,
    double_buffer,
    release_ops,
    FREE_WAIT_DELTA,
)


WORKSPACE_ALIGN = 256  # bytes: where each peer's slot starts in the workspace


def workspace_slot(nbytes: int) -> int:
    """Bytes of a workspace slot holding ``nbytes``: rounded up to :data:`WORKSPACE_ALIGN`, so
    that every slot starts aligned and a reduction reads whole 16-byte vectors."""
    return -(-nbytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN


def peer_order(world: int, rank: int) -> list[int]:
    """Peers starting with rank+1, so that no GPU is every rank's first source or target."""
    return [(rank + step) % world for step in range(1, world)]


def number_slots(slots) -> tuple:
    """The non-empty slots, numbered, with each transfer's slot recorded in it."""
    return tuple(
        tuple(Copy(op.transfer.in_slot(k)) if isinstance(op, Copy) else op for op in ops)
        for k, ops in enumerate(s for s in slots if s)
    )


def build_direct_schedule(
    collective: str,
    world: int,
    rank: int,
    *,
    algorithm: Algorithm,
    stream_mode: StreamMode,
    peer_transfers: dict[int, Transfer | None],
    stage: Transfer | None,
    local: Transfer | None,
    staged: bool,
    workspace_bytes: int,
    wait_done: bool | None = None,
    finish: tuple[Op, ...] = (),
    into_workspace: bool = False,
) -> Schedule:
    """Assemble one rank's schedule.

    ``peer_transfers[p]`` is the transfer exchanged with peer ``p`` (None when it is empty);
    its slot is assigned here. ``staged``: the call uses the group workspace (a pull stages
    its input there). Up to :data:`~conccl.schedule.base.DOUBLE_BUFFER_MAX_BYTES` it uses its own
    half (double-buffered, see :mod:`conccl.schedule.base`: no wait guards the staging, the
    release of the previous call did) and ends when its own copies have; a larger call takes
    the whole workspace the long way (waits for DONE(s-1) first and for DONE(s) last). Without
    staging, a pull reads the caller's own symmetric input, so the call ends only once every
    peer has read it (DONE >= s); a push writes into peers' outputs, so the call ends once
    every peer has written (DONE >= s).

    ``into_workspace``: the peer transfers write into the peers' workspace (a reduce-scatter):
    each waits for the peer's FREE (sent during the previous call) instead of a READY of this
    one, so no READY is sent. ``wait_done`` overrides the end rule (None: wait for DONE >= s
    unless staged): a collective that consumes what peers wrote needs it. ``finish``: ops run
    on slot 0 after every wait, e.g. a reduction of what peers wrote.

    Every schedule makes the release (:func:`~conccl.schedule.base.release_ops`) where it costs
    nothing in steady state: after the waits for READY(s) (which a peer writes after its
    DONE(s-1)), after the waits for DONE(s), or, into the workspace, first (the previous
    call of a reduce-scatter loop waited for DONE(s-1) already).
    """
    peers = peer_order(world, rank)
    double = staged and double_buffer(workspace_bytes)
    whole = staged and not double  # the whole workspace, guarded the long way (conccl.schedule.base)
    into_workspace = into_workspace and double  # a whole call's pushes wait for READY
    pre: list[Op] = [WaitSignal(p, Signal.DONE, -1) for p in peers] if whole else []
    if stage is not None:
        pre.append(Copy(stage))
    if not into_workspace:
        pre += [SetSignal(p, Signal.READY) for p in peers]
    awaits_done = whole or ((not staged) if wait_done is None else wait_done)
    post: list[Op] = [WaitSignal(p, Signal.DONE) for p in peers] if awaits_done else []

    def gate(p) -> WaitSignal:
        return WaitSignal(p, Signal.FREE, FREE_WAIT_DELTA) if into_workspace else WaitSignal(p, Signal.READY)

    def copy(t: Transfer | None) -> list[Op]:
        return [] if t is None else [Copy(t)]

    if stream_mode is StreamMode.PER_PEER:
        if whole:  # freed only once its own reads (the finish) are over too
            head = pre + post + list(finish) + release_ops(peers, done_awaited=True)
        elif into_workspace:
            head = release_ops(peers) + pre + post + list(finish)
        elif awaits_done:
            head = pre + post + release_ops(peers, done_awaited=True) + list(finish)
        else:
            head = pre + release_ops(peers) + list(finish)
        slots: list[list[Op]] = [head]
        for p in peers:
            slots.append([gate(p), *copy(peer_transfers.get(p)), SetSignal(p, Signal.DONE)])
        slots.append(copy(local))
    else:
        # One stream: every wait first, then every peer copy back to back (a batch when
        # StreamMode.BATCH), the own shard last so that a same-GPU copy never delays a peer.
        gates = [gate(p) for p in peers]
        if whole:
            ops: list[Op] = pre + gates
        elif into_workspace:
            ops = release_ops(peers) + pre + gates
        else:
            ops = pre + gates + release_ops(peers)
        for p in peers:
            ops += copy(peer_transfers.get(p))
        ops += [SetSignal(p, Signal.DONE) for p in peers]
        ops += copy(local) + post + list(finish)
        if whole:
            ops += release_ops(peers, done_awaited=True)
        slots = [ops]

    numbered = number_slots(slots)
    return Schedule(
        collective=collective,
        world=world,
        rank=rank,
        slots=numbered,
        algorithm=algorithm,
        stream_mode=stream_mode,
        staged=staged,
        workspace_bytes=workspace_bytes,
        double_buffered=double,
    )


def build_staged_push_schedule(collective: str, world: int, rank: int, nbytes: int, stream_mode: StreamMode,
                               finish, local: Transfer | None = None) -> Schedule:
    """A staged push (``Algorithm.STAGED_PUSH``: an all-gather's, an all-reduce's one pass):
    each rank pushes its whole ``nbytes`` input into slot ``rank`` of every peer's workspace
    (slots of :func:`workspace_slot`), each push gated by that peer's FREE of an earlier call,
    sends DONE, and runs ``finish(slot)`` (ops reading the slots its peers filled) on slot 0
    once every peer's DONE came: the reduce-scatter's protocol (``into_workspace``), one
    signal on the critical path, no tensor need be peer-reachable. ``local``: an own-shard
    copy. Workspace: ``world`` slots."""
    slot = workspace_slot(nbytes)
    peers: dict[int, Transfer | None] = {
        p: Transfer(rank, Buf.INPUT, 0, p, Buf.WORKSPACE, rank * slot, nbytes, 0, Phase.PEER)
        for p in range(world) if p != rank and nbytes}
    return build_direct_schedule(
        collective, world, rank, algorithm=Algorithm.STAGED_PUSH, stream_mode=stream_mode, peer_transfers=peers,
        stage=None, local=local, staged=True, workspace_bytes=world * slot if nbytes and world > 1 else 0,
        wait_done=True, finish=tuple(finish(slot)) if nbytes else (), into_workspace=True)
