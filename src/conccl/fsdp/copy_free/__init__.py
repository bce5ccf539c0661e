"""FSDP2's collectives without its copies: ``conccl.fsdp.enable(model, direct=True)``.

FSDP packs every parameter of a module into one flat buffer around each collective, with an
SM kernel each time:

- before the all-gather, on the copy-in stream, it copies every shard into the gathered
  buffer's own chunk (``_foreach_copy_``);
- after the all-gather, on the compute stream, it copies each parameter's rows out of the
  gathered buffer into that parameter's unsharded tensor (``split_with_sizes_copy``);
- before the reduce-scatter, on the compute stream, it copies every gradient, padded, into
  the reduce-scatter's input (``chunk_cat``).

Here none of them runs. Each module's sharded parameters live in one peer-readable *home*
(:class:`.gather._Home`) laid out as FSDP's all-gather input; the all-gather pulls each peer's shards
from its home straight into this rank's per-parameter tensors
(:meth:`conccl.group.Group.all_gather_into_parts`, no flat output at all); the reduce-scatter
pushes each gradient's rows straight from where autograd left them into the peers' workspaces
(:meth:`conccl.group.Group.reduce_scatter_from_parts`). FSDP2's public hooks do not reach the
shards or the per-parameter tensors (FSDP copies in before the hook, makes the tensors in the
copy-out after it, and passes the reduce-scatter hook only the packed input), so four FSDP2
functions are wrapped, and one method (``FSDPParam.free_unsharded_param``: the pools'
stream-ordered reuse, :mod:`.reuse`):

- ``foreach_all_gather``: for a :class:`DirectAllGather` hook whose module's shards can live in
  a home, the wrap itself gathers on FSDP's streams (:func:`.gather._gather_from_home`): it moves any
  shard not at home yet into it, makes the unsharded tensors on the all-gather stream (as FSDP
  would in the copy-out) and fills them. Where FSDP casts the shards before the gather (mixed
  precision: ``param_dtype``), the home is a *cast home* in the gathered dtype: the shards stay
  where they are and each gather first casts them into it (one copy, as FSDP's copy-in, but
  no flat buffer), except a gather in backward that finds its forward's cast still there
  (:meth:`.gather._Home.holds_forward_cast`). Elsewhere (a resharded post-forward state, mixed dtypes) it tells the hook
  which parameters it gathers and FSDP's own function runs, copy-in included; the hook still
  fills the tensors from the flat buffer;
- ``foreach_all_gather_copy_out``, for a gather so done, only orders the current stream after
  it (the tensors live in :mod:`.reuse`'s pools, reused in stream order; elsewhere it tells
  the caching allocator they are used there, ``record_stream``: FSDP frees them on that stream);
- ``foreach_reduce`` tells a :class:`DirectReduceScatter` hook that its next allocation is
  the packed input; the hook hands FSDP a placeholder of that shape that owns no memory;
- ``foreach_reduce_scatter_copy_in``, given that placeholder, keeps the gradients instead of
  copying them; the hook reduces from them and holds them until their stream waits for the
  reduction (FSDP drops its references right after the copy-in). 16-bit gradients reduced in
  fp32 (``reduce_dtype=torch.float32``) are summed into fp32 where they lie, widened exactly
  by the reduction kernel as FSDP's cast would (and moved in half the bytes). An all-reduce after the reduce-scatter
  (HSDP) or a user's all-reduce hook keeps FSDP's copy-in: they read the output's padding,
  which the direct path leaves unspecified.

Anything else takes FSDP's own path: another hook, a parameter sharded on another dim, an
all-gather extension, mixed all-gather dtypes; gradients of another dtype than the reduction's
other than 16 bits into fp32 (fp32 gradients reduced in bf16, say), non-contiguous gradients,
a reduction dtype FSDP divides before reducing (fp16). The wraps are installed only where this PyTorch's functions have the
signatures and behaviour they were written against, and the module being enabled has every
field of FSDP2's objects the direct path reads or assigns (:func:`supported`,
:data:`._state.FSDP_FIELDS`); elsewhere ``enable(direct=True)`` warns once and keeps the
hook-only path.
"""
from __future__ import annotations

import dataclasses
import inspect

import torch

from . import reuse
from ._state import (COUNTS, FSDP_FIELDS, ORIGINAL, FSDPModule, FSDPParam, _fsdp_collectives, _fsdp_param_group,
                     shard_versions)
from .gather import COPY_OUT_ARGS, GATHER_ARGS, DirectAllGather, _copy_out, _gather, move_home, parameter_outputs
from .reduce_scatter import _UNDIVIDED, COPY_IN_ARGS, DirectReduceScatter, _copy_in, _reduce

__all__ = ["COUNTS", "ORIGINAL", "DirectAllGather", "DirectReduceScatter", "counters", "install", "move_home",
           "parameter_outputs", "shard_versions", "supported"]

_REDUCE_ARGS = ("fsdp_params", "unsharded_grads", "reduce_scatter_group", "reduce_scatter_stream",
                "reduce_scatter_comm")  # the first five of foreach_reduce's; more follow, among them
# all_reduce_group and all_reduce_hook, which the wrap reads by name (they keep FSDP's copy-in)
_RESULT_FIELDS = ("all_gather_output", "all_gather_event", "all_gather_work", "param_all_gather_input_dtypes",
                  "param_all_gather_input_numels", "all_gather_input_split_sizes")


def counters() -> dict:
    """What the direct path skipped and declined since import (:class:`._state.Counts`)."""
    return dataclasses.asdict(COUNTS)


def supported(module: torch.nn.Module | None = None) -> str | None:
    """None where the wraps can be installed; otherwise why not. With ``module`` (the module
    being enabled, after ``fully_shard``), also every field of its FSDP2 objects that the
    direct path reads or assigns (:data:`._state.FSDP_FIELDS`)."""
    if _fsdp_param_group is None:
        return f"PyTorch {torch.__version__} has no FSDP2 internals to wrap"
    for mod, name, args in ((_fsdp_collectives, "foreach_all_gather", GATHER_ARGS),
                            (_fsdp_collectives, "foreach_all_gather_copy_out", COPY_OUT_ARGS),
                            (_fsdp_collectives, "foreach_reduce", None),
                            (_fsdp_collectives, "foreach_reduce_scatter_copy_in", COPY_IN_ARGS)):
        fn = ORIGINAL.get(name) or getattr(mod, name, None)
        have = () if fn is None else tuple(inspect.signature(fn).parameters)
        if fn is None or (have != args if args else have[:len(_REDUCE_ARGS)] != _REDUCE_ARGS
                                                     or not {"all_reduce_group", "all_reduce_hook"} <= set(have)):
            return f"PyTorch {torch.__version__}'s FSDP2 {name} is not the one conccl's direct path wraps"
    for name in ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce"):
        if getattr(_fsdp_param_group, name, None) not in (ORIGINAL.get(name, getattr(_fsdp_collectives, name)),
                                                           _WRAPS[name]):
            return f"PyTorch {torch.__version__}'s FSDP2 param group does not call {name} as expected"
    result = getattr(_fsdp_collectives, "AllGatherResult", None)
    if getattr(result, "_fields", None) != _RESULT_FIELDS or not hasattr(_fsdp_collectives, "_get_device_handle"):
        return f"PyTorch {torch.__version__}'s FSDP2 all-gather result is not the one conccl's direct gather makes"
    reduce = inspect.unwrap(ORIGINAL.get("foreach_reduce", _fsdp_collectives.foreach_reduce))
    if ("foreach_reduce_scatter_copy_in" not in reduce.__code__.co_names
            or reduce.__globals__ is not vars(_fsdp_collectives)):
        return f"PyTorch {torch.__version__}'s FSDP2 foreach_reduce does not call foreach_reduce_scatter_copy_in"
    return _divides_input() or _missing_field(module)


def _has(owner: str, obj, name: str) -> bool:
    """``obj`` has ``name``; for a field set only in some states, its class declaring it will do."""
    if hasattr(obj, name):
        return True
    return owner.endswith(" declared") and any(name in inspect.get_annotations(c) for c in type(obj).__mro__)


_OWNERS = {"FSDPParamGroup": lambda group: [group],
           "FSDPParam": lambda group: group.fsdp_params,
           "FSDPParam declared": lambda group: group.fsdp_params,
           "DTensor": lambda group: [p.sharded_param for p in group.fsdp_params]}


def _missing_field(module) -> str | None:
    """Why not, where an FSDP2 object of ``module`` lacks a field of FSDP_FIELDS: FSDP's hooks
    would raise an AttributeError midway instead (the fields of FSDPParam exist only once
    fully_shard made them, so they are looked for on the module's own)."""
    if module is None:
        return None
    for m in module.modules():
        # as conccl.fsdp.enable finds the groups (a module of no parameters has none)
        group = m._get_fsdp_state()._fsdp_param_group if isinstance(m, FSDPModule) else None
        if group is None:
            continue
        for owner, name in FSDP_FIELDS:
            if not all(_has(owner, obj, name) for obj in _OWNERS[owner](group)):
                return (f"PyTorch {torch.__version__}'s FSDP2 {owner.split()[0]} has no {name!r}, which conccl's "
                        "direct path reads or assigns")
    return None


def _divides_input() -> str | None:
    """None where FSDP2 divides no reduce-scatter input of an fp32 or bf16 reduction (the
    placeholder has no memory to divide); otherwise why not."""

    class _Group:
        def __init__(self, n):
            self.n = n

        def size(self):
            return self.n

    try:
        for dtype in _UNDIVIDED:
            for factor in (None, 2.0, 3.0):
                pre = _fsdp_collectives._get_gradient_divide_factors(_Group(2), None, dtype, "cuda", factor)[0]
                if pre not in (None, 1):
                    return f"PyTorch {torch.__version__}'s FSDP2 divides {dtype} gradients before reducing them"
    except (AttributeError, TypeError, ValueError) as e:
        return f"PyTorch {torch.__version__}'s FSDP2 gradient divide factors are not the ones conccl knows ({e})"
    return None


_WRAPS = {"foreach_all_gather": _gather, "foreach_all_gather_copy_out": _copy_out, "foreach_reduce": _reduce,
          "foreach_reduce_scatter_copy_in": _copy_in}


def install(module: torch.nn.Module | None = None) -> str | None:
    """Wrap FSDP2's four functions (once; idempotent). None if installed (and ``module``'s FSDP2
    objects have every field the direct path touches: :func:`supported`), else why not."""
    why = supported(module)
    if why is None and not ORIGINAL:
        for name in _WRAPS:
            ORIGINAL[name] = getattr(_fsdp_collectives, name)
        for name in ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce"):
            setattr(_fsdp_param_group, name, _WRAPS[name])
        # foreach_reduce calls it by its module's global name
        _fsdp_collectives.foreach_reduce_scatter_copy_in = _copy_in
        ORIGINAL["free_unsharded_param"] = FSDPParam.free_unsharded_param
        FSDPParam.free_unsharded_param = reuse.free_unsharded_param
    return why
