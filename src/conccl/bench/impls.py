"""Implementations the benchmark compares, one registry for the CLI, tests and benchmark.

Each implementation prepares buffers once per size (``setup``) and returns a zero-argument
callable that runs one collective on the current stream. Every call goes through the
collective's :attr:`~conccl.collectives.base.Collective.api_name`, the function name
``torch.distributed``, ``conccl`` and conccl's communicator share, so a newly registered
collective runs under every implementation that :meth:`Impl.serves` it, with no edit here.
An implementation that changes process-wide state in its setup undoes it in ``teardown``,
which every benchmark calls once it is done with the tensors ``setup`` was given.

The names are what a user compares (:data:`NAMES`): NCCL, conccl's communicator, its public
functions under ``set_eager_path("auto")``, PyTorch's copy-engine all-gather, and two of
conccl's mechanisms (persistent ops, one-shot calls). How the communicator's calls run, with
which tensors, algorithm and stream mode, is a :class:`Variant` (the bench commands'
``--tensors``, ``--algorithm`` and ``--stream-mode``), not a name of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed import _symmetric_memory as symm_mem

import conccl

from ..collectives import Collective
from ..errors import InvalidArgument
from ..schedule.base import Algorithm, StreamMode
from .variant import AUTO, Variant


@dataclass(frozen=True)
class Impl:
    name: str
    description: str
    # setup(collective, inp, out, ctx) -> (run, result): run() queues one collective on the
    # current stream; result() returns the tensor holding the last run's output.
    setup: Callable
    # The collectives it runs, by registry name, where it is another library's path for only
    # those (data, read by serves()); None: every registered collective it can run.
    only: tuple[str, ...] | None = None
    # Beyond ``only``: whether it can run this collective at this world size (None: yes).
    can_run: Callable[[Collective, int], bool] | None = None
    # teardown(ctx): undo what setup changed beyond its buffers (None: nothing to undo).
    teardown: Callable[[dict], None] | None = None
    # Whether its captured calls take a slot of every rank's input (Algorithm.STAGED_PUSH asked
    # for): the graphs benchmark reserves their graph workspace by the output's bytes.
    staged_push: bool = False

    def serves(self, coll: Collective, world: int) -> bool:
        if self.only is not None and coll.name not in self.only:
            return False
        return self.can_run is None or self.can_run(coll, world)


def _conccl(variant: Variant, persistent: bool = False):
    """(setup, can_run) of the communicator's calls as ``variant`` asks, one-shot calls or
    persistent ops (agreed with the peers once, each run only starts it)."""
    algo = None if variant.algorithm == AUTO else Algorithm(variant.algorithm)
    mode = None if variant.stream_mode == AUTO else StreamMode(variant.stream_mode)

    def setup(coll, inp, out, ctx):
        if variant.tensors == "in_place":
            inp, out = _in_place(coll, inp, out, ctx)
        elif variant.tensors == "symmetric" and inp is out:  # in place (all_reduce): one peer-reachable tensor
            inp = out = _to_symmetric(out, ctx, "out")
        elif variant.tensors == "symmetric":
            inp, out = _to_symmetric(inp, ctx, "in"), _to_symmetric(out, ctx, "out")
        comm = conccl.get_communicator()
        if persistent:
            op = getattr(comm, "persistent_" + coll.api_name)(out, inp, algorithm=algo, stream_mode=mode)
            return (lambda: op.start()), lambda: out  # looked up per call: --phases wraps start
        fn = getattr(comm, coll.api_name)
        return (lambda: fn(out, inp, algorithm=algo, stream_mode=mode)), lambda: out

    def can_run(coll, world):  # the collective refuses an algorithm it cannot run
        if variant.tensors == "in_place" and not coll.in_place(world):
            return False
        if algo is Algorithm.STAGED_PUSH and not coll.staged_push:  # a reduce-scatter would push as always
            return False
        try:
            coll.algorithm(algo, variant.tensors != "plain")
        except InvalidArgument:
            return False
        return True

    return setup, can_run


def _in_place(coll, inp, out, ctx):
    """(input, output) with the input already in its place in a conccl.empty output (the
    layout's in-place chunk): no own-shard copy."""
    out = _to_symmetric(out, ctx, "out")
    nbytes = inp.numel() * inp.element_size()
    chunk = coll.layout(dist.get_world_size(), dist.get_rank()).in_place_chunk
    own = out.view(-1).view(torch.uint8)[chunk * nbytes:(chunk + 1) * nbytes].view(inp.dtype)
    own.copy_(inp)
    return own, out


def _to_symmetric(t, ctx, role):
    """Copy ``t`` into a view of a per-role symmetric arena of ``ctx['max_bytes']``, allocated once:
    the symmetric allocator may hand ranks cached blocks of different sizes if allocations
    come and go, and a rendezvous needs equal sizes."""
    key = f"arena_{role}"
    if key not in ctx:
        ctx[key] = conccl.empty(ctx["max_bytes"], dtype=torch.uint8)
    nbytes = t.numel() * t.element_size()
    s = ctx[key][:nbytes].view(t.dtype).view(t.shape)
    s.copy_(t)
    return s


def _nccl(coll, inp, out, ctx):
    return (lambda: coll.call_with(dist, out, inp)), lambda: out


def _torch_low_contention(coll, inp, out, ctx):
    """PyTorch's ``_low_contention_all_gather`` (serves the all-gather only: see its entry)."""
    name = dist.group.WORLD.group_name
    if "lc_arena" not in ctx:
        ctx["lc_arena"] = symm_mem.empty(ctx["max_bytes"], dtype=torch.uint8, device=inp.device)
        symm_mem.rendezvous(ctx["lc_arena"], name)
    sym = ctx["lc_arena"][: inp.numel() * inp.element_size()].view(inp.dtype)
    sym.copy_(inp)
    last = {}

    def run():
        out = torch.ops.symm_mem._low_contention_all_gather(sym, name)  # allocates its output
        # it runs on a backend stream: make the current stream wait, as a caller must
        last["out"] = torch.ops._c10d_functional.wait_tensor(out)

    return run, lambda: last["out"]


def _public_calls(coll, inp, out, ctx):
    """A run of conccl's public function of ``coll`` on (``out``, ``inp``) that leaves the path
    its call took (``Work.path``) in ``ctx["path"]`` for the benchmark to report."""
    def run():
        ctx["path"] = getattr(coll.call_with(conccl, out, inp), "path", None)

    return run, lambda: out


def _conccl_auto(coll, inp, out, ctx):
    """conccl's public functions with the eager path on ``auto``: below the sizes
    ``set_eager_path`` returns, an eager call goes to NCCL (``Work.path`` "nccl")."""
    ctx["eager_path"] = conccl.set_eager_path("auto")
    return _public_calls(coll, inp, out, ctx)


def _conccl_auto_teardown(ctx):
    if ctx.pop("eager_path", None) is not None:
        conccl.set_eager_path("copy_engines")
    ctx.pop("path", None)


def _conccl_one_shot(coll, inp, out, ctx):
    """conccl's public functions on ordinary tensors with the group's ``one_shot_below`` raised
    past every size: each call runs as the one-shot kernel wherever that path serves it (see
    ``one_shot_plan``; elsewhere the copy engines, as a public function would), what
    ``CONCCL_ONE_SHOT_BELOW`` buys at this size. Only the public functions may run one-shot,
    so the communicator's methods (the ``conccl`` entry) never do (``Work.path``: "one_shot"
    or "copy_engines")."""
    comm = conccl.get_communicator()
    ctx["one_shot_below"] = (comm, comm.options.one_shot_below)
    comm.options.one_shot_below = 1 << 62
    return _public_calls(coll, inp, out, ctx)


def _one_shot_teardown(ctx):
    comm, before = ctx.pop("one_shot_below", (None, None))
    if comm is not None:
        comm.options.one_shot_below = before
    ctx.pop("path", None)


def implementations(variant: Variant = Variant()) -> dict[str, Impl]:
    """Every implementation by name, ``conccl`` and ``conccl_persistent`` calling as ``variant``
    asks (the others take no variant: the public functions choose for themselves)."""
    calls, calls_can_run = _conccl(variant)
    ops, ops_can_run = _conccl(variant, persistent=True)
    staged = variant.algorithm == Algorithm.STAGED_PUSH.value
    return {i.name: i for i in [
        Impl("nccl", "NCCL with SM kernels (torch.distributed)", _nccl),
        Impl("conccl", f"conccl's communicator calls: {variant.describe()}", calls, can_run=calls_can_run,
             staged_push=staged),
        Impl("conccl_auto", "conccl's functions on ordinary tensors with conccl.set_eager_path('auto'): an eager call "
             "below the size where copy engines win goes to NCCL", _conccl_auto, teardown=_conccl_auto_teardown),
        Impl("torch_lc", "PyTorch _low_contention_all_gather (copy engines + a barrier kernel), symmetric input",
             _torch_low_contention, only=("all_gather",)),
        Impl("conccl_persistent", f"conccl's persistent ops (conccl.persistent_*): agreed with the peers once, each "
             f"run only queues the copies; {variant.describe()}", ops, can_run=ops_can_run, staged_push=staged),
        Impl("conccl_one_shot", "conccl's functions on ordinary tensors as one-shot calls (CONCCL_ONE_SHOT_BELOW past "
             "the size): one kernel of one CTA reading the peers' staged inputs", _conccl_one_shot,
             teardown=_one_shot_teardown),
    ]}


REGISTRY: dict[str, Impl] = implementations()  # the default variant's; the names are every variant's
NAMES = tuple(REGISTRY)
DEFAULT_IMPLS = ("conccl", "nccl", "torch_lc")
