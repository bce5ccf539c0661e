"""One module per collective, each an instance of :class:`~conccl.collectives.base.Collective`;
:data:`REGISTRY` is what the group, the CLI, tests, benchmark, study, planner and runtime iterate."""
from __future__ import annotations

from .all_gather import ALL_GATHER
from .all_reduce import ALL_REDUCE
from .all_to_all import ALL_TO_ALL
from .base import Collective, Layout, LocalCall, PeerCalls
from .reduce_scatter import REDUCE_SCATTER

REGISTRY: dict[str, Collective] = {c.name: c for c in (ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER, ALL_REDUCE)}
# What `conccl study` measures and the planner plans for (Collective.studied).
STUDIED: dict[str, Collective] = {n: c for n, c in REGISTRY.items() if c.studied}

__all__ = ["REGISTRY", "STUDIED", "Collective", "Layout", "LocalCall", "PeerCalls", "get", "by_api_name"]


def get(name: str) -> Collective:
    """The registered collective called ``name``; ValueError naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(REGISTRY)}") from None


def by_api_name(api_name: str) -> Collective:
    """The collective whose torch.distributed function is ``api_name``."""
    for c in REGISTRY.values():
        if c.api_name == api_name:
            return c
    raise ValueError(f"no collective has the API function {api_name!r}")
