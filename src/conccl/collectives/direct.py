"""The direct algorithm over a full mesh, shared by every copy-engine collective.

Each rank exchanges one transfer with each peer (possibly empty), so a collective is fully
described by its per-peer transfers, an optional staging copy and an optional own-shard copy.
This module turns those into a :class:`~conccl.schedule.Schedule` with the signal protocol
of ``conccl.schedule`` and the chosen stream mapping.
"""
from __future__ import annotations

from dataclasses import replace

from ..schedule import (
    Algorithm,
    Copy,
    Op,
    Schedule,
    SetSignal,
    Signal,
    StreamMode,
    Transfer,
    WaitSignal,
)


def peer_order(world: int, rank: int) -> list[int]:
    """Peers starting with rank+1, so that no GPU is every rank's first source or target."""
    return [(rank + step) % world for step in range(1, world)]


def number_slots(slots) -> tuple:
    """The non-empty slots, numbered, with each transfer's slot recorded in it."""
    return tuple(
        tuple(Copy(replace(op.transfer, slot=k)) if isinstance(op, Copy) else op for op in ops)
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
) -> Schedule:
    """Assemble one rank's schedule.

    ``peer_transfers[p]`` is the transfer exchanged with peer ``p`` (None when it is empty);
    its slot is assigned here. ``staged`` says the input goes through the group workspace,
    which is reused across calls: before the staging copy of call s overwrites it, every peer
    must have finished reading it in call s-1 (DONE >= s-1). Without staging, a pull reads the
    caller's own symmetric input, so the call ends only once every peer has read it (DONE >= s);
    a push writes into peers' outputs, so the call ends once every peer has written (DONE >= s).

    ``wait_done`` overrides that last rule (None: wait for DONE >= s unless staged): a
    collective that reuses the workspace *and* consumes what peers wrote needs both waits.
    ``finish``: ops run on slot 0 after every wait, e.g. a reduction of what peers wrote.
    """
    peers = peer_order(world, rank)
    pre: list[Op] = []
    post: list[Op] = []
    if staged:
        pre += [WaitSignal(p, Signal.DONE, -1) for p in peers]
    if stage is not None:
        pre.append(Copy(stage))
    pre += [SetSignal(p, Signal.READY) for p in peers]
    if (not staged) if wait_done is None else wait_done:
        post += [WaitSignal(p, Signal.DONE) for p in peers]
    post += list(finish)

    def copy(t: Transfer | None) -> list[Op]:
        return [] if t is None else [Copy(t)]

    if stream_mode is StreamMode.PER_PEER:
        slots: list[list[Op]] = [pre + post]
        for p in peers:
            slots.append([WaitSignal(p, Signal.READY), *copy(peer_transfers.get(p)), SetSignal(p, Signal.DONE)])
        slots.append(copy(local))
    else:
        # One stream: every wait first, then every peer copy back to back (a batch when
        # StreamMode.BATCH), the own shard last so that a same-GPU copy never delays a peer.
        ops: list[Op] = pre + [WaitSignal(p, Signal.READY) for p in peers]
        for p in peers:
            ops += copy(peer_transfers.get(p))
        ops += [SetSignal(p, Signal.DONE) for p in peers]
        ops += copy(local) + post
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
    )
