"""What the tests and the shared-GPU rig share: CPU ranks of reference groups and simulated
hosts (:mod:`.ranks`)."""
from .ranks import new_reference_group, reference_group, spawn, spawn_hosts

__all__ = ["spawn", "spawn_hosts", "reference_group", "new_reference_group"]
