"""The board row a call publishes: its fields, its flag bits, how it is built and read.

Every call of a :class:`~conccl.group.Group` publishes one row of int64 words on the host
board (:class:`~conccl.group.board.HostBoard`) and reads every peer's: :data:`NFIXED` fixed
fields, then the bytes this rank sends to and receives from each rank (``2 * world`` words)::

    SEQ COLL DTYPE IN_BYTES OUT_BYTES FLAGS ALGO IN_OFF OUT_OFF ARG IN_BLK OUT_BLK | send[0..w) recv[0..w)

- ``SEQ``: the call's sequence number (written per call); ``COLL``, ``DTYPE``, ``ALGO``:
  :func:`code` of the collective's name, the dtype and the algorithm asked for (-1: automatic);
- ``IN_BYTES`` / ``OUT_BYTES``: the whole input and output bytes;
- ``FLAGS``: :data:`FLAG_SYM_IN` ... :data:`FLAG_ONE_SHOT`;
- ``IN_OFF`` / ``OUT_OFF``: the tensor's byte offset in its peer-reachable allocation (-1:
  none), so a peer is reached at its own view, whatever offset each rank sliced;
- ``ARG``: the collective's own code that every rank must have alike (``LocalCall.agreed``: a
  reduction's op and factor);
- ``IN_BLK`` / ``OUT_BLK``: which of the group's peer-mapped allocations holds the tensor (the
  executor numbers them in registration order, alike on every rank; -1: none). A rank reaches
  a peer's tensor through its own mapping of that allocation, so the ranks must name the same
  one: where they do not (FSDP's pool handed out blocks in another order on one rank, or a
  user passed tensors from different ``conccl.empty`` calls), the call stages through the
  workspace instead, as for tensors no peer can reach.

Pure functions of plain ints and int64 arrays (``rows``: ``world x row length``, rank order);
nothing here reads a board.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch

from ..collectives import REGISTRY, LocalCall, PeerCalls
from ..schedule.base import Algorithm

__all__ = ["SEQ", "COLL", "DTYPE", "IN_BYTES", "OUT_BYTES", "FLAGS", "ALGO", "IN_OFF", "OUT_OFF", "ARG", "IN_BLK",
           "OUT_BLK", "NFIXED", "FLAG_SYM_IN", "FLAG_SYM_OUT", "FLAG_IN_PLACE", "FLAG_GRAPH", "FLAG_ONE_SHOT",
           "code", "board_row_len", "tensor_flags", "build_row", "agreed_fields", "peer_calls", "all_flags",
           "peer_views", "describe"]

(SEQ, COLL, DTYPE, IN_BYTES, OUT_BYTES, FLAGS, ALGO, IN_OFF, OUT_OFF, ARG, IN_BLK, OUT_BLK, NFIXED) = range(13)

FLAG_SYM_IN, FLAG_SYM_OUT = 1, 2  # the input / output is peer-reachable (a conccl.empty tensor)
FLAG_IN_PLACE = 4  # the input is the output's own chunk (or the output itself)
FLAG_GRAPH = 8  # the call is being captured into a graph
FLAG_ONE_SHOT = 16  # this rank would run the call one-shot: it does where every rank would (an AND)


def code(text: str) -> int:
    """The word a name takes in a row (a collective's, a dtype's, an algorithm's)."""
    return zlib.crc32(text.encode())


def board_row_len(world: int) -> int:
    """Words of a call's row on a board of ``world`` ranks."""
    return NFIXED + 2 * world


def tensor_flags(views, in_place: bool) -> int:
    """The flags of a call whose (input, output) peer views are ``views`` (None: not
    peer-reachable). An in-place input is reached through the output, at another offset on
    every rank, so it never counts as peer-reachable itself."""
    return (FLAG_SYM_IN * (views[0] is not None and not in_place) | FLAG_SYM_OUT * (views[1] is not None)
            | FLAG_IN_PLACE * in_place)


def build_row(coll_name: str, dtype, in_bytes: int, out_bytes: int, views, algorithm: Algorithm | None,
              call: LocalCall) -> list:
    """The row of a validated ``call`` (sequence number 0, no one-shot flag: both written per
    call). ``views``: the executor's peer views of (input, output), each (bases, offset,
    block) or None; ``algorithm``: the one the row names (None: automatic)."""
    return [0, code(coll_name), code(str(dtype)), in_bytes, out_bytes, tensor_flags(views, call.in_place),
            -1 if algorithm is None else code(algorithm.value),
            -1 if views[0] is None else views[0][1], -1 if views[1] is None else views[1][1],
            call.agreed, -1 if views[0] is None else views[0][2], -1 if views[1] is None else views[1][2],
            *call.send, *call.recv]


def agreed_fields(fixed_row: list) -> tuple:
    """The fields of one call's row that every rank's must hold equal: sequence number,
    collective, dtype, algorithm, the collective's agreed code, and whether it is captured."""
    return (fixed_row[SEQ], fixed_row[COLL], fixed_row[DTYPE], fixed_row[ALGO], fixed_row[ARG],
            fixed_row[FLAGS] & FLAG_GRAPH)


def peer_calls(rows, world: int) -> PeerCalls:
    """What every rank's row says it sends and receives."""
    splits = rows[:, NFIXED:NFIXED + 2 * world].tolist()  # plain ints: cheaper than numpy scalars
    return PeerCalls(send=tuple(tuple(r[:world]) for r in splits), recv=tuple(tuple(r[world:]) for r in splits),
                     input_bytes=tuple(rows[:, IN_BYTES].tolist()), output_bytes=tuple(rows[:, OUT_BYTES].tolist()))


def all_flags(rows) -> int:
    """Flags set on every rank (an AND over ranks); a tensor is peer-reachable only where every
    rank names the same mapped allocation for it."""
    flags = int(np.bitwise_and.reduce(rows[:, FLAGS]))
    for flag, field in ((FLAG_SYM_IN, IN_BLK), (FLAG_SYM_OUT, OUT_BLK)):
        if (rows[:, field] != rows[0, field]).any():
            flags &= ~flag
    return flags


def peer_views(views, rows, flags: int) -> tuple:
    """The executor's (peer bases, own offset) views with every rank's offset instead of the own:
    ((bases, (offset of rank 0, ...)), ...), None where some rank's tensor is not peer-reachable
    (``flags``: :func:`all_flags` of ``rows``)."""
    out = []
    for view, flag, field in ((views[0], FLAG_SYM_IN, IN_OFF), (views[1], FLAG_SYM_OUT, OUT_OFF)):
        out.append((view[0], tuple(rows[:, field].tolist())) if view is not None and flags & flag else None)
    return tuple(out)


def describe(field: int, value, dtype) -> str:
    """Row field ``field``'s ``value`` in words: a dtype, collective or algorithm by name."""
    if field == DTYPE:
        names = {code(str(d)): str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}
        return names.get(int(value), f"dtype#{int(value)}")
    if field == COLL:
        return {code(n): n for n in REGISTRY}.get(int(value), f"collective#{int(value)}")
    if field == ALGO:
        return {code(a.value): a.value for a in Algorithm}.get(int(value), "automatic")
    return str(int(value))
