"""Implementations the benchmark compares, one registry for the CLI, tests and benchmark.

Each implementation prepares buffers once per size (``setup``) and returns a zero-argument
callable that runs one collective on the current stream. Every call goes through the
collective's :attr:`~conccl.collectives.base.Collective.api_name`, the function name
``torch.distributed``, ``conccl`` and conccl's communicator share, so a newly registered
collective runs under every implementation that :meth:`Impl.serves` it, with no edit here.
``family`` groups implementations that can share a process: NCCL's copy-engine mode needs the
NCCL symmetric-memory backend, conccl the CUDA one, and a process can only hold one. An
implementation that changes process-wide state in its setup undoes it in ``teardown``, which
every benchmark calls once it is done with the tensors ``setup`` was given.
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


@dataclass(frozen=True)
class Impl:
    name: str
    family: str
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

    def serves(self, coll: Collective, world: int) -> bool:
        if self.only is not None and coll.name not in self.only:
            return False
        return self.can_run is None or self.can_run(coll, world)


def _conccl(algorithm=None, stream_mode=None, symmetric=False, checks=True, persistent=False, via_peer=False):
    algo = Algorithm(algorithm) if algorithm else None
    mode = StreamMode(stream_mode) if stream_mode else None

    def setup(coll, inp, out, ctx):
        if symmetric and inp is out:  # in place (all_reduce): one peer-reachable tensor, as the caller's
            inp = out = _to_symmetric(out, ctx, "out")
        elif symmetric:
            inp, out = _to_symmetric(inp, ctx, "in"), _to_symmetric(out, ctx, "out")
        comm = conccl.get_communicator()
        if via_peer:  # this group's calls from now on, until the teardown turns it off
            comm.options.own_chunk_via_peer = True
            ctx["via_peer"] = comm
        if persistent:  # agreed once here; each run only starts it
            op = getattr(comm, "persistent_" + coll.api_name)(out, inp, algorithm=algo, stream_mode=mode)
            return (lambda: op.start()), lambda: out  # looked up per call: --phases wraps start
        fn = getattr(comm, coll.api_name)
        call = lambda: fn(out, inp, algorithm=algo, stream_mode=mode)  # noqa: E731
        if checks:
            return call, lambda: out

        def unchecked():  # the group's other calls keep their checks
            comm.options.checks = False
            try:
                call()
            finally:
                comm.options.checks = True

        return unchecked, lambda: out

    def can_run(coll, world):  # the collective refuses an algorithm it cannot run
        try:
            coll.algorithm(algo, symmetric)
        except InvalidArgument:
            return False
        return True

    return setup, can_run


def _conccl_in_place(coll, inp, out, ctx):
    """The input already in its place in a conccl.empty output (the layout's in-place chunk):
    no own-shard copy."""
    out = _to_symmetric(out, ctx, "out")
    nbytes = inp.numel() * inp.element_size()
    chunk = coll.layout(dist.get_world_size(), dist.get_rank()).in_place_chunk
    own = out.view(-1).view(torch.uint8)[chunk * nbytes:(chunk + 1) * nbytes].view(inp.dtype)
    own.copy_(inp)
    fn = getattr(conccl.get_communicator(), coll.api_name)
    return (lambda: fn(out, own)), lambda: out


def _has_in_place_chunk(coll, world):
    return coll.in_place(world)


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


def _nccl_ce(coll, inp, out, ctx):
    """NCCL >= 2.28 copy-engine collectives: CTA policy ZERO, buffers in a registered window."""
    if "ce_group" not in ctx:
        symm_mem.set_backend("NCCL")
        opts = dist.ProcessGroupNCCL.Options()
        opts.config.cta_policy = dist.ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO
        group = dist.new_group(backend="nccl", pg_options=opts)
        with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(inp.device)):
            windows = [torch.empty(ctx["max_bytes"], dtype=torch.uint8, device=inp.device) for _ in range(2)]
        for w in windows:
            symm_mem.rendezvous(w, group.group_name)
        ctx["ce_group"], ctx["ce_windows"] = group, windows
    group, (w_in, w_out) = ctx["ce_group"], ctx["ce_windows"]
    win_in = w_in[: inp.numel() * inp.element_size()].view(inp.dtype)
    win_out = w_out[: out.numel() * out.element_size()].view(out.dtype)
    win_in.copy_(inp)
    fn = getattr(dist, coll.api_name)
    return (lambda: fn(win_out, win_in, group=group)), lambda: win_out


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


def _via_peer_teardown(ctx):
    comm = ctx.pop("via_peer", None)
    if comm is not None:
        comm.options.own_chunk_via_peer = False


def _conccl_impl(name, description, only=None, teardown=None, **kw):
    setup, can_run = _conccl(**kw)
    return Impl(name, "cuda_symm", description, setup, only=only, can_run=can_run, teardown=teardown)


REGISTRY: dict[str, Impl] = {
    i.name: i
    for i in [
        _conccl_impl("conccl", "conccl default on ordinary tensors: pull, input staged into the symmetric workspace, "
                     "peer copies as one cudaMemcpyBatchAsync"),
        _conccl_impl("conccl_symm_pull", "conccl pull, input and output from conccl.empty (no staging)",
                     algorithm="pull", symmetric=True),
        _conccl_impl("conccl_symm_push", "conccl push into peers' outputs from conccl.empty",
                     algorithm="push", symmetric=True),
        Impl("conccl_symm_push_in_place", "cuda_symm",
             "conccl push, in place: the input is the own chunk of a conccl.empty output", _conccl_in_place,
             can_run=_has_in_place_chunk),
        _conccl_impl("conccl_persistent", "conccl default on ordinary tensors as a persistent op (conccl.persistent_*): "
                     "agreed with the peers once, each run only queues the copies", persistent=True),
        _conccl_impl("conccl_symm_push_via_peer", "conccl push from conccl.empty, the own chunk read back from a "
                     "peer's output on a copy engine (set_options(own_chunk_via_peer=True)): no same-GPU copy",
                     only=("all_gather",), teardown=_via_peer_teardown, algorithm="push", symmetric=True,
                     via_peer=True),
        _conccl_impl("conccl_symm_push_persistent", "conccl push from conccl.empty as a persistent op: agreed once, "
                     "each run only queues the copies", algorithm="push", symmetric=True, persistent=True),
        _conccl_impl("conccl_symm_push_unchecked", "conccl push from conccl.empty without the mismatch checks and the "
                     "watchdog (what they cost; a dead peer then hangs the GPU)",
                     algorithm="push", symmetric=True, checks=False),
        _conccl_impl("conccl_symm_push_single", "conccl push from conccl.empty, one cudaMemcpyAsync after another",
                     algorithm="push", stream_mode="single", symmetric=True),
        _conccl_impl("conccl_symm_push_per_peer", "conccl push from conccl.empty, one stream per peer",
                     algorithm="push", stream_mode="per_peer", symmetric=True),
        _conccl_impl("conccl_symm_push_batch", "conccl push from conccl.empty, one stream, peer copies batched "
                     "(captured: one memcpy node after another)", algorithm="push", stream_mode="batch", symmetric=True),
        _conccl_impl("conccl_staged_push", "conccl all-gather or all-reduce pushed whole into the peers' workspace, "
                     "copied out or reduced there (Algorithm.STAGED_PUSH), ordinary tensors",
                     only=("all_gather", "all_reduce"), algorithm="staged_push"),
        _conccl_impl("conccl_symm_staged_push", "conccl all-gather or all-reduce pushed whole into the peers' "
                     "workspace, copied out or reduced there, conccl.empty tensors", only=("all_gather", "all_reduce"),
                     algorithm="staged_push", symmetric=True),
        _conccl_impl("conccl_per_peer", "conccl pull, staged, one stream per peer", algorithm="pull", stream_mode="per_peer"),
        _conccl_impl("conccl_batch", "conccl pull, staged, one stream, peer copies batched (captured: one memcpy node "
                     "after another)", algorithm="pull", stream_mode="batch"),
        _conccl_impl("conccl_single", "conccl pull, staged, one cudaMemcpyAsync after another",
                     algorithm="pull", stream_mode="single"),
        Impl("conccl_auto", "cuda_symm", "conccl's functions on ordinary tensors with conccl.set_eager_path('auto'): "
             "an eager call below the size where copy engines win goes to NCCL", _conccl_auto,
             teardown=_conccl_auto_teardown),
        Impl("conccl_one_shot", "cuda_symm", "conccl's functions on ordinary tensors as one-shot calls "
             "(CONCCL_ONE_SHOT_BELOW past the size): one kernel of one CTA reading the peers' staged inputs",
             _conccl_one_shot, teardown=_one_shot_teardown),
        Impl("nccl", "cuda_symm", "NCCL with SM kernels (torch.distributed)", _nccl),
        Impl("torch_lc", "cuda_symm",
             "PyTorch _low_contention_all_gather (copy engines + a barrier kernel), symmetric input",
             _torch_low_contention, only=("all_gather",)),
        # NCCL's copy-engine mode runs these collectives only (NCCL 2.28: no reductions).
        Impl("nccl_ce", "nccl_symm", "NCCL copy-engine mode (cta_policy ZERO, registered symmetric window)", _nccl_ce,
             only=("all_gather", "all_to_all")),
    ]
}

DEFAULT_IMPLS = ("conccl", "conccl_symm_pull", "conccl_symm_push", "nccl", "torch_lc", "nccl_ce")
