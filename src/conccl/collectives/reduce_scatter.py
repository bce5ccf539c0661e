"""Reduce-scatter: rank r's output is the reduction over every rank of that rank's input chunk r.

How it moves (push, the only algorithm: the group workspace is peer-reachable on every rank,
so no input needs staging and no output needs to be symmetric)::

    rank r, call s:  release: wait DONE(s-1) of every peer · FREE(s) -> every peer
                     (the workspace half of call s-1 may be written by call s+1's pushes)
    slot of peer p:  wait FREE(s-1) of p (p's half s % 2 is free) · input[chunk p] ->
                     workspace@p[half s % 2][chunk r] · DONE(s) -> p
    slot 0:          wait DONE(s) of every peer · output = reduce(chunk r of every rank, rank order)

One one-way signal (DONE) on the critical path in steady state: FREE was sent a call ago
(double buffering, :mod:`conccl.schedule.base`).

Copy engines move every byte; the reduction is the one step that takes an SM (a small kernel
on CUDA). Order of summation: rank 0, 1, ..., world-1, accumulated in fp32 and rounded to the
dtype once. With two ranks that is NCCL's result bit for bit (one addition, commutative);
with more it is within the dtype's rounding of NCCL's ring order.
"""
from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from functools import lru_cache

from ..schedule.base import Algorithm, Buf, Copy, Phase, Reduce, Schedule, Signal, StreamMode, Transfer, WaitSignal
from ..validate import InvalidArgument, byte_range, check_pair, check_tensor, overlaps
from .base import Collective, Layout, LocalCall, PeerCalls
from .direct import build_direct_schedule, workspace_slot
from .one_shot import build_one_shot, serves as one_shot_serves

NAME = "reduce_scatter"

# dtypes the reduction kernel handles (torch's names)
DTYPES = ("bfloat16", "float16", "float32")
# (input dtype, output dtype) pairs summed into a wider result (Reduce.out_dtype): a 16-bit
# gradient reduced in fp32 (FSDP2's MixedPrecisionPolicy(reduce_dtype=torch.float32)), for
# inputs given as parts
WIDENING = (("bfloat16", "float32"), ("float16", "float32"))


@dataclass(frozen=True)
class ReduceScatterPlanArgs:
    """What a reduce-scatter's plan needs besides the peers' rows (``LocalCall.extra``): the
    bytes of each rank's chunk of the input, the input's dtype (torch's name), the op's scale,
    whether the output is the input's own chunk, and the wider dtype the chunks are summed
    into (:data:`WIDENING`; None: the input's)."""

    chunk_bytes: int
    dtype: str
    scale: float
    in_place: bool
    out_dtype: str | None


def reduce_op(op, world: int) -> tuple[str, float]:
    """(name, scale) of a ``torch.distributed.ReduceOp``: SUM, AVG (scale 1/world) or
    PREMUL_SUM(factor) (what FSDP2 passes for a gradient divide factor); others are refused."""
    kind = getattr(op, "op", op)  # a ReduceOp object (PREMUL_SUM carries a factor) or its RedOpType
    name = getattr(kind, "name", str(kind)).upper()
    if name == "SUM":
        return "sum", 1.0
    if name == "AVG":
        return "avg", 1.0 / world
    if name == "PREMUL_SUM":
        # torch >= 2.12 exposes .factor; older builds only through pickling's (op, factor) state
        factor = op.factor if hasattr(op, "factor") else op.__getstate__()[1]
        if not isinstance(factor, (int, float)):
            raise InvalidArgument("PREMUL_SUM with a tensor factor is not supported; pass a Python float factor")
        return "premul_sum", float(factor)
    raise InvalidArgument(f"reduction op {name} is not supported by conccl; use SUM, AVG or PREMUL_SUM")


def op_code(name: str, scale: float) -> int:
    """The code of a reduction op (name and factor) that every rank's call must have alike
    (:attr:`LocalCall.agreed`)."""
    return zlib.crc32(f"{name}:{scale!r}".encode())


@lru_cache(maxsize=1024)
def plan_reduce_scatter(world: int, rank: int, chunk_bytes: int, dtype: str, scale: float = 1.0, *,
                        stream_mode: StreamMode = StreamMode.PER_PEER, in_place: bool = False,
                        out_dtype: str | None = None) -> Schedule:
    """Schedule of one rank's reduce-scatter of ``chunk_bytes`` of input per rank (pure, cached).

    Every rank receives rank ``src``'s chunk in slot ``src`` of its own workspace; slots are
    :func:`~conccl.collectives.direct.workspace_slot` s so that the reduction reads 16-byte vectors whatever
    the chunk's size. ``in_place`` (the output is the input's own chunk) changes nothing in the plan:
    the reduction reads each element before writing it; it is part of the key for clarity.
    ``out_dtype``: float32 over a 16-bit input (:data:`WIDENING`): the chunks move in the
    input's dtype (half the bytes of a cast first) and are summed into fp32, the output twice
    the chunk's bytes; None: the input's dtype.
    """
    if not 0 <= rank < world:
        raise InvalidArgument(f"rank {rank} outside a world of {world}")
    if dtype not in DTYPES:
        raise InvalidArgument(f"reduce_scatter_tensor supports {', '.join(DTYPES)}, got {dtype}")
    if out_dtype == dtype:
        out_dtype = None
    if out_dtype is not None and (dtype, out_dtype) not in WIDENING:
        raise InvalidArgument(f"a reduce-scatter sums {dtype} into {dtype} or into float32 from 16 bits, not {out_dtype}")
    slot = workspace_slot(chunk_bytes)
    peers: dict[int, Transfer | None] = {}
    for p in range(world):
        if p != rank and chunk_bytes:
            peers[p] = Transfer(rank, Buf.INPUT, p * chunk_bytes, p, Buf.WORKSPACE, rank * slot, chunk_bytes,
                                0, Phase.PEER)
    finish = ()
    if chunk_bytes:
        srcs = tuple((Buf.INPUT, rank * chunk_bytes) if s == rank else (Buf.WORKSPACE, s * slot)
                     for s in range(world))
        finish = (Reduce((Buf.OUTPUT, 0), srcs, chunk_bytes, dtype, scale, out_dtype=out_dtype),)
    # Pushes into the peers' workspace halves (guarded by their FREE), and a wait for their
    # writes of this call before reducing.
    return build_direct_schedule(
        NAME, world, rank, algorithm=Algorithm.PUSH, stream_mode=stream_mode, peer_transfers=peers,
        stage=None, local=None, staged=True, workspace_bytes=world * slot, wait_done=True, finish=finish,
        into_workspace=True)


@lru_cache(maxsize=1024)
def plan_one_shot_reduce_scatter(world: int, rank: int, chunk: int, dtype: str, scale: float) -> Schedule:
    """One rank's one-shot reduce-scatter (:mod:`conccl.collectives.one_shot`): every rank
    stages its whole input; each sums chunk ``rank`` of every rank's, in rank order."""
    return build_one_shot(NAME, world, rank, world * chunk, {}, (rank * chunk, 0, chunk, dtype, scale))


def check_reduce_scatter(output, input, world: int, rank: int, device_type: str) -> bool:
    """Validate arguments; return True when the output is the input's own chunk (in place)."""
    check_pair(output, input, device_type)
    if str(input.dtype).removeprefix("torch.") not in DTYPES:
        raise InvalidArgument(f"reduce_scatter_tensor supports {', '.join(DTYPES)}, got {input.dtype}")
    if input.numel() != world * output.numel():
        raise InvalidArgument(
            f"reduce_scatter_tensor: input has {input.numel()} elements, expected world_size ({world}) x "
            f"output ({output.numel()}) = {world * output.numel()}")
    if not overlaps(output, input):
        return False
    chunk = output.numel() * output.element_size()
    offset = byte_range(output)[0] - byte_range(input)[0]
    if offset != rank * chunk:
        raise InvalidArgument(
            f"output overlaps input but is not its chunk for rank {rank} (byte offset {offset}, expected {rank * chunk})")
    return True


class ReduceScatter(Collective):
    """``reduce_scatter_tensor(output, input, op=SUM)``: output on rank r = op over ranks of
    their input chunk r (input = world chunks of the output's size)."""

    name = NAME
    api_name = "reduce_scatter_tensor"
    arg_names = ("op",)
    studied = False  # the study's strategies and the profile's sweeps do not cover it yet

    def layout(self, world: int, rank: int) -> Layout:
        return Layout(world, 1, (tuple((src, rank) for src in range(world)),), in_place_chunk=None)

    def bandwidth_bytes(self, size: int, world: int) -> int:
        # nccl-tests sizes a reduce-scatter by its input: world x the output
        return self.input_bytes(size, world)

    def local(self, output, input, args, world, rank, device_type) -> LocalCall:
        name, scale = reduce_op("SUM" if not args or args[0] is None else args[0], world)
        in_place = check_reduce_scatter(output, input, world, rank, device_type)
        chunk = output.numel() * output.element_size()
        dtype = str(input.dtype).removeprefix("torch.")
        return LocalCall((chunk,) * world, (chunk,) * world, in_place,
                         ReduceScatterPlanArgs(chunk, dtype, scale, in_place, None), agreed=op_code(name, scale))

    def algorithm(self, requested, output_symmetric, call=None, world=0):
        if requested is Algorithm.PULL:
            raise InvalidArgument("reduce_scatter_tensor runs push only (into the peers' workspace)")
        return Algorithm.PUSH

    def local_parts(self, output, parts, rows, args, world, rank, device_type) -> LocalCall:
        """:meth:`local` for an input given as parts (see :func:`from_parts`): ``parts[i]``
        holds the first ``parts[i].numel()`` of ``world * rows[i]`` elements (the rest is
        padding), row ``d`` of every part, in order, making the chunk rank ``d`` reduces."""
        name, scale = reduce_op("SUM" if not args or args[0] is None else args[0], world)
        check_tensor("output", output, device_type)
        out_dtype = str(output.dtype).removeprefix("torch.")
        if out_dtype not in DTYPES:
            raise InvalidArgument(f"reduce_scatter_tensor supports {', '.join(DTYPES)}, got {output.dtype}")
        if len(parts) != len(rows) or not parts:
            raise InvalidArgument(f"{len(parts)} parts and {len(rows)} row sizes: one row size per part, at least one")
        in_dtype = parts[0].dtype
        dtype = str(in_dtype).removeprefix("torch.")
        if dtype != out_dtype and (dtype, out_dtype) not in WIDENING:
            raise InvalidArgument(f"parts of {in_dtype} reduce into an output of their dtype, or of float32 from "
                                  f"bfloat16 or float16; the output is {output.dtype}")
        for i, (t, n) in enumerate(zip(parts, rows)):
            check_tensor(f"parts[{i}]", t, device_type)
            if t.dtype != in_dtype or t.device != output.device:
                raise InvalidArgument(f"parts[{i}] is {t.dtype} on {t.device}, parts[0] {in_dtype}, the output on "
                                      f"{output.device}")
            if not 0 <= t.numel() <= world * n:
                raise InvalidArgument(f"parts[{i}] has {t.numel()} elements, more than {world} rows of {n}")
            if overlaps(t, output):
                raise InvalidArgument(f"parts[{i}] overlaps the output")
        if sum(rows) != output.numel():
            raise InvalidArgument(f"rows of {sum(rows)} elements in all, the output has {output.numel()}")
        chunk = output.numel() * parts[0].element_size()  # what moves: the parts' dtype
        widen = out_dtype if dtype != out_dtype else None
        # A widening call is its own op to the peers: a flat call (or parts of another dtype) stops alike
        return LocalCall((chunk,) * world, (chunk,) * world, False,
                         ReduceScatterPlanArgs(chunk, dtype, scale, False, widen),
                         agreed=op_code(name if widen is None else f"{name}->{widen}", scale))

    def plan(self, world, rank, local, peers: PeerCalls, *, algorithm, stream_mode, input_symmetric,
             output_symmetric, peers_in_place) -> Schedule:
        args = local.extra
        return plan_reduce_scatter(world, rank, args.chunk_bytes, args.dtype, args.scale, stream_mode=stream_mode,
                                   in_place=args.in_place, out_dtype=args.out_dtype)

    def plan_one_shot(self, world, rank, local, peers) -> Schedule | None:
        args = local.extra
        if not one_shot_serves(world) or args.out_dtype is not None:  # a widening call (parts into fp32): never
            return None
        return plan_one_shot_reduce_scatter(world, rank, args.chunk_bytes, args.dtype, args.scale)

    def reference(self, inputs, rank, args=None):
        world = len(inputs)
        op = args[rank][0] if args and args[rank] and args[rank][0] is not None else "SUM"
        _, scale = reduce_op(op, world)
        return reduce_chunks([t.reshape(world, -1)[rank] for t in inputs], scale).to(inputs[0].dtype)


def from_parts(schedule: Schedule, chunk: int, parts: tuple[tuple[int, int, int, int], ...]) -> Schedule:
    """``schedule``, a reduce-scatter of ``chunk`` bytes per rank, with its input given as
    parts instead of one flat tensor (FSDP's per-parameter gradients, with no copy-in before):
    part ``i`` = (``off``, ``n``, ``src``, ``valid``) is bytes [off, off + n) of every rank's
    chunk, rank d's at input offset ``src + d * n``; only its first ``valid`` bytes exist (the
    rest is FSDP's padding, never copied: what it reduces to is unspecified). Peer copies keep
    their slot and signals. The own chunk, which the reduction read from the input, is copied
    into the own workspace slot (no peer writes it in this call) on the reduction's slot, after
    the peers' DONE of the previous call, and reduced from there: the same operands in the same
    order, so the same bits. A pure function of plain data, as the plans are."""
    if schedule.algorithm is not Algorithm.PUSH:
        raise InvalidArgument("from_parts retargets a push reduce-scatter")
    rank = schedule.rank
    slot = workspace_slot(chunk)

    def pieces(t: Transfer, row: int, within: int):
        for off, n, src, valid in parts:
            a = max(within, off)
            b = min(within + t.nbytes, off + n, off + max(0, valid - row * n))
            if a < b:
                yield dataclasses.replace(t, src_offset=src + row * n + a - off, dst_offset=t.dst_offset + a - within,
                                          nbytes=b - a)

    slots, home = [], None
    for k, ops in enumerate(schedule.slots):
        out = []
        for op in ops:
            if isinstance(op, Copy) and op.transfer.src is Buf.INPUT and op.transfer.src_rank == rank:
                t = op.transfer
                out += [Copy(p) for p in pieces(t, *divmod(t.src_offset, chunk))]
            elif isinstance(op, Reduce):
                own = (Buf.INPUT, rank * chunk)
                if own not in op.srcs:
                    raise InvalidArgument("from_parts: the reduction does not read the own chunk from the input")
                home = (k, len(out))
                out.append(dataclasses.replace(op, srcs=tuple((Buf.WORKSPACE, rank * slot) if s == own else s
                                                              for s in op.srcs)))
            else:
                out.append(op)
        slots.append(out)
    if home is None:
        return dataclasses.replace(schedule, slots=tuple(tuple(s) for s in slots), parts=True)  # an empty chunk
    k = home[0]
    whole = Transfer(rank, Buf.INPUT, rank * chunk, rank, Buf.WORKSPACE, rank * slot, chunk, k, Phase.LOCAL)
    own = [Copy(p) for p in pieces(whole, rank, 0)]
    # The own slot is in this call's workspace half, which the release of the previous call
    # freed (DONE(s-2) of every peer: double buffering); kept after this call's release all
    # the same. Before the waits for this call's DONE (so, in one stream, after this rank's
    # DONE to its peers: the own copy never delays a peer's reduction), else just before the
    # reduction.
    ops = slots[k]
    waits = [i for i, op in enumerate(ops) if isinstance(op, WaitSignal) and op.kind is Signal.DONE and op.seq_delta == 0]
    at = waits[0] if waits else home[1]
    after = [i for i, op in enumerate(ops) if isinstance(op, WaitSignal) and op.kind is Signal.DONE and op.seq_delta < 0]
    if after and at <= after[-1]:
        raise InvalidArgument("from_parts: the schedule waits for the previous call after its reduction's inputs")
    ops[at:at] = own
    return dataclasses.replace(schedule, slots=tuple(tuple(s) for s in slots), parts=True)


def reduce_chunks(chunks, scale: float = 1.0):
    """The reduction every executor performs: operands in order, each times ``scale``,
    accumulated in fp32 (returned as fp32; the caller rounds to the dtype once)."""
    acc = chunks[0].float() * scale if scale != 1.0 else chunks[0].float()
    for c in chunks[1:]:
        acc = acc + (c.float() * scale if scale != 1.0 else c.float())
    return acc


REDUCE_SCATTER = ReduceScatter()
