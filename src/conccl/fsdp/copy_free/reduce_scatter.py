"""The reduce-scatter half of FSDP2 without its copies (see :mod:`conccl.fsdp.copy_free`): FSDP
gets a placeholder packed input that owns no memory, and each gradient's rows are pushed from
where autograd left them into the peers' workspaces (no ``chunk_cat`` copy-in)."""
from __future__ import annotations

import functools
import inspect

import torch

from ... import api
from ...collectives.reduce_scatter import REDUCE_SCATTER, WIDENING
from ._state import COUNTS, ORIGINAL
from .gather import _numel

COPY_IN_ARGS = ("unsharded_grads", "reduce_scatter_input", "world_size")
_PARTS = "_conccl_parts"  # set on a reduce-scatter input placeholder: its _Parts
# Reduction dtypes FSDP2 divides no reduce-scatter input of (it passes AVG or PREMUL_SUM)
_UNDIVIDED = (torch.float32, torch.bfloat16)


class _Parts:
    """What a reduce-scatter input placeholder stands for: the gradients and their rows (the
    direct path), or, where the copy-in had to run, the real packed input."""

    def __init__(self):
        self.grads = self.rows = self.flat = None


def _reduce_arg(name: str, args, kwargs):
    """One argument of a ``foreach_reduce`` call, by name, positional or keyword (FSDP passes
    them positionally); its default where not passed. No signature binding: once per layer."""
    if name in kwargs:
        return kwargs[name]
    at, default = _REDUCE_PARAMETERS()[name]
    return args[at] if at < len(args) else default


# The gradients of the last direct reductions per device, with the reduce-scatter stream's event
# after them. Marking them with record_stream instead kept each freed gradient's block from the
# compute stream until the caching allocator saw the event complete, in host time, while the host
# runs far ahead in backward: new segments every layer (3.6 GiB reserved and unallocated at
# 2048 tokens). Held here, they are dropped on the
# compute stream after it waits for that event (FSDP keeps its packed input the same way): at
# the next reduction, and at the end of the backward pass.
_HELD: dict = {}  # device index -> [(gradients, the reduce-scatter's event, the stream they were made on)]
_QUEUED: dict = {}  # device index -> the backward pass (graph task id) whose end releases its gradients


def _hold(grads, stream, made_on) -> None:
    """Keep ``grads`` (made on ``made_on``, read by the reduction just queued on ``stream``)
    until released."""
    device = grads[0].device
    _HELD.setdefault(device.index, []).append((tuple(grads), stream.record_event(), made_on))
    task = _backward_pass()
    # once per backward pass; a pass that raised dropped its callback, so the next one queues its own
    if task is not None and _QUEUED.get(device.index) != task:
        try:
            _at_backward_end(functools.partial(release_held, device, from_callback=True))
            _QUEUED[device.index] = task
        except RuntimeError:  # not inside a backward pass: the next reduction releases them
            pass


def _backward_pass():
    """The id of the backward pass under way (autograd's graph task), None outside one."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    task = current() if current is not None else 0
    return None if task < 0 else task


def _at_backward_end(fn) -> None:
    """Run ``fn`` when the backward pass under way ends (as FSDP's own final callback);
    RuntimeError outside one."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def release_held(device, from_callback: bool = False) -> None:
    """Each held gradient's stream waits for its reduction, then the gradients are dropped:
    their blocks are reused in that stream's order."""
    if from_callback:
        _QUEUED.pop(device.index, None)
    for _grads, event, made_on in _HELD.pop(device.index, ()):
        made_on.wait_event(event)


def _reduce(*args, **kwargs):
    comm = _reduce_arg("reduce_scatter_comm", args, kwargs)
    if not isinstance(comm, DirectReduceScatter):
        return ORIGINAL["foreach_reduce"](*args, **kwargs)
    grads = _reduce_arg("unsharded_grads", args, kwargs)
    if grads and grads[0].is_cuda:  # on the stream the gradients were made on (post-backward's)
        release_held(grads[0].device)  # the last reduction's gradients go
        comm.made_on = torch.cuda.current_stream(grads[0].device)
    call = {name: _reduce_arg(name, args, kwargs) for name in ("reduce_scatter_group", "all_reduce_group",
                                                                 "all_reduce_hook")}
    group = call["reduce_scatter_group"]
    # The padding rows of a direct reduction's output are not zeros (FSDP's copy-in zero-pads):
    # only FSDP's own views of it are used, except by an all-reduce (HSDP) or a user's hook,
    # which get the whole buffer. Those keep FSDP's copy-in.
    if group is None or group.size() < 2:  # FSDP reduces nothing
        return ORIGINAL["foreach_reduce"](*args, **kwargs)
    if call["all_reduce_group"] is not None or call["all_reduce_hook"] is not None:
        COUNTS.declined_reduces += 1
        return ORIGINAL["foreach_reduce"](*args, **kwargs)
    comm.expect_input = True  # foreach_reduce's first allocation is the packed input
    try:
        return ORIGINAL["foreach_reduce"](*args, **kwargs)
    finally:
        comm.expect_input = False


def _padded_rows(shape, world: int) -> int:
    """Elements per rank of a gradient FSDP pads on dim 0 (its ``_get_dim0_padded_size``)."""
    return -(-shape[0] // world) * _numel(shape[1:]) if len(shape) else 1


def _copy_in(unsharded_grads, reduce_scatter_input, world_size):
    parts = getattr(reduce_scatter_input, _PARTS, None)
    if parts is None:
        return ORIGINAL["foreach_reduce_scatter_copy_in"](unsharded_grads, reduce_scatter_input, world_size)
    x = reduce_scatter_input
    # FSDP's copy-in casts gradients of another dtype than the reduction's (reduce_dtype): a
    # 16-bit gradient reduced in fp32 is summed into fp32 where it lies instead (the reduction
    # widens each operand exactly, as the cast would), and moves in half the bytes
    dtype = unsharded_grads[0].dtype if unsharded_grads else x.dtype
    same = dtype == x.dtype or (_name(dtype), _name(x.dtype)) in WIDENING
    if world_size > 1 and same and all(g.dtype == dtype and g.device == x.device and g.is_contiguous() and g.dim() >= 1
                                       for g in unsharded_grads):
        parts.grads = list(unsharded_grads)  # FSDP clears its list next: these keep them
        parts.rows = [_padded_rows(g.shape, world_size) for g in unsharded_grads]
        COUNTS.skipped_copy_ins += 1
        return None
    # FSDP's own copy-in into a real packed input, as FSDP would allocate it (current stream)
    parts.flat = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    COUNTS.declined_reduces += 1
    return ORIGINAL["foreach_reduce_scatter_copy_in"](unsharded_grads, parts.flat, world_size)


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.lru_cache(maxsize=1)
def _REDUCE_PARAMETERS():  # noqa: N802 - a constant, made once FSDP2's function is known
    """name -> (position, default) of ``foreach_reduce``'s parameters."""
    return {name: (i, None if p.default is inspect.Parameter.empty else p.default)
            for i, (name, p) in enumerate(inspect.signature(ORIGINAL["foreach_reduce"]).parameters.items())}


class DirectReduceScatter:
    """FSDP2's reduce-scatter hook that reduces the gradients where autograd left them.

    ``reduce(output, grads, rows, group, op)`` does the reducing (default: conccl's copy
    engines, ``Group.reduce_scatter_from_parts``); ``flat(output, input, group, op)`` the plain
    reduce-scatter where FSDP's copy-in ran (default: conccl's). The packed input FSDP asks
    for is a placeholder owning no memory (its one element repeated: ``expand``) wherever the
    direct path can run: the gradients stand in for it. They are kept until the compute stream
    waits for the reduction (``_HELD``: at the next reduction and at the end of the backward
    pass), where FSDP frees them right after its copy-in."""

    def __init__(self, pool=None, reduce=None, flat=None):
        self.pool = pool  # unused: nothing here needs to be peer-mapped (the reduce-scatter pushes)
        self.reduce = reduce or _copy_engine_reduce
        self.flat = flat or _copy_engine_flat
        self.expect_input = False  # set by the foreach_reduce wrap: the next allocation is the input
        self.made_on = None  # the stream foreach_reduce was called on: the gradients' (set by the wrap)

    def allocate(self, size, *, dtype, device):
        if self.expect_input:
            self.expect_input = False
            if dtype in _UNDIVIDED:
                t = torch.empty(1, dtype=dtype, device=device).expand(*size)
                setattr(t, _PARTS, _Parts())
                return t
            COUNTS.declined_reduces += 1  # FSDP divides this dtype's packed input before reducing it
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        # Ordered on FSDP's reduce-scatter stream, returning None (see conccl.fsdp's hooks).
        parts = getattr(input_tensor, _PARTS, None)
        if parts is None:
            self.flat(output_tensor, input_tensor, group, op)
        elif parts.grads is None:
            self.flat(output_tensor, parts.flat, group, op)
        else:
            grads, parts.grads = parts.grads, None
            try:
                self.reduce(output_tensor, grads, parts.rows, group, op)
            finally:  # read there until this stream passes the call, and FSDP dropped them: held
                if output_tensor.is_cuda and grads:  # (also where the call raised midway)
                    stream = torch.cuda.current_stream(output_tensor.device)
                    _hold(grads, stream, self.made_on or stream)
        return None


def _copy_engine_reduce(output, grads, rows, group, op) -> None:
    api.get_group(group).reduce_scatter_from_parts(output, grads, rows, op)


def _copy_engine_flat(output, input, group, op) -> None:
    api.get_group(group).call(REDUCE_SCATTER, output, input, (op,))
