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
from ..collectives.base import LocalCall
from ..collectives.reduce_scatter import REDUCE_SCATTER, from_parts
from ..errors import InvalidArgument
from ..schedule.base import Algorithm
from ..validate import check_tensor

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


def _moved(group, schedule, kind: str, layout, transform):
    """The moved schedule for (agreed schedule, layout), made once: the executor keeps compiled
    programs by schedule identity, so the same call must get the same object."""
    key = (id(schedule), kind, layout)
    hit = group._moved.get(key)
    if hit is None or hit[0] is not schedule:
        if len(group._moved) >= MAX_MOVED:
            group._moved.clear()
        hit = group._moved[key] = (schedule, transform(schedule))
    return hit[1]


def all_gather_into_parts(group, output, input, parts, timeout=None, fixed_input: bool = False):
    """See :meth:`conccl.group.Group.all_gather_into_parts`."""
    if output is not None:
        local = group._local_step(ALL_GATHER, output, input, (), Algorithm.PULL, None)
    else:
        local = _flat_gather_of(group, input)
    group._check_usable()
    timeout_s = group._timeout_s(timeout)
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
    schedule, views = group._agree(local, timeout_s, peers_fixed=fixed_input and output is None)
    moved = _moved(group, schedule, "into_parts", layout, lambda s: into_parts(s, chunk, layout))
    return group._execute(moved, input, base, False, timeout_s, views)


def _flat_gather_of(group, input):
    """The local step of an all-gather of ``input`` into an output no tensor holds (the parts
    take every byte): what the peers see is a flat all-gather whose output nobody reaches."""
    ex = group.executor
    check_tensor("input", input, ex.device_type)
    nbytes = input.numel() * input.element_size()
    key = ("into_parts", input.data_ptr(), input.numel(), input.dtype, input.device, ex.views_generation,
           group.options.stream_mode, group.options.checks)
    local = group._locals.get(key)
    if local is None:
        call = LocalCall((nbytes,) * group.world, (nbytes,) * group.world, False, (nbytes, False))
        local = group._remember(key, group._local_row(ALL_GATHER, call, input.dtype, nbytes, group.world * nbytes,
                                                      (ex.peer_view(input), None), Algorithm.PULL, None))
    return local


def reduce_scatter_from_parts(group, output, parts, rows, op=None, timeout=None):
    """See :meth:`conccl.group.Group.reduce_scatter_from_parts`."""
    world, ex = group.world, group.executor
    call = REDUCE_SCATTER.local_parts(output, parts, rows, (op,), world, group.rank, ex.device_type)
    if ex.capturing():
        raise InvalidArgument("reduce_scatter_from_parts cannot be captured into a CUDA graph")
    elem = parts[0].element_size()  # what moves and is read: the parts' dtype (the output may be wider)
    # Remembered as a call's local step is (its settled plans and views with it: the executor
    # keeps compiled programs by their identity); the parts are validated on every call.
    key = ("from_parts", output.data_ptr(), output.numel(), output.dtype, parts[0].dtype, output.device,
           ex.views_generation, call.agreed, group.options.stream_mode, group.options.checks, group.options.algorithm)
    local = group._locals.get(key)
    if local is None:
        # The peers see a flat reduce-scatter: its input is this rank's own (pushed), never reached.
        local = group._remember(key, group._local_row(REDUCE_SCATTER, call, parts[0].dtype, world * output.numel() * elem,
                                                      output.numel() * output.element_size(),
                                                      (None, ex.peer_view(output)), None, None))
    group._check_usable()
    timeout_s = group._timeout_s(timeout)
    base, layout = _layout(parts, [t.numel() * elem for t in parts], [n * elem for n in rows])
    schedule, views = group._agree(local, timeout_s)
    chunk = output.numel() * elem
    moved = _moved(group, schedule, "from_parts", layout, lambda s: from_parts(s, chunk, layout))
    return group._execute(moved, base, output, False, timeout_s, views)
