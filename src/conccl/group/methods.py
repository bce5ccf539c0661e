"""A group's method pair per registered collective, made from
:data:`conccl.collectives.REGISTRY` and named and shaped as in ``torch.distributed``:
``group.<api_name>(output, input, *args, async_op=False, *, algorithm=None, stream_mode=None,
timeout=None)`` and ``group.persistent_<api_name>(output, input, *args, *, algorithm=None,
stream_mode=None, timeout=None)``, where ``args`` are the collective's
:attr:`~conccl.collectives.base.Collective.arg_names`, positional or by name.

A new collective gets its two methods by being in the registry: nothing here names one.
"""
from __future__ import annotations

import inspect

from ..collectives import REGISTRY, Collective

__all__ = ["CollectiveMethods"]


class CollectiveMethods:
    """Mixed into :class:`~conccl.group.Group` and
    :class:`~conccl.group.hierarchical.HierarchicalGroup`, whose ``call`` and ``persistent``
    run them; one ``<api_name>`` and one ``persistent_<api_name>`` method per registered
    collective (set below, each named as this class's own)."""

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


_P = inspect.Parameter


def _signature(coll: Collective, persistent: bool) -> inspect.Signature:
    """What help() and inspect show: the collective's arguments by their torch.distributed names."""
    params = [_P("self", _P.POSITIONAL_OR_KEYWORD), _P("output", _P.POSITIONAL_OR_KEYWORD),
              _P("input", _P.POSITIONAL_OR_KEYWORD)]
    params += [_P(n, _P.POSITIONAL_OR_KEYWORD, default=None) for n in coll.arg_names]
    if not persistent:
        params.append(_P("async_op", _P.POSITIONAL_OR_KEYWORD, default=False))
    params += [_P(n, _P.KEYWORD_ONLY, default=None) for n in ("algorithm", "stream_mode", "timeout")]
    return inspect.Signature(params)


def _named(fn, name: str, doc: str, signature: inspect.Signature):
    fn.__name__, fn.__qualname__, fn.__doc__, fn.__signature__ = name, f"CollectiveMethods.{name}", doc, signature
    return fn


def _methods(coll: Collective) -> dict:
    """The ``<api_name>`` and ``persistent_<api_name>`` methods of ``coll``."""
    def call(self, output, input, *args, **kwargs):
        return self._collective_call(coll, output, input, args, kwargs)

    def persistent(self, output, input, *args, **kwargs):
        return self._collective_persistent(coll, output, input, args, kwargs)

    name = coll.api_name
    return {name: _named(call, name, f"``{name}`` on this group (see :func:`conccl.{name}`).",
                         _signature(coll, False)),
            f"persistent_{name}": _named(persistent, f"persistent_{name}",
                                         f"A persistent ``{name}`` on this group (see :mod:`conccl.group.persistent`).",
                                         _signature(coll, True))}


def _install() -> None:
    for coll in REGISTRY.values():
        for name, method in _methods(coll).items():
            setattr(CollectiveMethods, name, method)


_install()
