"""No-device tier: ``Group`` has a call and a persistent method for every registered
collective (made from the registry, named and signed as the class's own: help() and
tracebacks show them so), and each hands its arguments to the group's generic ``call`` /
``persistent`` as torch.distributed's function of that name takes them."""
from __future__ import annotations

import inspect

import pytest

from conccl.collectives import REGISTRY
from conccl.group import Group


class _Recording(Group):
    """A Group with no board or executor, recording what its generic entry points receive."""

    def __init__(self):  # noqa: D107 - nothing of a real group is needed
        self.seen = []

    def call(self, coll, output, input, args=(), async_op=False, **kwargs):
        self.seen.append(("call", coll, output, input, args, async_op, kwargs))

    def persistent(self, coll, output, input, args=(), **kwargs):
        self.seen.append(("persistent", coll, output, input, args, kwargs))


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_collective_has_both_methods_named_as_the_classs_own(name):
    coll = REGISTRY[name]
    for method in (coll.api_name, f"persistent_{coll.api_name}"):
        fn = getattr(Group, method, None)
        assert fn is not None, f"Group has no {method}() for the registered collective {name!r}"
        # named as a method of the class, not as the closure that made it
        assert fn.__qualname__.endswith(f".{method}") and "<locals>" not in fn.__qualname__, fn.__qualname__
        assert list(inspect.signature(fn).parameters)[:3] == ["self", "output", "input"]


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_method_hands_its_collective_and_arguments_on(name):
    coll = REGISTRY[name]
    n = len(coll.arg_names)
    g = _Recording()
    call, persistent = getattr(g, coll.api_name), getattr(g, f"persistent_{coll.api_name}")
    args = tuple(f"arg{i}" for i in range(n))
    call("out", "in")
    call("out", "in", *args, True, timeout=5)  # async_op positional, after the collective's arguments
    call("out", "in", **dict(zip(coll.arg_names, args)), async_op=True, algorithm="a")  # all by name
    persistent("out", "in", *args, stream_mode="s")
    persistent("out", "in", **dict(zip(coll.arg_names, args)))
    none = (None,) * n
    assert g.seen == [
        ("call", coll, "out", "in", none, False, {}),
        ("call", coll, "out", "in", args, True, {"timeout": 5}),
        ("call", coll, "out", "in", args, True, {"algorithm": "a"}),
        ("persistent", coll, "out", "in", args, {"stream_mode": "s"}),
        ("persistent", coll, "out", "in", args, {}),
    ]
    with pytest.raises(TypeError, match=coll.api_name):
        call("out", "in", *args, True, "one too many")
    with pytest.raises(TypeError, match=coll.api_name):
        persistent("out", "in", *args, True)  # a persistent op takes no async_op
    assert len(g.seen) == 5
