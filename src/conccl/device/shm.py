"""POSIX shared memory that conccl alone manages.

Python < 3.13 registers every segment with the resource tracker, which unlinks segments when
the process that *attached* them exits, and which forked children share with their parent.
conccl unlinks its own segments explicitly, so it keeps them out of the tracker.
"""
from __future__ import annotations

import os
from multiprocessing import resource_tracker, shared_memory

try:
    import _posixshmem
except ImportError:  # pragma: no cover - not POSIX
    _posixshmem = None


def _open(name: str, create: bool, nbytes: int = 0) -> shared_memory.SharedMemory:
    try:
        return shared_memory.SharedMemory(name=name, create=create, size=nbytes, track=False)  # Python >= 3.13
    except TypeError:
        pass
    # Older Pythons: keep the segment from ever being registered (a register followed by an
    # unregister races with the same pair in a forked sibling sharing the tracker).
    register = resource_tracker.register
    resource_tracker.register = lambda name, rtype: None if rtype == "shared_memory" else register(name, rtype)
    try:
        return shared_memory.SharedMemory(name=name, create=create, size=nbytes)
    finally:
        resource_tracker.register = register


def create(name: str, nbytes: int) -> shared_memory.SharedMemory:
    return _open(name, True, max(nbytes, 1))


def attach(name: str) -> shared_memory.SharedMemory:
    return _open(name, False)


def unlink(shm: shared_memory.SharedMemory) -> None:
    try:
        _posixshmem.shm_unlink(shm._name)  # type: ignore[attr-defined]  # bypasses the tracker
    except FileNotFoundError:
        pass


SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory segments, by name


def unlink_prefix(prefix: str) -> list[str]:
    """Unlink every segment whose name starts with ``prefix``; return their names. For a
    launcher whose ranks may have been killed before unlinking what they made (their names
    all start with the prefix the launcher gave them). A no-op where segments are not files
    under :data:`SHM_DIR`."""
    if _posixshmem is None or not os.path.isdir(SHM_DIR) or not prefix:
        return []
    gone = []
    for name in os.listdir(SHM_DIR):
        if name.startswith(prefix):
            try:
                _posixshmem.shm_unlink("/" + name)
                gone.append(name)
            except FileNotFoundError:
                pass
    return gone
