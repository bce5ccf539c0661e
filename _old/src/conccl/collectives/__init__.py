"""One module per collective; ``REGISTRY`` is what the API, CLI, tests and benchmark iterate."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import all_gather, all_to_all


@dataclass(frozen=True)
class CollectiveSpec:
    name: str
    bus_factor: Callable[[int], float]


REGISTRY: dict[str, CollectiveSpec] = {
    all_gather.NAME: CollectiveSpec(all_gather.NAME, all_gather.bus_factor),
    all_to_all.NAME: CollectiveSpec(all_to_all.NAME, all_to_all.bus_factor),
}


def get(name: str) -> CollectiveSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(REGISTRY)}") from None
