"""How conccl's implementations in the benchmarks call the communicator (:class:`Variant`):
with which tensors, algorithm and stream mode; the bench commands' ``--tensors``,
``--algorithm`` and ``--stream-mode``. Plain data: needs no torch."""
from __future__ import annotations

from dataclasses import dataclass

from ..schedule.base import Algorithm, StreamMode

AUTO = "auto"  # no algorithm or stream mode asked for: the collective's (and the group's) choice
# The tensors a variant's calls take: ordinary ones (staged into the symmetric workspace where
# peers read them), tensors from conccl.empty, or the input as the own chunk of a conccl.empty
# output (no own-shard copy; only the collectives that have an in-place chunk).
TENSORS = ("plain", "symmetric", "in_place")
ALGORITHMS = (AUTO, *(a.value for a in Algorithm))
STREAM_MODES = (AUTO, *(m.value for m in StreamMode))


@dataclass(frozen=True)
class Variant:
    """How the ``conccl`` and ``conccl_persistent`` implementations call the communicator:
    ``tensors`` one of :data:`TENSORS`, ``algorithm`` of :data:`ALGORITHMS`, ``stream_mode`` of
    :data:`STREAM_MODES`. The default is conccl's default call on ordinary tensors. ValueError,
    naming the flag, for a value it does not know."""

    tensors: str = "plain"
    algorithm: str = AUTO
    stream_mode: str = AUTO

    def __post_init__(self):
        for flag, value, known in (("--tensors", self.tensors, TENSORS), ("--algorithm", self.algorithm, ALGORITHMS),
                                   ("--stream-mode", self.stream_mode, STREAM_MODES)):
            if value not in known:
                raise ValueError(f"{flag}: unknown {value!r}; choose from {', '.join(known)}")

    def describe(self) -> str:
        """The variant in words, for the benchmarks' headers and tables."""
        tensors = {"plain": "ordinary tensors", "symmetric": "conccl.empty tensors",
                   "in_place": "in place in a conccl.empty output"}[self.tensors]
        return f"{tensors}, algorithm {self.algorithm}, stream mode {self.stream_mode}"


def add_variant_flags(parser) -> None:
    """``--tensors``, ``--algorithm`` and ``--stream-mode`` (a :class:`Variant`) on ``parser``."""
    parser.add_argument("--tensors", default="plain", choices=TENSORS,
                        help="conccl's tensors: ordinary (plain, the default), from conccl.empty (symmetric), or the "
                             "input in place in a conccl.empty output (in_place)")
    parser.add_argument("--algorithm", default=AUTO, choices=ALGORITHMS,
                        help="conccl's algorithm (default auto: the collective's choice)")
    parser.add_argument("--stream-mode", default=AUTO, choices=STREAM_MODES,
                        help="conccl's stream mode (default auto: the group's choice)")


def variant_of(args) -> Variant:
    """The :class:`Variant` the flags of :func:`add_variant_flags` ask for."""
    return Variant(args.tensors, args.algorithm, args.stream_mode)
