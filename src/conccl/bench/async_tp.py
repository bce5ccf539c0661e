"""PyTorch's async-TP ops (``torch.ops.symm_mem.fused_all_gather_matmul`` /
``fused_matmul_reduce_scatter``) on the world group: what ``conccl bench tp`` and its
``--block`` compare conccl's pipelines with.
"""
from __future__ import annotations


class AsyncTP:
    """The two fused ops on the group ``group_name`` (symmetric memory enabled for it): ``ag(a, w)``
    returns ``a`` gathered times ``w``, ``rs(a, w)`` this rank's rows of the summed ``a @ w``."""

    def __init__(self, torch, group_name):
        self.torch, self.group_name = torch, group_name
        self.return_a = False  # as conccl's op without return_gathered: the gathered A not made

    def ag(self, a, w):
        op = self.torch.ops.symm_mem.fused_all_gather_matmul
        if not self.return_a:
            try:
                return op(a, [w], 0, self.group_name, return_A=False)[1][0]
            except (TypeError, RuntimeError) as e:  # a PyTorch whose op has no return_A
                if "return_A" not in str(e):
                    raise
                self.return_a = True
        return op(a, [w], 0, self.group_name)[1][0]

    def rs(self, a, w):
        return self.torch.ops.symm_mem.fused_matmul_reduce_scatter(a, w, "sum", 0, self.group_name)


def world_async_tp(torch, dist) -> AsyncTP | None:
    """PyTorch's async-TP ops on the world group, or None where this PyTorch lacks them."""
    try:
        from torch.distributed import _symmetric_memory as symm_mem

        name = dist.group.WORLD.group_name
        symm_mem.enable_symm_mem_for_group(name)
        return AsyncTP(torch, name)
    except Exception:  # noqa: BLE001 - recorded as an error per case by the caller's absence
        return None
