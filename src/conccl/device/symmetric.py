"""Peer-reachable memory as a group knows it, and the caller's current stream found fast.

- :class:`SymmetricRegistry`: the tensors :func:`conccl.empty` made (PyTorch symmetric memory),
  with every rank's base address, so a call can tell whether a tensor is peer-reachable and how
  its peers reach it.
- :class:`CurrentStreams`: the current stream of one device by its raw handle, without building
  a Stream object per call.
"""
from __future__ import annotations

import torch

# The current stream's handle by device index, without building a Stream object (older
# builds lack the raw accessor).
_raw_stream = (getattr(torch._C, "_cuda_getCurrentRawStream", None)
               or (lambda device_index: torch.cuda.current_stream(device_index).cuda_stream))


class CurrentStreams:
    """The current stream of device ``device_index``, found by its raw handle: ``torch.cuda.current_stream()``
    builds a new Stream object each time (2.6 us per call on H200 x4). A handle names one stream
    while it lives; a reused handle is the same CUDA stream to every record and wait made on it
    (they go by handle). One per executor, emptied by :meth:`close`."""

    MAX_STREAMS = 64  # handles remembered; past it the memo starts again

    def __init__(self, device_index: int):
        self.device_index = device_index
        self._by_handle: dict = {}  # raw handle -> torch Stream

    def __call__(self):
        handle = _raw_stream(self.device_index)
        stream = self._by_handle.get(handle)
        if stream is None:
            if len(self._by_handle) >= self.MAX_STREAMS:
                self._by_handle.clear()
            stream = self._by_handle[handle] = torch.cuda.current_stream(self.device_index)
        return stream

    def close(self) -> None:
        self._by_handle.clear()


class SymmetricRegistry:
    """Maps tensors allocated by :func:`conccl.empty` to their peers' addresses."""

    def __init__(self):
        # storage ptr -> (nbytes, every rank's base address, handle kept alive, registration number)
        self._by_storage: dict[int, tuple[int, tuple[int, ...], object, int]] = {}
        self.generation = 0  # grows with every allocation: what lookup() answered may change

    def add(self, tensor, handle) -> None:
        storage = tensor.untyped_storage()
        self.generation += 1
        # Registrations follow rendezvous, a collective call: the n-th is the same allocation's
        # on every rank, which the group checks per call (its row's block fields).
        self._by_storage[storage.data_ptr()] = (storage.nbytes(), tuple(handle.buffer_ptrs), handle, self.generation)

    def remove(self, tensor) -> bool:
        """Forget ``tensor``'s allocation (False: it was not registered); its memory goes back
        once the caller drops the tensor, and calls stop taking it as peer-reachable."""
        storage = tensor.untyped_storage()
        entry = self._by_storage.get(storage.data_ptr())
        if entry is None or entry[0] != storage.nbytes():
            return False
        del self._by_storage[storage.data_ptr()]
        self.generation += 1
        return True

    def lookup(self, tensor):
        """(every rank's base address, byte offset in the allocation, registration number) or
        None if not peer-reachable.

        The offset comes from the storage offset, not ``data_ptr()``: an empty view's is 0."""
        if tensor.device.type != "cuda":
            return None
        storage = tensor.untyped_storage()
        entry = self._by_storage.get(storage.data_ptr())
        if entry is None or entry[0] != storage.nbytes():
            return None
        return entry[1], tensor.storage_offset() * tensor.element_size(), entry[3]
