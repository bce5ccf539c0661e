"""All-reduce: every rank's output is the reduction over every rank of its whole input.

How it moves (a reduce-scatter into the group workspace, then an all-gather pulled out of it;
the workspace is peer-reachable on every rank, so no tensor needs to be symmetric)::

    push, per peer:  wait FREE(s-1) of p (p's half s % 2 is free: sent during call s-1) ·
                     input[chunk p] -> workspace@p[half s % 2][slot r] · PUSHED(s) -> p
    reduce:          wait PUSHED(s) of every peer · release (wait DONE(s-1), already implied;
                     FREE(s) -> every peer) · workspace[slot r] = reduce(chunk r of every rank)
                     REDUCED(s) -> every peer                    (our chunk of the result is ready)
    pull, per peer:  wait REDUCED(s) of p · workspace@p[slot p] -> output[chunk p] · DONE(s) -> p
    own chunk:       workspace[slot r] -> output[chunk r]

Two one-way signals (PUSHED, REDUCED) on the critical path in steady state: the workspace is
double-buffered (:mod:`conccl.schedule.base`), so no READY round trip and no wait for the previous
call precede the pushes. A call whose workspace exceeds
:data:`~conccl.schedule.base.DOUBLE_BUFFER_MAX_BYTES` takes the whole workspace the long way: wait
for DONE(s-1), READY(s) instead of FREE, DONE(s) of every peer at the end, then the release.

Copy engines move every byte (``2 (world-1) / world`` of the tensor in and out of each GPU,
as a ring all-reduce); the reduction is the one step that takes an SM. The result lands in
the workspace first because peers must reach it, and the output need not be peer-reachable.
In place (output is input) is safe: a peer pulls chunk p into our output only after every
rank's push of chunk p, ours included, has landed (REDUCED(s) of p follows PUSHED(s) of all).

Chunks: rank r reduces elements ``[r*c, (r+1)*c)`` with ``c = ceil(n / world)`` rounded up to
16 bytes (so every chunk starts 16-byte aligned and the reduction reads whole vectors); the
last chunks may be short or empty. Order of summation: rank 0, 1, ..., world-1 in fp32,
rounded to the dtype once; two ranks give NCCL's result bit for bit for SUM (and AVG where
the products are exact: docs/api.md).

One pass (``Algorithm.STAGED_PUSH``, chosen where :func:`one_pass` says so, or asked): each
rank pushes its *whole* input into slot ``rank`` of every peer's workspace and, once every
peer's DONE says its slots are written, reduces them with its own input straight into its
output: the reduce-scatter's protocol (one one-way signal on the critical path, where the
two-pass form above has two and a second copy) with the whole tensor as every rank's chunk.
It moves ``world - 1`` tensors out of each GPU where the two passes move ``2 (world-1) /
world``: the same bytes at two ranks, ``world / 2`` times more beyond, so it is for small
calls past two ranks (:func:`one_pass`). Workspace ``world`` slots of the whole tensor. The sum is the same
(every element over ranks 0..world-1 in fp32, rounded once), so are the bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..schedule.base import (Algorithm, Buf, Copy, Op, Phase, Reduce, Schedule, SetSignal, Signal, StreamMode, Transfer,
                        WaitSignal, double_buffer, release_ops, DOUBLE_BUFFER_MAX_BYTES, FREE_WAIT_DELTA)
from ..validate import InvalidArgument, check_pair, overlaps
from .base import Collective, Layout, LocalCall, PeerCalls
from .direct import WORKSPACE_ALIGN, build_staged_push_schedule, number_slots, peer_order, workspace_slot
from .one_shot import build_one_shot, serves as one_shot_serves
from .reduce_scatter import DTYPES, op_code, reduce_chunks, reduce_op

NAME = "all_reduce"

VECTOR_BYTES = 16  # what the reduction kernel reads per thread on its fast path
# The automatic choice (:func:`one_pass`) takes one pass while it sends at most this many bytes
# more than two passes would: ((world-1) - 2 (world-1) / world) x the tensor, none at two ranks.
# One pass saves a one-way signal and a copy (~20 us in a graph on 2 x H100/H200: docs/results.md,
# "Captured reductions: one pass and spin waits"); 8 MiB take about that long over one GPU's
# NVLink. Not measured beyond two ranks.
ONE_PASS_EXTRA_BYTES = 8 << 20


@dataclass(frozen=True)
class AllReducePlanArgs:
    """What an all-reduce's plan needs besides the peers' rows (``LocalCall.extra``): the
    tensor's elements and their bytes each, its dtype (torch's name) and the op's scale."""

    numel: int
    esize: int
    dtype: str
    scale: float


def one_pass(nbytes: int, world: int) -> bool:
    """Whether the automatic choice runs an all-reduce of ``nbytes`` in one pass (module doc): a
    pure function of what every rank's call agrees on. Where its workspace (``world`` slots of
    the tensor) stays double-buffered and it sends at most :data:`ONE_PASS_EXTRA_BYTES` more
    than two passes: every size to 32 MiB at two ranks, 5 MiB at four, 1.5 MiB at eight."""
    return (world > 1 and world * nbytes <= DOUBLE_BUFFER_MAX_BYTES
            and (world - 1) * (world - 2) * nbytes <= world * ONE_PASS_EXTRA_BYTES)


def chunk_ranges(numel: int, world: int, esize: int) -> tuple[tuple[int, int], ...]:
    """(byte offset, bytes) of each rank's chunk of an ``numel``-element tensor (see module doc)."""
    unit = max(1, VECTOR_BYTES // esize)
    per = -(-numel // world)
    per = -(-per // unit) * unit
    bounds = [min(numel, i * per) for i in range(world + 1)]
    return tuple((bounds[i] * esize, (bounds[i + 1] - bounds[i]) * esize) for i in range(world))


@lru_cache(maxsize=1024)
def plan_all_reduce(world: int, rank: int, numel: int, esize: int, dtype: str, scale: float = 1.0, *,
                    stream_mode: StreamMode = StreamMode.BATCH, algorithm: Algorithm = Algorithm.PUSH,
                    in_place: bool = False) -> Schedule:
    """Schedule of one rank's all-reduce of ``numel`` elements of ``esize`` bytes (pure, cached):
    ``Algorithm.PUSH`` the two passes, ``Algorithm.STAGED_PUSH`` one (module doc). ``in_place``
    (the output is the input) matters to one pass only: its pushes read the whole input, which
    its reduction overwrites, so they share one stream."""
    if not 0 <= rank < world:
        raise InvalidArgument(f"rank {rank} outside a world of {world}")
    if dtype not in DTYPES:
        raise InvalidArgument(f"all_reduce supports {', '.join(DTYPES)}, got {dtype}")
    if algorithm is Algorithm.STAGED_PUSH:
        return _plan_one_pass(world, rank, numel * esize, dtype, scale, stream_mode, in_place)
    chunks = chunk_ranges(numel, world, esize)
    slot = workspace_slot(chunks[0][1])
    peers = peer_order(world, rank)
    own_off, own_bytes = chunks[rank]

    def push(p) -> list[Op]:
        off, n = chunks[p]
        return [Copy(Transfer(rank, Buf.INPUT, off, p, Buf.WORKSPACE, rank * slot, n, 0, Phase.PEER))] if n else []

    def pull(p) -> list[Op]:
        off, n = chunks[p]
        return [Copy(Transfer(p, Buf.WORKSPACE, p * slot, rank, Buf.OUTPUT, off, n, 0, Phase.PEER))] if n else []

    reduce: list[Op] = []
    own: list[Op] = []
    if own_bytes:
        srcs = tuple((Buf.INPUT, own_off) if s == rank else (Buf.WORKSPACE, s * slot) for s in range(world))
        reduce = [Reduce((Buf.WORKSPACE, rank * slot), srcs, own_bytes, dtype, scale)]
        own = [Copy(Transfer(rank, Buf.WORKSPACE, rank * slot, rank, Buf.OUTPUT, own_off, own_bytes, 0, Phase.LOCAL))]
    double = double_buffer(world * slot)
    if double:
        # Pushes go into the peers' halves of this call, freed by their release in the previous
        # call; our release rides behind the PUSHED waits (a peer's PUSHED(s) follows its DONE(s-1)).
        head, gate, tail = [], Signal.FREE, []
        middle = ([WaitSignal(p, Signal.PUSHED) for p in peers] + release_ops(peers) + reduce
                  + [SetSignal(p, Signal.REDUCED) for p in peers])
    else:
        # The whole workspace, the long way (conccl.schedule.base): peers done with the previous call
        # before READY, every peer done with this one before the release.
        head = [WaitSignal(p, Signal.DONE, -1) for p in peers] + [SetSignal(p, Signal.READY) for p in peers]
        gate, tail = Signal.READY, [WaitSignal(p, Signal.DONE) for p in peers] + release_ops(peers, done_awaited=True)
        middle = [WaitSignal(p, Signal.PUSHED) for p in peers] + reduce + [SetSignal(p, Signal.REDUCED) for p in peers]

    def wait_gate(p) -> WaitSignal:
        return WaitSignal(p, gate, FREE_WAIT_DELTA if gate is Signal.FREE else 0)

    if stream_mode is StreamMode.PER_PEER:
        slots = [head + middle + own + tail]
        for p in peers:
            slots.append([wait_gate(p), *push(p), SetSignal(p, Signal.PUSHED),
                          WaitSignal(p, Signal.REDUCED), *pull(p), SetSignal(p, Signal.DONE)])
    else:
        ops = head + [wait_gate(p) for p in peers]
        for p in peers:
            ops += push(p)
        ops += [SetSignal(p, Signal.PUSHED) for p in peers] + middle + [WaitSignal(p, Signal.REDUCED) for p in peers]
        for p in peers:
            ops += pull(p)
        ops += [SetSignal(p, Signal.DONE) for p in peers] + own + tail
        slots = [ops]
    return Schedule(collective=NAME, world=world, rank=rank, slots=number_slots(slots), algorithm=Algorithm.PUSH,
                    stream_mode=stream_mode, staged=True, workspace_bytes=world * slot, double_buffered=double)


@lru_cache(maxsize=1024)
def plan_one_shot_all_reduce(world: int, rank: int, nbytes: int, dtype: str, scale: float) -> Schedule:
    """One rank's one-shot all-reduce (:mod:`conccl.collectives.one_shot`): every rank stages
    its whole tensor; each sums every rank's, in rank order, into its output."""
    return build_one_shot(NAME, world, rank, nbytes, {}, (0, 0, nbytes, dtype, scale))


def _plan_one_pass(world: int, rank: int, nbytes: int, dtype: str, scale: float, stream_mode: StreamMode,
                   in_place: bool) -> Schedule:
    """One pass (module doc; :func:`~conccl.collectives.direct.build_staged_push_schedule`): the
    reduction of every slot and the own input into the output once every peer's DONE came."""
    def reduce(slot):
        srcs = tuple((Buf.INPUT, 0) if s == rank else (Buf.WORKSPACE, s * slot) for s in range(world))
        return [Reduce((Buf.OUTPUT, 0), srcs, nbytes, dtype, scale)]

    if in_place and stream_mode is StreamMode.PER_PEER:
        # A branch per peer would let the reduction (slot 0) overwrite the input while a push
        # still reads it; the mode is this rank's own, the signals the same in every mode.
        stream_mode = StreamMode.BATCH
    return build_staged_push_schedule(NAME, world, rank, nbytes, stream_mode, reduce)


def check_all_reduce(output, input, device_type: str) -> bool:
    """Validate arguments; return True when the output is the input itself (in place)."""
    check_pair(output, input, device_type)
    if str(input.dtype).removeprefix("torch.") not in DTYPES:
        raise InvalidArgument(f"all_reduce supports {', '.join(DTYPES)}, got {input.dtype}")
    if input.numel() != output.numel():
        raise InvalidArgument(f"all_reduce: output has {output.numel()} elements, input {input.numel()}; they must match")
    if not overlaps(output, input):
        return False
    if output.data_ptr() != input.data_ptr():
        raise InvalidArgument("all_reduce: output overlaps input without being the same tensor")
    return True


class AllReduce(Collective):
    """``all_reduce(tensor, op=SUM)``: the tensor on every rank becomes op over the ranks of
    their tensors. The group's call takes (output, input, op): in place when they are one
    tensor (as torch.distributed's), out of place otherwise (as NCCL's ncclAllReduce)."""

    name = NAME
    api_name = "all_reduce"
    arg_names = ("op",)
    single_tensor = True
    staged_push = True  # its one pass (module doc)
    # One pass or two is chosen by size: a group default (push for the gathers, say) would
    # force one form at every size (one pass of a 1 GiB tensor at 8 ranks: 8 GiB of workspace)
    follows_group_default = False
    studied = False  # the study's strategies and the profile's sweeps do not cover it yet

    def layout(self, world: int, rank: int) -> Layout:
        return Layout(world, world, tuple(tuple((src, c) for src in range(world)) for c in range(world)))

    def bus_factor(self, world: int) -> float:
        return 2 * (world - 1) / world  # nccl-tests' all-reduce factor

    def plan_ignores_tensor_kinds(self, algorithm) -> bool:
        return True  # pushes into the peers' workspace, pulls out of it, never a peer's tensor (either form)

    def graph_workspace_bytes(self, size: int, world: int, staged_push: bool = False) -> int:
        if staged_push or one_pass(size, world):  # a slot of the whole tensor per rank
            return world * (size + WORKSPACE_ALIGN)
        return super().graph_workspace_bytes(size, world)

    def local(self, output, input, args, world, rank, device_type) -> LocalCall:
        name, scale = reduce_op("SUM" if not args or args[0] is None else args[0], world)
        in_place = check_all_reduce(output, input, device_type)
        esize = input.element_size()
        chunks = chunk_ranges(input.numel(), world, esize)
        dtype = str(input.dtype).removeprefix("torch.")
        return LocalCall(tuple(n for _, n in chunks), (chunks[rank][1],) * world, in_place,
                         AllReducePlanArgs(input.numel(), esize, dtype, scale), agreed=op_code(name, scale))

    def algorithm(self, requested, output_symmetric, call: LocalCall | None = None, world: int = 0):
        if requested is Algorithm.PULL:
            raise InvalidArgument("all_reduce runs push only: two passes (Algorithm.PUSH: into the workspace, the "
                                  "result pulled) or one (Algorithm.STAGED_PUSH)")
        if requested is None and call is not None:
            return Algorithm.STAGED_PUSH if one_pass(call.extra.numel * call.extra.esize, world) else Algorithm.PUSH
        return requested or Algorithm.PUSH

    def plan(self, world, rank, local, peers: PeerCalls, *, algorithm, stream_mode, input_symmetric,
             output_symmetric, peers_in_place) -> Schedule:
        args = local.extra
        return plan_all_reduce(world, rank, args.numel, args.esize, args.dtype, args.scale, stream_mode=stream_mode,
                               algorithm=algorithm, in_place=local.in_place)

    def plan_one_shot(self, world, rank, local, peers) -> Schedule | None:
        args = local.extra
        if not one_shot_serves(world):
            return None
        return plan_one_shot_all_reduce(world, rank, args.numel * args.esize, args.dtype, args.scale)

    def reference(self, inputs, rank, args=None):
        op = args[rank][0] if args and args[rank] and args[rank][0] is not None else "SUM"
        _, scale = reduce_op(op, len(inputs))
        return reduce_chunks([t.reshape(-1) for t in inputs], scale).to(inputs[0].dtype)


ALL_REDUCE = AllReduce()
