"""The multi-process tier's ranks are forked from this pytest process (``conccl.testing.spawn``
and ``spawn_hosts``, and the files that fork their own ranks): they inherit what this process
has imported, and each imports again what it has not. FSDP2 and DTensor import
``torch._dynamo`` at their first use, about 0.7 s in every rank of every test on 2 cores, so it
is imported here once, before any rank is forked (it initialises no CUDA and starts no thread)."""
from __future__ import annotations

try:
    import torch._dynamo  # noqa: F401
except ImportError:  # no torch: this tier's files skip themselves
    pass
