"""Which tensor-parallel pipeline to run, as plain data: :class:`TPSchedule` (the order the peers'
pieces move in, how many pieces a shard is cut into, how many of them one GEMM step covers, on
how many streams the steps run, pull or push) and the GEMM steps it makes (:func:`gemm_steps`):
the list the pipelines run (:mod:`conccl.schedule.pipeline`) and the planner's model times
(:mod:`conccl.planner.tp`). No device, no torch.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import InvalidArgument
from .base import Algorithm, StreamMode


class Order(enum.Enum):
    """In which order a rank's peers' pieces move."""

    RING = "ring"  # one peer after another, on one stream (each peer's link alone)
    DIRECT = "direct"  # every peer at once, a stream each; piece j of every peer before piece j+1


@dataclass(frozen=True)
class TPSchedule:
    """How a tensor-parallel op overlaps its collective with its GEMM.

    ``pieces``: each rank's shard is cut into that many row pieces (1: shard-level, FiCCO's
    coarse grain; more: its finer grain); ``gemm_pieces``: how many landed pieces one GEMM
    covers (the GEMM grain, decoupled from the transfer grain; rows must be contiguous);
    ``serial``: the whole collective, then one GEMM (the baseline every schedule must equal);
    ``gemm_streams``: the GEMM steps alternate over that many streams (1 or 2), so a step whose
    rows have landed starts on the SMs the previous step's last wave leaves idle, as PyTorch's
    async-TP runs its two GEMMs at world 2 (on one stream each step waits for the last one's tail).
    ``push`` (all-gather+GEMM only): each rank pushes its shard from its own input into every
    peer's workspace on the copy engines (the flat all-gather's ``Algorithm.STAGED_PUSH``), and
    each peer's GEMM step reads it there: no staging copy (a same-GPU copy on SMs, which the
    pull pipelines make of a plain input) and no wait for one; whole shards, every peer at once.
    """

    serial: bool = False
    order: Order = Order.DIRECT
    pieces: int = 1
    gemm_pieces: int = 1
    gemm_streams: int = 1
    push: bool = False

    def __post_init__(self):
        if not isinstance(self.order, Order):
            raise InvalidArgument(f"order must be a conccl.schedule.pipeline.Order, got {self.order!r}")
        if self.pieces < 1 or self.gemm_pieces < 1:
            raise InvalidArgument(f"pieces and gemm_pieces must be >= 1, got {self.pieces}, {self.gemm_pieces}")
        if self.gemm_streams not in (1, 2):
            raise InvalidArgument(f"gemm_streams must be 1 or 2, got {self.gemm_streams}")
        if self.serial and (self.pieces, self.gemm_pieces, self.gemm_streams) != (1, 1, 1):
            raise InvalidArgument("a serial schedule moves whole shards and runs one GEMM")
        if self.push and (self.serial or self.order is not Order.DIRECT or (self.pieces, self.gemm_pieces) != (1, 1)):
            raise InvalidArgument("a push schedule moves whole shards to every peer at once (push, push-s2)")

    @property
    def name(self) -> str:
        """How results and the CLI spell it: serial, ring, direct, direct-p4, direct-p4-g2, direct-s2,
        push, push-s2."""
        if self.serial:
            return "serial"
        s = "push" if self.push else self.order.value
        if self.pieces > 1:
            s += f"-p{self.pieces}"
        if self.gemm_pieces > 1:
            s += f"-g{self.gemm_pieces}"
        if self.gemm_streams > 1:
            s += f"-s{self.gemm_streams}"
        return s

    @classmethod
    def parse(cls, name: str) -> "TPSchedule":
        """The inverse of :attr:`name`; InvalidArgument naming what is accepted otherwise."""
        if name == "serial":
            return cls(serial=True)
        head, *rest = name.split("-")
        try:
            push = head == "push"
            order = Order.DIRECT if push else Order(head)
            kw = {"pieces": 1, "gemm_pieces": 1, "gemm_streams": 1}
            for part in rest:
                key = {"p": "pieces", "g": "gemm_pieces", "s": "gemm_streams"}[part[0]]
                kw[key] = int(part[1:])
        except (ValueError, KeyError, IndexError):
            raise InvalidArgument(f"unknown tensor-parallel schedule {name!r}: serial, ring, direct, push, or "
                                  "ORDER-pK-gG-sS (e.g. direct-p4-g2: each shard in 4 pieces, one GEMM per 2 pieces; "
                                  "-s2: the GEMM steps alternate over 2 streams; push-s2)") from None
        return cls(order=order, push=push, **kw)

    def stream_mode(self) -> StreamMode:
        """The flat collective's stream mode this schedule transforms."""
        return StreamMode.PER_PEER if self.order is Order.DIRECT else StreamMode.SINGLE

    def flat_algorithm(self) -> Algorithm:
        """The flat all-gather's algorithm this schedule transforms: a push pipeline's pushes
        into the peers' workspace (``STAGED_PUSH``), every other's pull."""
        return Algorithm.STAGED_PUSH if self.push else Algorithm.PULL


SERIAL = TPSchedule(serial=True)


def split_rows(rows: int, pieces: int) -> list[tuple[int, int]]:
    """``rows`` cut into ``pieces`` contiguous [start, end) ranges as equal as whole rows allow
    (empty ranges dropped: a shard of fewer rows than pieces moves in fewer pieces)."""
    bounds = [rows * j // pieces for j in range(pieces + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def piece_order(world: int, rank: int, tp: TPSchedule, rows: int) -> list:
    """Peer pieces (peer, j, row range within the shard) in the order they move."""
    peers = [(rank + step) % world for step in range(1, world)]
    cuts = split_rows(rows, 1 if tp.serial else tp.pieces)
    if tp.order is Order.RING or tp.serial:
        return [(p, j, cut) for p in peers for j, cut in enumerate(cuts)]
    return [(p, j, cut) for j, cut in enumerate(cuts) for p in peers]


def grouped_steps(order, rows: int, gemm_pieces: int) -> list:
    """Group pieces (in arrival order) into GEMM steps of up to ``gemm_pieces`` pieces whose
    rows are contiguous in the gathered output: [(row_start, row_end, (pieces...)), ...]."""
    steps: list = []
    for p, j, (a, b) in order:
        start, end = p * rows + a, p * rows + b
        if steps and len(steps[-1][2]) < gemm_pieces and steps[-1][1] == start:
            s = steps[-1]
            steps[-1] = (s[0], end, s[2] + ((p, j),))
        else:
            steps.append((start, end, ((p, j),)))
    return steps


def gemm_steps(world: int, rank: int, tp: TPSchedule, rows: int, scatter: bool = False) -> list:
    """The GEMM steps of a pipeline, in the order its GEMM slot runs them: ``[(row_start,
    row_end, ((peer, piece), ...)), ...]`` (rows of the gathered operand / of the product).
    An all-gather pipeline starts with the own rows (no piece to wait for); a reduce-scatter
    one computes the rows bound for each peer in the order they leave, its own last; serial is
    one step over every row. What :func:`conccl.schedule.pipeline.gather_then_gemm` /
    :func:`~conccl.schedule.pipeline.gemm_then_scatter` build and what the planner's model times
    (:mod:`conccl.planner.tp`)."""
    order = piece_order(world, rank, tp, rows)
    npieces = len(split_rows(rows, 1 if tp.serial else tp.pieces))
    own = [(rank, j, cut) for j, cut in enumerate(split_rows(rows, npieces))]
    if tp.serial:
        every = order + own if scatter else own + order
        return [(0, world * rows, tuple((p, j) for p, j, _ in every))]
    if scatter:
        return grouped_steps(order + own, rows, tp.gemm_pieces)
    return [(rank * rows, (rank + 1) * rows, ())] + grouped_steps(order, rows, tp.gemm_pieces)
