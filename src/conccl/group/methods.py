""":class:`~conccl.group.Group`'s method per registered collective, named and shaped as in
``torch.distributed``: ``group.<api_name>(output, input, *args, async_op=False, *,
algorithm=None, stream_mode=None, timeout=None)`` and ``group.persistent_<api_name>(output,
input, *args, *, algorithm=None, stream_mode=None, timeout=None)``, where ``args`` are the
collective's :attr:`~conccl.collectives.base.Collective.arg_names`, positional or by name.

A new collective declares its two methods here (tests/unit/test_group_methods.py fails
until it does)."""
from __future__ import annotations

from ..collectives import Collective
from ..collectives.all_gather import ALL_GATHER
from ..collectives.all_reduce import ALL_REDUCE
from ..collectives.all_to_all import ALL_TO_ALL
from ..collectives.reduce_scatter import REDUCE_SCATTER


class CollectiveMethods:
    """Mixed into :class:`~conccl.group.Group`, whose ``call`` and ``persistent`` run them."""

    def all_gather_into_tensor(self, output, input, *args, **kwargs):
        """``all_gather_into_tensor`` on this group (see :func:`conccl.all_gather_into_tensor`)."""
        return self._collective_call(ALL_GATHER, output, input, args, kwargs)

    def all_to_all_single(self, output, input, *args, **kwargs):
        """``all_to_all_single`` on this group (see :func:`conccl.all_to_all_single`)."""
        return self._collective_call(ALL_TO_ALL, output, input, args, kwargs)

    def reduce_scatter_tensor(self, output, input, *args, **kwargs):
        """``reduce_scatter_tensor`` on this group (see :func:`conccl.reduce_scatter_tensor`)."""
        return self._collective_call(REDUCE_SCATTER, output, input, args, kwargs)

    def all_reduce(self, output, input, *args, **kwargs):
        """``all_reduce`` on this group (see :func:`conccl.all_reduce`)."""
        return self._collective_call(ALL_REDUCE, output, input, args, kwargs)

    def persistent_all_gather_into_tensor(self, output, input, *args, **kwargs):
        """A persistent ``all_gather_into_tensor`` on this group (see :mod:`conccl.group.persistent`)."""
        return self._collective_persistent(ALL_GATHER, output, input, args, kwargs)

    def persistent_all_to_all_single(self, output, input, *args, **kwargs):
        """A persistent ``all_to_all_single`` on this group (see :mod:`conccl.group.persistent`)."""
        return self._collective_persistent(ALL_TO_ALL, output, input, args, kwargs)

    def persistent_reduce_scatter_tensor(self, output, input, *args, **kwargs):
        """A persistent ``reduce_scatter_tensor`` on this group (see :mod:`conccl.group.persistent`)."""
        return self._collective_persistent(REDUCE_SCATTER, output, input, args, kwargs)

    def persistent_all_reduce(self, output, input, *args, **kwargs):
        """A persistent ``all_reduce`` on this group (see :mod:`conccl.group.persistent`)."""
        return self._collective_persistent(ALL_REDUCE, output, input, args, kwargs)

    def _collective_call(self, coll: Collective, output, input, args: tuple, kwargs: dict):
        extra, rest = _split(coll, args, kwargs, allow_async=True)
        async_op = rest[0] if rest else kwargs.pop("async_op", False)
        return self.call(coll, output, input, extra, async_op, **kwargs)

    def _collective_persistent(self, coll: Collective, output, input, args: tuple, kwargs: dict):
        extra, _ = _split(coll, args, kwargs, allow_async=False)
        return self.persistent(coll, output, input, extra, **kwargs)


def _split(coll: Collective, args: tuple, kwargs: dict, allow_async: bool) -> tuple:
    """(the collective's extra arguments in ``arg_names`` order, None where not given; the
    positional arguments after them), taking the named ones out of ``kwargs``."""
    names = coll.arg_names
    extra = list(args[:len(names)]) + [None] * (len(names) - len(args[:len(names)]))
    for i, n in enumerate(names):
        if n in kwargs:
            extra[i] = kwargs.pop(n)
    rest = args[len(names):]
    if len(rest) > (1 if allow_async else 0):
        raise TypeError(f"{coll.api_name}() takes output, input, {', '.join(names) or 'no other arguments'}"
                        + (" and async_op" if allow_async else ""))
    return tuple(extra), rest
