"""What conccl's direct FSDP2 path shares: FSDP2's internals it wraps, their originals once
wrapped, the fields of FSDP2's objects it touches, and the counts of what it skipped and
declined (for tests and benchmarks)."""
from __future__ import annotations

import dataclasses

try:  # FSDP2's internals the direct path wraps (PyTorch 2.10 - 2.13)
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam, ShardedState
except ImportError:  # pragma: no cover - older PyTorch: supported() says so
    FSDPModule = _fsdp_collectives = _fsdp_param_group = ShardedState = FSDPParam = None

ORIGINAL: dict = {}  # FSDP2's own functions, once wrapped (install())

# Every field of FSDP2's objects the direct path reads or assigns, as (owner, name), in the order
# supported() checks them on the module being enabled. FSDPParam and FSDPParamGroup are FSDP2's
# internal classes: their plain names are as private as their underscored ones. Owners:
# - "FSDPParamGroup": each FSDP module's parameter group has it;
# - "FSDPParam": each FSDPParam has it once fully_shard ran (a field, a property or a method);
# - "FSDPParam declared": set only in some states (after a reshard to the post-forward mesh,
#   after FSDP's lazy init): FSDPParam's annotations declare it;
# - "DTensor": each FSDPParam's sharded_param has it.
FSDP_FIELDS = (
    ("FSDPParamGroup", "fsdp_params"),
    ("FSDPParam", "sharded_param"),
    ("DTensor", "_local_tensor"),  # assigned too: a shard moved home (gather._Home.take)
    ("FSDPParam", "_sharded_param_data"),  # assigned too: a shard moved home
    ("FSDPParam", "_sharded_local_tensor"),
    ("FSDPParam", "sharded_state"),
    ("FSDPParam", "fsdp_placement"),
    ("FSDPParam", "offload_to_cpu"),
    ("FSDPParam", "padded_sharded_param_size"),
    ("FSDPParam", "all_gather_outputs"),
    ("FSDPParam", "init_all_gather_outputs"),
    ("FSDPParam", "alloc_all_gather_outputs"),
    ("FSDPParam", "free_unsharded_param"),  # wrapped at the class: fsdp_direct.reuse
    ("FSDPParam", "mp_policy"),
    ("FSDPParam declared", "_sharded_post_forward_param_data"),
    ("FSDPParam declared", "param_dtype"),
)


@dataclasses.dataclass
class Counts:
    """Since import: FSDP copies skipped, and collectives a direct hook left to FSDP's own path
    (tensors it cannot use where they are)."""
    skipped_copy_outs: int = 0  # all-gather copy-outs
    declined_gathers: int = 0
    skipped_copy_ins: int = 0  # reduce-scatter copy-ins
    declined_reduces: int = 0
    skipped_gather_copy_ins: int = 0  # all-gathers that read the shards in their home
    cast_gathers: int = 0  # all-gathers whose copy-in is one cast into the module's cast home (no flat buffer)
    reused_casts: int = 0  # backward all-gathers that read the cast their forward made (no copy-in at all)


COUNTS = Counts()


def shard_versions(p) -> tuple[int, int]:
    """The version counters that count an in-place write to FSDPParam ``p``'s shard: the
    parameter's (a DTensor: an in-place op on it, as the optimizer's, does not reach its local
    tensor's counter) and the padded shard's (shared with the local tensor: a write through
    ``to_local()``). A write through ``.data`` or by a fused optimizer's kernel moves neither."""
    return p.sharded_param._version, p._sharded_param_data._version
