"""conccl: Concurrent Communication Collectives.

Collectives that move data with the GPUs' copy engines instead of SM kernels, shaped like
``torch.distributed``, so that computation running beside them keeps every SM.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import CollectiveError, CollectiveTimeout, GroupBroken, InvalidArgument, UnsupportedGroup
from .persistent import PersistentCollective
from .schedule import Algorithm, StreamMode
from .work import Work


def __getattr__(name):
    # The API module (and the CUDA executor behind it) loads on first use, keeping
    # `import conccl` light for the CLI and the pure parts (plans, reference executor).
    if name in {"all_gather_into_tensor", "all_to_all_single", "reduce_scatter_tensor", "all_reduce",
                "persistent_all_gather_into_tensor", "persistent_all_to_all_single",
                "persistent_reduce_scatter_tensor", "persistent_all_reduce", "reserve_graph_workspace", "empty", "set_options", "destroy", "get_communicator",
                "get_group"}:
        from . import api

        return getattr(api, name)
    if name in {"overlap", "run_concurrently", "get_plan", "plan_cache_info"}:
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'conccl' has no attribute {name!r}")


__all__ = [
    "all_gather_into_tensor",
    "all_to_all_single",
    "reduce_scatter_tensor",
    "all_reduce",
    "persistent_all_gather_into_tensor",
    "persistent_all_to_all_single",
    "persistent_reduce_scatter_tensor",
    "persistent_all_reduce",
    "reserve_graph_workspace",
    "PersistentCollective",
    "empty",
    "set_options",
    "destroy",
    "get_group",
    "get_communicator",
    "overlap",
    "run_concurrently",
    "get_plan",
    "Work",
    "Algorithm",
    "StreamMode",
    "CollectiveError",
    "CollectiveTimeout",
    "GroupBroken",
    "InvalidArgument",
    "UnsupportedGroup",
]
