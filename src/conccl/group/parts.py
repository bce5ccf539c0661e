"""FSDP's collectives without FSDP's copies: an all-gather whose bytes land in many tensors,
and a reduce-scatter whose input is many tensors.

FSDP2 packs every parameter of a module into one flat buffer around each collective: the
gradients are copied *into* the reduce-scatter's input (``chunk_cat``), the gathered shards
copied *out of* the all-gather's output into each parameter (``split_with_sizes_copy``), both
on SMs and on the critical path. Copy engines move a byte range as easily from (or into) one
tensor as from another, so here the agreed flat collective's schedule is retargeted (a pure
transform, :func:`~conccl.collectives.all_gather.into_parts` and
:func:`~conccl.collectives.reduce_scatter.from_parts`) to read or write the parts where they
are, and the flat copy never exists. The peers agree on the flat call (their rows are a flat
call's), so a rank using parts and a rank using a flat tensor interoperate.

Blocking, on the caller's stream, never captured. The parts are this rank's own memory: a
peer reaches only the all-gather's flat input (peer-mapped) and the group's workspace.
"""
from __future__ import annotations

from ..collectives.all_gather import ALL_GATHER, into_parts
from ..collectives.reduce_scatter import REDUCE_SCATTER, from_parts
from ..errors import InvalidArgument
from ..schedule.base import Algorithm
from ..validate import check_tensor

__all__ = ["MAX_MOVED", "all_gather_into_parts", "moved_schedule", "reduce_scatter_from_parts"]

# moved schedules kept per group: one per FSDP collective of a step (three per layer)
MAX_MOVED = 1024


def _layout(parts, sizes, rows):
    """(lowest-address non-empty part, ((row offset, row bytes, part offset from it, bytes), ...))."""
    filled = [t for t, n in zip(parts, sizes) if n]
    if not filled:
        raise InvalidArgument("at least one part must be non-empty")
    base = min(filled, key=lambda t: t.data_ptr())  # an empty part's address means nothing
    offs, layout = 0, []
    for t, n, row in zip(parts, sizes, rows):
        if n:
            layout.append((offs, row, t.data_ptr() - base.data_ptr(), n))
        offs += row
    return base, tuple(layout)


def moved_schedule(group, schedule, kind: str, layout, transform):
    """The moved schedule for (agreed schedule, layout), made once (``transform(schedule)``)
    and kept in ``group.moved_schedules``: the executor keeps compiled programs by schedule
    identity, so the same call must get the same object."""
    memo = group.moved_schedules
    key = (id(schedule), kind, layout)
    hit = memo.get(key)
    if hit is None or hit[0] is not schedule:
        if len(memo) >= MAX_MOVED:
            memo.clear()
        hit = memo[key] = (schedule, transform(schedule))
    return hit[1]


def all_gather_into_parts(group, output, input, parts, timeout=None, fixed_input: bool = False):
    """An all-gather of ``input`` (each rank's chunk of ``output``, in place) whose bytes land
    in ``parts`` instead of ``output``: ``parts[i]`` is a tensor of ``world * n_i`` bytes'
    worth that takes the i-th ``n_i`` bytes of every rank's chunk, rank r's at row r.
    ``output`` is only read by the peers (it should be peer-reachable: a pool block); the
    parts are this rank's alone. ``output`` None: no flat output at all, the peers read
    ``input`` itself (it should be peer-reachable: FSDP's sharded parameters moved into a
    pool block, ``conccl.fsdp.copy_free``). Blocking, on the caller's stream, never captured. For FSDP
    (``conccl.fsdp``, ``direct=True``): each parameter's unsharded tensor filled straight from
    the peers, with no copy-out (the module doc). ``fixed_input`` (with ``output``
    None): every rank passes the same peer-reachable input at every call (FSDP's homes), so
    a settled call may post its row without waiting for the peers' (Options.post_settled)."""
    if output is not None:
        local = group.local_steps.step(ALL_GATHER, output, input, (), Algorithm.PULL, None)
    else:
        local = _flat_gather_of(group, input)
    group.check_usable()
    timeout_s = group.timeout_s(timeout)
    if group.executor.capturing():
        raise InvalidArgument("all_gather_into_parts cannot be captured into a CUDA graph")
    world = group.world
    chunk = input.numel() * input.element_size()
    sizes = [t.numel() * t.element_size() for t in parts]
    if sum(sizes) != world * chunk or any(n % world for n in sizes):
        raise InvalidArgument(f"parts of {sizes} bytes do not split a chunk of {chunk} bytes per rank over {world} ranks")
    if any(not t.is_contiguous() or t.device != input.device for t in parts):
        raise InvalidArgument("every part must be a contiguous tensor on the input's device")
    base, layout = _layout(parts, sizes, [n // world for n in sizes])
    layout = tuple((off, n, dst) for off, n, dst, _ in layout)
    # From a fixed input (FSDP's homes: every rank's made alike once, never moved), a settled
    # call may post its row without waiting for the peers' (Options.post_settled).
    schedule, views = group.agree_call(local, timeout_s, peers_fixed=fixed_input and output is None)
    moved = moved_schedule(group, schedule, "into_parts", layout, lambda s: into_parts(s, chunk, layout))
    return group.execute(moved, input, base, False, timeout_s, views)


def _flat_gather_of(group, input):
    """The local step of an all-gather of ``input`` into an output no tensor holds (the parts
    take every byte): what the peers see is a flat all-gather whose output nobody reaches."""
    ex, steps = group.executor, group.local_steps
    check_tensor("input", input, ex.device_type)
    nbytes = input.numel() * input.element_size()
    key = ("into_parts", input.data_ptr(), input.numel(), input.dtype, input.device, ex.views_generation,
           group.options.stream_mode, group.options.checks)
    local = steps.lookup(key)
    if local is None:
        call = ALL_GATHER.local_for(nbytes, group.world)
        local = steps.remember(key, steps.from_call(ALL_GATHER, call, input.dtype, nbytes, group.world * nbytes,
                                                    (ex.peer_view(input), None), Algorithm.PULL, None))
    return local


def reduce_scatter_from_parts(group, output, parts, rows, op=None, timeout=None):
    """A reduce-scatter into ``output`` whose input is ``parts`` instead of one flat tensor:
    ``parts[i]`` (contiguous, one dtype: the output's, or bf16/fp16 summed into an fp32
    output, each widened exactly; on the output's device) is ``world`` rows of ``rows[i]``
    elements, of which only its first ``parts[i].numel()`` exist (the rest is padding: what
    it reduces to in ``output`` is unspecified); the flat input it stands for is row ``d``
    of every part, in order, for rank ``d`` (FSDP's ``chunk_cat``), so ``sum(rows)`` is the
    output's size. ``op``: as :func:`conccl.reduce_scatter_tensor` (None: SUM). The peers
    see a flat reduce-scatter and may make one (not where this call widens: its chunks move
    in 16 bits, so every rank's call must widen alike). The same bits as the flat call (of
    the parts cast to fp32, where it widens). Blocking,
    on the caller's stream, never captured; the parts are read by this rank's copy engines
    until the caller's stream passes the call. For FSDP (``direct=True``): the gradients
    reduced where autograd left them, with no copy-in (the module doc)."""
    world, ex, steps = group.world, group.executor, group.local_steps
    call = REDUCE_SCATTER.local_parts(output, parts, rows, (op,), world, group.rank, ex.device_type)
    if ex.capturing():
        raise InvalidArgument("reduce_scatter_from_parts cannot be captured into a CUDA graph")
    elem = parts[0].element_size()  # what moves and is read: the parts' dtype (the output may be wider)
    # Remembered as a call's local step is (its settled plans and views with it: the executor
    # keeps compiled programs by their identity); the parts are validated on every call.
    key = ("from_parts", output.data_ptr(), output.numel(), output.dtype, parts[0].dtype, output.device,
           ex.views_generation, call.agreed, group.options.stream_mode, group.options.checks, group.options.algorithm)
    local = steps.lookup(key)
    if local is None:
        # The peers see a flat reduce-scatter: its input is this rank's own (pushed), never reached.
        local = steps.remember(key, steps.from_call(REDUCE_SCATTER, call, parts[0].dtype, world * output.numel() * elem,
                                                    output.numel() * output.element_size(),
                                                    (None, ex.peer_view(output)), None, None))
    group.check_usable()
    timeout_s = group.timeout_s(timeout)
    base, layout = _layout(parts, [t.numel() * elem for t in parts], [n * elem for n in rows])
    schedule, views = group.agree_call(local, timeout_s)
    chunk = output.numel() * elem
    moved = moved_schedule(group, schedule, "from_parts", layout, lambda s: from_parts(s, chunk, layout))
    return group.execute(moved, base, output, False, timeout_s, views)
