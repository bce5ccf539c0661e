"""All-to-all: rank ``src`` sends chunk ``dst`` of its input to rank ``dst``, which stores the
chunks in source order. Sizes are a ``world x world`` byte matrix ``m[src][dst]``."""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from ..schedule.base import Algorithm, Buf, Phase, Schedule, StreamMode, Transfer
from ..validate import InvalidArgument, check_pair, check_splits, overlaps
from .base import Collective, Layout, LocalCall, PeerCalls
from .direct import build_direct_schedule
from .one_shot import build_one_shot, serves as one_shot_serves

NAME = "all_to_all"

SplitMatrix = tuple[tuple[int, ...], ...]


def equal_split_matrix(world: int, chunk_bytes: int) -> SplitMatrix:
    return tuple((chunk_bytes,) * world for _ in range(world))


@lru_cache(maxsize=1024)
def plan_all_to_all(
    world: int,
    rank: int,
    matrix: SplitMatrix,
    *,
    algorithm: Algorithm = Algorithm.PULL,
    stream_mode: StreamMode = StreamMode.PER_PEER,
    input_symmetric: bool = False,
    output_symmetric: bool = False,
) -> Schedule:
    """Schedule of one rank's all-to-all for the byte matrix ``matrix[src][dst]`` (pure, cached).

    PULL reads chunk ``rank`` of every peer's input (staged into the workspace unless
    symmetric); PUSH writes chunk ``p`` of the own input into peer ``p``'s symmetric output.
    """
    if not 0 <= rank < world:
        raise InvalidArgument(f"rank {rank} outside a world of {world}")
    if len(matrix) != world or any(len(row) != world for row in matrix):
        raise InvalidArgument(f"split matrix must be {world} x {world}")
    if any(b < 0 for row in matrix for b in row):
        raise InvalidArgument("split matrix has a negative entry")
    if algorithm is Algorithm.PUSH and not output_symmetric:
        raise InvalidArgument("push all-to-all needs a peer-reachable output (allocate it with conccl.empty)")

    def in_off(src: int, dst: int) -> int:
        return sum(matrix[src][:dst])

    def out_off(dst: int, src: int) -> int:
        return sum(matrix[k][dst] for k in range(src))

    staged = algorithm is Algorithm.PULL and not input_symmetric and world > 1
    peers: dict[int, Transfer | None] = {}
    for p in range(world):
        if p == rank:
            continue
        if algorithm is Algorithm.PULL and matrix[p][rank]:
            src_buf = Buf.WORKSPACE if staged else Buf.INPUT
            peers[p] = Transfer(p, src_buf, in_off(p, rank), rank, Buf.OUTPUT, out_off(rank, p), matrix[p][rank], 0, Phase.PEER)
        elif algorithm is Algorithm.PUSH and matrix[rank][p]:
            peers[p] = Transfer(rank, Buf.INPUT, in_off(rank, p), p, Buf.OUTPUT, out_off(p, rank), matrix[rank][p], 0, Phase.PEER)
    sent = sum(matrix[rank])
    stage = Transfer(rank, Buf.INPUT, 0, rank, Buf.WORKSPACE, 0, sent, 0, Phase.STAGE) if staged and sent else None
    own = matrix[rank][rank]
    local = Transfer(rank, Buf.INPUT, in_off(rank, rank), rank, Buf.OUTPUT, out_off(rank, rank), own, 0, Phase.LOCAL) if own else None
    # Every rank must agree on the workspace size, so it is the largest input of any rank.
    workspace = max(sum(row) for row in matrix) if staged else 0
    return build_direct_schedule(
        NAME, world, rank,
        algorithm=algorithm, stream_mode=stream_mode, peer_transfers=peers,
        stage=stage, local=local, staged=staged, workspace_bytes=workspace,
    )


@lru_cache(maxsize=1024)
def plan_one_shot_all_to_all(world: int, rank: int, matrix: SplitMatrix) -> Schedule:
    """One rank's one-shot all-to-all (:mod:`conccl.collectives.one_shot`) for the byte matrix
    ``matrix[src][dst]``: every rank stages its whole input and reads its piece of each peer's."""
    pieces = {p: (sum(matrix[p][:rank]), sum(matrix[k][rank] for k in range(p)), matrix[p][rank])
              for p in range(world)}
    # every rank stages its whole input; the workspace must be alike on every rank: the largest
    return replace(build_one_shot(NAME, world, rank, sum(matrix[rank]), pieces),
                   workspace_bytes=max(sum(row) for row in matrix))


def check_all_to_all(output, input, output_split_sizes, input_split_sizes, world: int, device_type: str):
    """Validate arguments; return (output_splits, input_splits, bytes per dim-0 row)."""
    check_pair(output, input, device_type)
    if output.dim() == 0 or input.dim() == 0:
        raise InvalidArgument("all_to_all_single needs tensors with at least one dimension")
    if output.shape[1:] != input.shape[1:]:
        raise InvalidArgument(
            f"output rows have shape {tuple(output.shape[1:])}, input rows {tuple(input.shape[1:])}; they must match"
        )
    out_splits = check_splits("output_split_sizes", output_split_sizes, world, output.shape[0])
    in_splits = check_splits("input_split_sizes", input_split_sizes, world, input.shape[0])
    if overlaps(output, input):
        raise InvalidArgument("all_to_all_single cannot run in place: output and input overlap")
    row_bytes = math.prod(input.shape[1:]) * input.element_size()
    return out_splits, in_splits, row_bytes


class AllToAll(Collective):
    """``all_to_all_single(output, input, output_split_sizes, input_split_sizes)``: chunk d of
    rank s's input lands in chunk s of rank d's output (chunks along dim 0, sizes as split)."""

    name = NAME
    api_name = "all_to_all_single"
    arg_names = ("output_split_sizes", "input_split_sizes")

    def plan_fixed_by_own_row(self, world: int) -> bool:
        # The offset a rank reads a peer's chunk at adds up what that peer sends the ranks
        # before it (itself included, at world 2), which no row of this rank's fixes: a peer
        # may change it, legitimately, where this rank's row stays the same.
        return world <= 1

    def layout(self, world: int, rank: int) -> Layout:
        return Layout(world, world, tuple(((src, rank),) for src in range(world)))

    def local(self, output, input, args, world, rank, device_type) -> LocalCall:
        output_split_sizes, input_split_sizes = (tuple(args) + (None, None))[:2]
        out_splits, in_splits, row_bytes = check_all_to_all(output, input, output_split_sizes, input_split_sizes,
                                                            world, device_type)
        return LocalCall(tuple(s * row_bytes for s in in_splits), tuple(s * row_bytes for s in out_splits))

    def plan(self, world, rank, local, peers: PeerCalls, *, algorithm, stream_mode, input_symmetric,
             output_symmetric, peers_in_place) -> Schedule:
        return plan_all_to_all(world, rank, peers.send, algorithm=algorithm, stream_mode=stream_mode,
                               input_symmetric=input_symmetric, output_symmetric=output_symmetric)

    def plan_one_shot(self, world, rank, local, peers) -> Schedule | None:
        return plan_one_shot_all_to_all(world, rank, peers.send) if one_shot_serves(world) else None

    def reference(self, inputs, rank, args=None):
        import torch  # tests and checks only: the plans above stay importable without torch

        world = len(inputs)
        parts = []
        for src, t in enumerate(inputs):
            in_splits = None if args is None else (tuple(args[src]) + (None, None))[1]
            splits = list(in_splits) if in_splits is not None else [t.shape[0] // world] * world
            parts.append(torch.split(t, splits, dim=0)[rank])
        return torch.cat(parts, dim=0)


ALL_TO_ALL = AllToAll()
