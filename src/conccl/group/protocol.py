"""What every conccl group offers: :class:`~conccl.group.Group` (one host) and
:class:`~conccl.group.hierarchical.HierarchicalGroup` (several hosts) alike.

The API (:mod:`conccl.api`), the integrations and the persistent ops reach a group only
through these; anything else a group has is its own. Besides the members named here, both
carry one method pair per registered collective (:mod:`conccl.group.methods`):
``group.<api_name>(output, input, *args, async_op=False, ...)`` and
``group.persistent_<api_name>(output, input, *args, ...)``.
"""
from __future__ import annotations

from typing import Protocol

__all__ = ["CollectiveGroup"]


class CollectiveGroup(Protocol):
    """One process group's conccl state: ``rank`` of ``world``, its defaults (``options``, a
    :class:`~conccl.group.options.Options`), the sequence number of its last call (``seq``),
    its first failure (``broken``, None while usable), ``closed``, ``fallback`` ((library,
    process group) that runs a call flat, or None) and the persistent ops made on it
    (``persistent_ops``)."""

    name: str
    rank: int
    world: int
    seq: int
    broken: BaseException | None
    closed: bool
    fallback: tuple | None
    persistent_ops: int

    @property
    def options(self):
        """The group's :class:`~conccl.group.options.Options` (per rank)."""

    @property
    def executor(self):
        """What runs the group's schedules (InvalidArgument on a group spanning hosts)."""

    def call(self, coll, output, input, args: tuple = (), async_op: bool = False, *, algorithm=None,
             stream_mode=None, timeout=None, route: bool = False):
        """Run collective ``coll`` on (output, input, *args); returns a :class:`~conccl.group.work.Work`."""

    def persistent(self, coll, output, input, args: tuple = (), *, algorithm=None, stream_mode=None, timeout=None):
        """Agree ``coll`` on these buffers once; the returned op's ``start()`` runs it."""

    def agree(self, text: str, what: str, hint: str = "", timeout=None) -> None:
        """A collective call: InvalidArgument on every rank unless every rank passed the same ``text``."""

    def set_nccl_below(self, table: dict, timeout=None) -> None:
        """Install ``options.nccl_below`` (a collective call: compared on every rank)."""

    def resource(self, key: str, make):
        """The object an upper layer keeps for this group under ``key`` (made by ``make()``
        on first use, closed with the group)."""

    def timeout_s(self, timeout) -> float:
        """``timeout`` (seconds, a timedelta, or None: the group's) in seconds."""

    def check_usable(self) -> None:
        """Raise :class:`~conccl.errors.GroupBroken` once the group is broken."""

    def fail(self, error: BaseException) -> None:
        """Break the group with ``error`` (its peers are told)."""

    def close(self) -> None:
        """Release everything the group holds (local, idempotent)."""
