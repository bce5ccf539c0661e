"""What conccl's direct FSDP2 path shares: FSDP2's internals it wraps, their originals once
wrapped, and the counts of what it skipped and declined (for tests and benchmarks)."""
from __future__ import annotations

import dataclasses

try:  # FSDP2's internals the direct path wraps (PyTorch 2.10 - 2.13)
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState
except ImportError:  # pragma: no cover - older PyTorch: supported() says so
    _fsdp_collectives = _fsdp_param_group = ShardedState = None

ORIGINAL: dict = {}  # FSDP2's own functions, once wrapped (install())


@dataclasses.dataclass
class Counts:
    """Since import: FSDP copies skipped, and collectives a direct hook left to FSDP's own path
    (tensors it cannot use where they are)."""
    skipped_copy_outs: int = 0  # all-gather copy-outs
    declined_gathers: int = 0
    skipped_copy_ins: int = 0  # reduce-scatter copy-ins
    declined_reduces: int = 0
    skipped_gather_copy_ins: int = 0  # all-gathers that read the shards in their home


COUNTS = Counts()
