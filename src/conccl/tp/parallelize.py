"""``conccl.tp.parallelize_module``: a model's ``nn.Linear`` layers made sequence-parallel in place,
as ``torch.distributed.tensor.parallel.parallelize_module`` with ``ColwiseParallel`` /
``RowwiseParallel`` (and ``SequenceParallel`` between blocks) does with DTensors.

Megatron's sequence parallelism, which both follow: between the tensor-parallel regions the
activations are split along the sequence (each rank holds its rows, and norms, residual adds
and dropout run on them); a column-parallel layer gathers the rows and multiplies them by its
output-feature shard, a row-parallel layer multiplies its input-feature shard and
reduce-scatters the product back to row shards. Here each becomes conccl.tp's layer holding
this rank's shard of the original weight, its collective pipelined with its GEMM on copy
engines; no DTensor is involved, so the model's code sees plain tensors of the local shapes
(as with PyTorch's plan, attention must use the local head count: ``n_heads / world``).
"""
from __future__ import annotations

import torch

from ..errors import InvalidArgument
from .layers import ColumnParallelLinear, RowParallelLinear

STYLES = ("colwise", "rowwise")


def _world_rank(group) -> tuple[int, int]:
    if hasattr(group, "world") and hasattr(group, "rank"):  # a conccl Group
        return group.world, group.rank
    import torch.distributed as dist

    return dist.get_world_size(group), dist.get_rank(group)


def parallelize_module(module: torch.nn.Module, plan: dict, group=None, *, schedule="auto",
                       backward_schedule="auto") -> torch.nn.Module:
    """Replace each ``nn.Linear`` named in ``plan`` (``{"layers.0.mlp.w1": "colwise", ...}``,
    names as ``module.get_submodule`` takes them) by :class:`ColumnParallelLinear`
    (``"colwise"``) or :class:`RowParallelLinear` (``"rowwise"``) holding this rank's shard of
    its weight, and return ``module`` (changed in place).

    Shapes: a column-parallel layer takes this rank's rows ``[s / world, ..., in]`` (dimension 0,
    the sequence, split over the group) and returns ``[s, ..., out / world]``; a row-parallel
    layer takes ``[s, ..., in / world]`` and returns ``[s / world, ..., out]``: the usual pairs
    (attention's q, k, v then o; an MLP's gate and up then down) leave the rows split between
    them. Every rank calls it with the same plan on a model of the same shapes and weights (it
    cuts the weights it finds; it moves nothing). ``group``: a ``torch.distributed`` process
    group (default: the world) or a conccl Group; ``schedule``, ``backward_schedule``: as the
    layers'. Raises InvalidArgument, with nothing changed, for a name that is not an
    ``nn.Linear``, a layer with a bias (not supported: a row-parallel bias would need one more
    all-reduce), a style not in ``colwise``/``rowwise``, or a width not divisible by the world.
    """
    world, rank = _world_rank(group)
    made = {}
    for name, style in plan.items():
        if style not in STYLES:
            raise InvalidArgument(f"parallelize_module: {name!r}: style {style!r} is not one of {', '.join(STYLES)}")
        try:
            lin = module.get_submodule(name)
        except AttributeError:
            raise InvalidArgument(f"parallelize_module: the model has no submodule {name!r}") from None
        if type(lin) is not torch.nn.Linear:
            raise InvalidArgument(f"parallelize_module: {name!r} is a {type(lin).__name__}, not an nn.Linear")
        if lin.bias is not None:
            raise InvalidArgument(f"parallelize_module: {name!r} has a bias; conccl.tp's layers take none")
        out_f, in_f = lin.weight.shape
        split = out_f if style == "colwise" else in_f
        if split % world:
            raise InvalidArgument(f"parallelize_module: {name!r}: {'out' if style == 'colwise' else 'in'}_features "
                                  f"{split} is not divisible by the world size {world}")
        w = lin.weight.detach()
        kw = dict(group=group, schedule=schedule, backward_schedule=backward_schedule, world_size=world,
                  device=w.device, dtype=w.dtype)
        if style == "colwise":
            new = ColumnParallelLinear(in_f, out_f, **kw)
            shard = w[rank * out_f // world:(rank + 1) * out_f // world]
            target = new.weights[0]
        else:
            new = RowParallelLinear(in_f, out_f, **kw)
            shard = w[:, rank * in_f // world:(rank + 1) * in_f // world]
            target = new.weight
        with torch.no_grad():
            target.copy_(shard)
        target.requires_grad_(lin.weight.requires_grad)
        made[name] = new
    for name, new in made.items():  # all checked first: a bad entry changes nothing
        parent, _, leaf = name.rpartition(".")
        setattr(module.get_submodule(parent) if parent else module, leaf, new)
    return module
