"""A signal wait run by a one-warp kernel (``kernels/cuda/spin.cu``) instead of the GPU's front end.

A copy-engine collective orders its ranks with 32-bit signal words in each rank's pad: a peer
writes the word, the owner waits until ``(int32)(word - value) >= 0`` (GEQ: sequence numbers may
wrap). A kernel polling the word with acquire loads wakes sooner than ``cuStreamWaitValue32``:
on 2 x H100, a ping-pong of ``cuStreamWriteValue32`` signals took 2.85 us one way with this
kernel waiting, 6.50 with the memop (eager; 5.4 against 9.9 in a CUDA graph). With a 64 KiB
peer copy queued after each wait the gain was gone (10.5 against 9.8 us): a copy after a kernel
starts later than after a memop. Compiled once per process and device by
:mod:`conccl.kernels.loader`.

What a wait costs and what bounds it:

* SMs: one CTA of one warp (only its thread 0 polls) on one SM for as long as it waits; a GEMM
  on that SM loses one warp slot, nothing else.
* It needs that slot to start: launch it on a high-priority stream, so that the CTA scheduler
  gives it the first free slot while a GEMM occupies every SM (a normal-priority launch would
  queue behind the GEMM's remaining CTAs; a memop wait needs no SM at all).
* Bounded: after ``timeout_ns`` (``%globaltimer``, from the kernel's start) it sets the
  ``timed_out`` word to 1 and returns; the stream then runs on **as if released**, so whoever
  launched it must read that word before trusting what followed.
* An abort word: any nonzero value there ends every wait at once (same caveat: the work queued
  after it runs on stale data). Writing the awaited value into the waited words, as the
  watchdog's release does, also releases it.

No fence after the waits: one would order only the polling thread's later accesses, and it has
none (what the stream runs next starts after the kernel has ended); it cost 1.6 us a wait (a
satisfied wait 3.68 us back to back against 2.10).

The module imports without CUDA or cuda-python: both are loaded where a wait is first built.
"""
from __future__ import annotations

import ctypes
import functools

from . import loader

MAX_WAITS = 8  # words per launch: one per peer of an 8-GPU NVLink node
THREADS = 32  # one warp (a smaller CTA still takes one); thread 0 polls, the rest exit
# Between polls. __nanosleep(20) takes the warp off its scheduler between polls, for a wait that
# may share an SM with a GEMM for milliseconds (not measured), at about no latency: 2 x H100,
# 200 round trips, 5.71 us a round trip against 5.69 unslept, eager; 11.2 against 10.8 in a
# graph (10.8-11.6 and 10.7-10.9 over repeats). 0 compiles it out. The one-shot kernel's waits
# sleep the same.
POLL_SLEEP_NS = 20


@functools.lru_cache(maxsize=None)
def _function(device_index: int, poll_sleep_ns: int = POLL_SLEEP_NS):
    """``conccl_spin_wait`` on ``device_index``'s primary context (current when torch runs
    there), its polls ``poll_sleep_ns`` apart."""
    return loader.function(device_index, "spin", "conccl_spin_wait", {"POLL_SLEEP_NS": int(poll_sleep_ns)})


class SpinWaitLaunch:
    """One prebuilt ``conccl_spin_wait``: waits, in order, until each word at ``addresses[i]``
    (1 to :data:`MAX_WAITS` of them) is GEQ ``seq + deltas[i]``; released early by a nonzero
    ``abort_address`` word; after ``timeout_ns`` sets the ``timed_out_address`` word to 1 and
    returns. Its parameters are built once (the driver copies them at launch, also into a graph
    being captured); :meth:`launch` writes ``(seq + delta) & 0xFFFFFFFF`` into each value."""

    def __init__(self, device_index: int, addresses: tuple[int, ...], deltas: tuple[int, ...], abort_address: int,
                 timed_out_address: int, timeout_ns: int, *, poll_sleep_ns: int = POLL_SLEEP_NS):
        # Checked before anything touches CUDA: a bad program fails where it is built, on any machine.
        if not 1 <= len(addresses) <= MAX_WAITS:
            raise ValueError(f"a spin wait takes 1 to {MAX_WAITS} words per launch, got {len(addresses)}")
        if len(deltas) != len(addresses):
            raise ValueError(f"a spin wait: {len(addresses)} addresses but {len(deltas)} deltas")
        if timeout_ns <= 0:
            raise ValueError(f"a spin wait's timeout must be positive, got {timeout_ns} ns")
        self.function = _function(device_index, poll_sleep_ns)
        ptrs = list(addresses) + [addresses[0]] * (MAX_WAITS - len(addresses))  # unused words are never read
        values = [ctypes.c_uint(0) for _ in range(MAX_WAITS)]
        # Parameter order is the kernel's: 8 word pointers, 8 values, n, the abort word, the
        # bound, the timed-out word.
        self._values = ([ctypes.c_void_p(p) for p in ptrs] + values + [ctypes.c_int(len(addresses))]
                        + [ctypes.c_void_p(abort_address), ctypes.c_ulonglong(timeout_ns),
                           ctypes.c_void_p(timed_out_address)])
        self._params = (ctypes.c_void_p * len(self._values))(*[ctypes.addressof(v) for v in self._values])
        self.params = ctypes.addressof(self._params)
        self._patches = tuple(zip(values, deltas))

    def launch(self, cu, stream, seq: int):
        """Queue the kernel on ``stream`` (a ``CUstream``; a high-priority one: module doc) for
        call ``seq``; returns cuLaunchKernel's result tuple, unchecked (the caller names the
        failing step)."""
        for value, delta in self._patches:
            value.value = (seq + delta) & 0xFFFFFFFF
        return cu.cuLaunchKernel(self.function, 1, 1, 1, THREADS, 1, 1, 0, stream, self.params, 0)
