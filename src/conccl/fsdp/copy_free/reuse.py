"""Where a directly gathered module's unsharded parameters live: two private memory pools per
``enable`` call (freed with the model), modules alternating between them in the order they are
first gathered (parity), and each pool's memory reused in stream order instead of through
``record_stream``.

Why: the direct gather makes the unsharded tensors on FSDP's all-gather stream (the gather
writes them there); FSDP uses and frees them on the compute stream. Marked with
``record_stream``, a freed block is reusable only once the caching allocator sees the compute
stream's event complete, and the host runs ~100 ms ahead of the GPU in a training step: every
gather found the last ones still pending and took a new segment (12.8 GiB reserved and
unallocated on the all-gather stream at 8192 tokens, against FSDP's own 1.8 GiB).

How: FSDP's free of such a parameter (``FSDPParam.free_unsharded_param``, wrapped) records an
event on the stream that frees it and returns the block to its pool at once; the next gather of
the same parity makes the all-gather stream wait for that event before it writes, so the block
is reused in stream order. Where modules run in the order of their first gathers (forward, and
backward reversed), the wait holds a gather back only behind the free of the module two before
it (the one just before has the other parity): module i+2's gather still runs beside module
i+1's compute, as FSDP's prefetching intends; where the order changes between passes a gather
may wait for its neighbour (slower, never wrong). Frees from several streams are each waited for. Memory: about one module's unsharded
parameters per pool, as FSDP's own copy-out keeps on the compute stream.
"""
from __future__ import annotations

import contextlib

import torch

from ...device.symmetric import CurrentStreams
from ._state import ORIGINAL


class Pools:
    """The two pools of one ``enable`` call's modules, made on first use on their device, and
    each parity's last free. Held by the modules' hooks and parameters: freed with the model."""

    def __init__(self):
        self.pools = None
        # per parity, per stream that freed its parameters (by raw handle): one event, recorded
        # again at each free. A wait takes the event as last recorded when it is queued, so one
        # event per stream stands for that stream's last free: a free (every parameter of every
        # module, ~100 a step) costs one record, no new Event and no Stream object.
        self.freed = ({}, {})
        self.gathered = 0  # modules given a parity so far
        self.streams: CurrentStreams | None = None  # the freeing stream, found by its handle

    def next_parity(self) -> int:
        """The parity of a module gathered for the first time: modules alternate in the order
        they are first gathered (the forward's order), whatever order they were registered in."""
        self.gathered += 1
        return (self.gathered - 1) % 2

    def get(self, device):  # (one device per process, as FSDP2 has it: the first one's)
        if device.type != "cuda" or not hasattr(torch.cuda, "use_mem_pool") or not hasattr(torch.cuda, "MemPool"):
            return None
        if self.pools is None:
            with torch.cuda.device(device):
                self.pools = (torch.cuda.MemPool(), torch.cuda.MemPool())
        return self.pools


@contextlib.contextmanager
def allocating(pools, parity, fsdp_params, device, gather_stream):
    """Around the making of ``fsdp_params``' unsharded tensors for a gather on
    ``gather_stream``: in ``pools``' pool of ``parity`` (None: as FSDP would, unpooled), the
    stream first waiting for that pool's last free. Yields whether pooled."""
    pair = None if pools is None or parity is None else pools.get(device)
    if pair is None:
        yield False
        return
    for event in pools.freed[parity].values():
        gather_stream.wait_event(event)  # as last recorded: that stream's last free
    with torch.cuda.use_mem_pool(pair[parity], device):
        yield True
    for p in fsdp_params:
        p._conccl_reuse = (pools, parity)


def pooled(p) -> bool:
    """Whether ``p``'s unsharded tensors were made in a pool (no ``record_stream`` for them)."""
    return getattr(p, "_conccl_reuse", None) is not None


def free_unsharded_param(self) -> None:
    """FSDPParam.free_unsharded_param, wrapped: a pooled parameter's free is recorded (module doc)."""
    mark = getattr(self, "_conccl_reuse", None)
    outs = self.all_gather_outputs
    if mark is not None and outs and outs[0].is_cuda and outs[0].untyped_storage().size():
        pools, parity = mark
        if pools.streams is None:
            pools.streams = CurrentStreams(outs[0].device.index)
        stream = pools.streams()
        event = pools.freed[parity].get(stream.cuda_stream)
        if event is None:
            event = pools.freed[parity][stream.cuda_stream] = torch.cuda.Event()
        event.record(stream)
    ORIGINAL["free_unsharded_param"](self)

