"""FSDP2's all-gather without its copy-out: ``conccl.fsdp.enable(model, direct=True)``.

FSDP gathers every parameter's shard into one flat buffer and then, on the compute stream,
copies each parameter's rows out of it into that parameter's unsharded tensor
(``torch.ops.fsdp.split_with_sizes_copy``): a pass over every gathered byte in front of the
computation that needs it. Here the all-gather fills the unsharded tensors themselves: the
peers' shards are pulled by the copy engines straight from their flat buffers into this rank's
per-parameter tensors (:meth:`conccl.group.Group.all_gather_into_parts`), and the copy-out is
skipped. FSDP2's public hooks do not reach the per-parameter tensors (FSDP makes them in the
copy-out, after the hook ran), so two functions of ``_fsdp_param_group`` are wrapped:

- ``foreach_all_gather`` tells a :class:`DirectAllGather` hook which parameters it gathers; the
  hook makes their unsharded tensors on the all-gather stream (as FSDP would in the copy-out)
  and fills them;
- ``foreach_all_gather_copy_out``, for a gather so done, only orders the current stream after
  it and tells the caching allocator the tensors are used there (``record_stream``: FSDP frees
  them on that stream).

Anything else (another hook, a parameter sharded on another dim, an all-gather extension,
mixed all-gather dtypes) takes FSDP's own path. The wrap is installed only where this PyTorch's
functions have the signatures it was written against (:func:`supported`); elsewhere
``enable(direct=True)`` warns once and keeps the hook-only path.
"""
from __future__ import annotations

import inspect

import torch
import torch.distributed as dist

from . import api
from .collectives.all_gather import ALL_GATHER

try:  # FSDP2's internals this wraps (PyTorch 2.10 - 2.13)
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState
except ImportError:  # pragma: no cover - older PyTorch: supported() says so
    _fsdp_collectives = _fsdp_param_group = ShardedState = None

_GATHER_ARGS = ("fsdp_params", "group", "async_op", "all_gather_copy_in_stream", "all_gather_stream", "device",
                "all_gather_comm")
_COPY_OUT_ARGS = ("all_gather_result", "fsdp_params", "group")
_DIRECT = "_conccl_direct"  # set on a flat all-gather output whose gather filled the parameters

# Since import, for tests and benchmarks: copy-outs skipped, and gathers a DirectAllGather left
# to FSDP's own path (parameters it cannot fill itself).
skipped_copy_outs = 0
declined_gathers = 0


def supported() -> str | None:
    """None where the wrap can be installed; otherwise why not."""
    if _fsdp_param_group is None:
        return f"PyTorch {torch.__version__} has no FSDP2 internals to wrap"
    for mod, name, args in ((_fsdp_collectives, "foreach_all_gather", _GATHER_ARGS),
                            (_fsdp_collectives, "foreach_all_gather_copy_out", _COPY_OUT_ARGS)):
        fn = getattr(mod, name, None)
        if fn is None or tuple(inspect.signature(fn).parameters) != args:
            return f"PyTorch {torch.__version__}'s FSDP2 {name} is not the one conccl's direct gather wraps"
        if getattr(_fsdp_param_group, name, None) not in (fn, _WRAPS.get(name)):
            return f"PyTorch {torch.__version__}'s FSDP2 param group does not call {name} as expected"
    return None


def _gather(*args, **kwargs):
    comm = kwargs.get("all_gather_comm", args[6] if len(args) > 6 else None)
    if not isinstance(comm, DirectAllGather):
        return _fsdp_collectives.foreach_all_gather(*args, **kwargs)
    comm.pending = kwargs.get("fsdp_params", args[0] if args else None)
    try:
        return _fsdp_collectives.foreach_all_gather(*args, **kwargs)
    finally:
        comm.pending = None


def _copy_out(all_gather_result, fsdp_params, group):
    global skipped_copy_outs
    out = all_gather_result.all_gather_output
    if not getattr(out, _DIRECT, False):
        return _fsdp_collectives.foreach_all_gather_copy_out(all_gather_result, fsdp_params, group)
    # What the copy-out does besides its copies: order the current stream after the gather.
    stream = torch.cuda.current_stream(out.device) if out.is_cuda else None
    if all_gather_result.all_gather_event is not None and stream is not None:
        stream.wait_event(all_gather_result.all_gather_event)
    if isinstance(all_gather_result.all_gather_work, dist.distributed_c10d.Work):
        all_gather_result.all_gather_work.wait()
    if stream is not None:  # made on the all-gather stream, used and freed on this one
        for p in fsdp_params:
            for t in p.all_gather_outputs:
                t.record_stream(stream)
    skipped_copy_outs += 1


_WRAPS = {"foreach_all_gather": _gather, "foreach_all_gather_copy_out": _copy_out}


def install() -> str | None:
    """Wrap FSDP2's two functions (once; idempotent). None if installed, else why not."""
    why = supported()
    if why is None:
        for name, fn in _WRAPS.items():
            setattr(_fsdp_param_group, name, fn)
    return why


def parameter_outputs(fsdp_params, input, world: int):
    """Each parameter's unsharded tensor, made (or re-sized) now on the current stream, as
    FSDP's copy-out would; None where the parameters are not plain dim-0 shards of one dtype
    whose sizes add up to ``input`` (FSDP's own path then runs)."""
    if fsdp_params is None or input.dtype == torch.uint8:  # uint8: FSDP's view for mixed dtypes
        return None
    sizes = []
    for p in fsdp_params:
        if (p.fsdp_placement.dim != 0 or p.offload_to_cpu
                or hasattr(p._sharded_local_tensor, "fsdp_pre_all_gather")):
            return None
        shard = p._sharded_param_data if p.sharded_state == ShardedState.SHARDED else p._sharded_post_forward_param_data
        sizes.append(shard.numel())
    if sum(sizes) != input.numel():
        return None
    for p, n in zip(fsdp_params, sizes):  # every check before anything is allocated here
        have = p.all_gather_outputs
        if have and (len(have) != 1 or have[0].dtype != input.dtype or have[0].numel() != world * n):
            return None
    outs = []
    for p, n in zip(fsdp_params, sizes):
        p.init_all_gather_outputs([n], [input.dtype], world, input.device)
        p.alloc_all_gather_outputs()
        outs.append(p.all_gather_outputs[0])
    return outs


class DirectAllGather:
    """FSDP2's all-gather hook that fills each parameter's unsharded tensor itself.

    ``gather(output, input, group, parts)`` does the filling (default: conccl's copy engines,
    ``Group.all_gather_into_parts``); ``allocate`` takes the flat buffer from ``pool`` (peer-
    mapped: the peers pull from it). Where :func:`parameter_outputs` declines, a plain conccl
    all-gather into the flat buffer runs and FSDP copies out as usual."""

    def __init__(self, pool=None, gather=None):
        self.pool = pool
        self.gather = gather or _copy_engine_gather
        self.pending = None  # the parameters of the all-gather under way (set by the wrap)

    def allocate(self, size, *, dtype, device):
        if self.pool is None:
            return torch.empty(*size, dtype=dtype, device=device)
        return self.pool.allocate(size, dtype, device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        global declined_gathers
        parts = parameter_outputs(self.pending, input_tensor, group.size())
        if parts is None:
            declined_gathers += 1
            self.gather(output_tensor, input_tensor, group, None)
            return None
        self.gather(output_tensor, input_tensor, group, parts)
        setattr(output_tensor, _DIRECT, True)
        return None


def _copy_engine_gather(output, input, group, parts) -> None:
    g = api.get_group(group)
    if parts is None:
        g.call(ALL_GATHER, output, input)
    else:
        g.all_gather_into_parts(output, input, parts)
