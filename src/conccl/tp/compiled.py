"""``conccl.tp``'s ops as PyTorch custom ops, for ``torch.compile``.

``torch.ops.conccl.all_gather_matmul`` and ``torch.ops.conccl.matmul_reduce_scatter`` run
:func:`conccl.tp.all_gather_matmul` / :func:`conccl.tp.matmul_reduce_scatter`; their fake
(meta) implementations give the results' shapes without communicating, so a compiled model
traces them as single nodes (no graph break) and inductor schedules around them. The parallel
layers (:mod:`conccl.tp.layers`) call them while compiling and the Python ops
eagerly (a custom op's dispatch costs host time an eager call does not need).

A custom op takes no Python objects, so a group travels by name: :func:`op_group` gives the
name of a process group or a conccl Group (registered here for the ops to find), ``""`` the
world; a schedule by its name (``"auto"``, ``"direct-p4-g2"``, ...).

Both ops are blocking and run on the current stream, as the Python ops do with
``async_op=False``; the results are fresh, contiguous tensors (a gather or scatter dimension
other than 0 costs a copy, which the Python ops leave as a view). They are forward-only (the
parallel layers carry their backward in their autograd functions), kept out of inductor's CUDA
graphs (tagged ``cudagraph_unsafe``; ``torch.cuda.graph`` captures them), and declared pure: a compiled graph that leaves an op's
results unused drops the call, so every rank must use them alike (or ranks' calls diverge).
The group registry keeps the groups it names alive.
"""
from __future__ import annotations

import torch

from ..schedule.pipeline import TPSchedule
from .ops import all_gather_matmul as _ag_matmul
from .ops import matmul_reduce_scatter as _mm_rs

_GROUPS: dict = {}  # name -> process group or conccl Group


def op_group(group=None) -> str:
    """The name the custom ops take for ``group`` (a ``torch.distributed`` process group, a
    conccl Group, or None: the world, ``""``); the group is kept for the ops to find."""
    if group is None:
        return ""
    name = getattr(group, "group_name", None)
    name = f"pg:{name}" if isinstance(name, str) and name else f"conccl:{id(group)}"
    _GROUPS[name] = group
    return name


def _group(name: str):
    if not name:
        return None
    try:
        return _GROUPS[name]
    except KeyError:
        pass
    try:  # a process group's own name, as PyTorch's async-TP ops take it (group.group_name)
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _resolve_process_group(name)
    except (ImportError, ValueError, KeyError, RuntimeError):
        raise ValueError(f"conccl.tp: no group named {name!r}; make the name with conccl.tp.op_group(group)") from None


def _world(name: str) -> int:
    g = _group(name)
    if g is None:
        import torch.distributed as dist

        return dist.get_world_size()
    return g.world if hasattr(g, "world") else g.size()


def schedule_name(schedule) -> str:
    """A schedule as the ops take it: its name."""
    return schedule.name if isinstance(schedule, TPSchedule) else str(schedule)


def _op(reduce_op: str):
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}
    if reduce_op not in ops:
        raise ValueError(f"conccl.tp: reduce_op {reduce_op!r}: one of {', '.join(ops)}")
    return ops[reduce_op]


# cudagraph_unsafe: a conccl.tp call can be captured (conccl.group.pipelined), but each capture
# is a collective call that holds a graph slot and graph workspace for good, and inductor's
# CUDA-graph modes (reduce-overhead, max-autotune) record and re-record on their own: they run
# it outside their graphs. Capture the step with torch.cuda.graph instead.
_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


@torch.library.custom_op("conccl::all_gather_matmul", mutates_args=(), tags=_TAGS)
def all_gather_matmul_op(a_shard: torch.Tensor, weights: list[torch.Tensor], gather_dim: int, group: str,
                         schedule: str, return_gathered: bool) -> list[torch.Tensor]:
    """``[A] + [A @ W for W in weights]`` (``A`` only with ``return_gathered``): see
    :func:`conccl.tp.all_gather_matmul`."""
    gathered, outs = _ag_matmul(a_shard, list(weights), gather_dim, _group(group), schedule=schedule,
                                return_gathered=return_gathered)
    return [t.contiguous() for t in ([gathered] if return_gathered else []) + list(outs)]


@all_gather_matmul_op.register_fake
def _(a_shard, weights, gather_dim, group, schedule, return_gathered):
    shape = list(a_shard.shape)
    shape[gather_dim] *= _world(group)
    outs = [a_shard.new_empty((*shape[:-1], w.shape[1])) for w in weights]
    return ([a_shard.new_empty(shape)] if return_gathered else []) + outs


@torch.library.custom_op("conccl::matmul_reduce_scatter", mutates_args=(), tags=_TAGS)
def matmul_reduce_scatter_op(a: torch.Tensor, weight: torch.Tensor, scatter_dim: int, group: str, schedule: str,
                             reduce_op: str) -> torch.Tensor:
    """``a @ weight`` reduced over the ranks and scattered along ``scatter_dim``: see
    :func:`conccl.tp.matmul_reduce_scatter` (``reduce_op``: "sum" or "avg")."""
    return _mm_rs(a, weight, scatter_dim, _op(reduce_op), _group(group), schedule=schedule).contiguous()


@matmul_reduce_scatter_op.register_fake
def _(a, weight, scatter_dim, group, schedule, reduce_op):
    shape = list(a.shape)
    shape[scatter_dim] //= _world(group)
    return a.new_empty((*shape[:-1], weight.shape[1]))


def fused_all_gather_matmul(A_shard: torch.Tensor, Bs: list, gather_dim: int, group_name: str, *,
                            return_A: bool = True):
    """``torch.ops.symm_mem.fused_all_gather_matmul``'s signature and results, on conccl
    (:func:`conccl.tp.all_gather_matmul`): ``(A or None, [A @ B for B in Bs])``. ``group_name``:
    a process group's ``group_name`` (or an :func:`op_group` name). A drop-in for PyTorch's
    async-TP: swap the call, nothing else (eagerly; under torch.compile call
    ``torch.ops.conccl.all_gather_matmul``)."""
    return _ag_matmul(A_shard, list(Bs), gather_dim, _group(group_name), return_gathered=return_A)


def fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                group_name: str) -> torch.Tensor:
    """``torch.ops.symm_mem.fused_matmul_reduce_scatter``'s signature and result, on conccl
    (:func:`conccl.tp.matmul_reduce_scatter`): ``A @ B`` reduced (``reduce_op`` "sum" or "avg")
    and scattered along ``scatter_dim``."""
    return _mm_rs(A, B, scatter_dim, _op(reduce_op), _group(group_name))
