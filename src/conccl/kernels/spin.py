"""A signal wait run by a one-warp kernel instead of the GPU's front end.

A copy-engine collective orders its ranks with 32-bit signal words in each rank's pad: a peer
writes the word, the owner waits until ``(int32)(word - value) >= 0`` (GEQ: sequence numbers may
wrap). A kernel polling the word with acquire loads wakes sooner than ``cuStreamWaitValue32``:
on 2 x H100, a ping-pong of ``cuStreamWriteValue32`` signals took 2.85 us one way with this
kernel waiting, 6.50 with the memop (benchmarks/2026-11-26-h100x2-latency, eager; 5.4 against
9.9 in a CUDA graph). With a 64 KiB peer copy queued after each wait the gain was gone (10.5
against 9.8 us): a copy after a kernel starts later than after a memop. This module holds that
kernel (``conccl_spin_wait``) and, for comparing kernel writes with ``cuStreamWriteValue32``
(slower: 4.2 us one way against 2.85), a writing one (``conccl_signal_write``). Compiled once per
process and device with NVRTC, without headers, like :mod:`conccl.kernels.reduce`.

What a wait costs and what bounds it:

* SMs: one CTA of one warp (only its thread 0 polls) on one SM for as long as it waits; a GEMM
  on that SM loses one warp slot, nothing else.
* It needs that slot to start: launch it on a high-priority stream, so that the CTA scheduler
  gives it the first free slot while a GEMM occupies every SM (a normal-priority launch would
  queue behind the GEMM's remaining CTAs; a memop wait needs no SM at all).
* Bounded: after ``timeout_ns`` (``%globaltimer``, from the kernel's start) it sets the
  ``timed_out`` word to 1 and returns; the stream then runs on **as if released**, so whoever
  launched it must read that word before trusting what followed (the default bound,
  :func:`timeout_ns`, is 300 s: far past any watchdog, only a backstop against a wedged GPU).
* An abort word: any nonzero value there ends every wait at once (same caveat: the work queued
  after it runs on stale data). Writing the awaited value into the waited words, as the
  watchdog's release does, also releases it.

The module imports without CUDA or cuda-python: both are loaded where a wait is first built.
"""
from __future__ import annotations

import ctypes
import functools
import math
import os

from ..device.driver import check, driver, load_module

MAX_WAITS = 8  # words per launch: one per peer of an 8-GPU NVLink node
THREADS = 32  # one warp (a smaller CTA still takes one); thread 0 polls, the rest exit
DEFAULT_TIMEOUT_S = 300
# Between polls. __nanosleep(20) takes the warp off its scheduler between polls, for a wait that
# may share an SM with a GEMM for milliseconds (not measured), at about no latency: 2 x H100,
# 200 round trips (benchmarks/2026-11-26-h100x2-latency), 5.71 us a round trip against 5.69
# unslept, eager; 11.2 against 10.8 in a graph (runs 10.8-11.6 and 10.7-10.9). 0 compiles it out.
POLL_SLEEP_NS = 20
# A system-scope fence after the waits: off. It would order only this thread's later accesses,
# and it has none (what the stream runs next starts after the kernel has ended), yet it cost
# 1.6 us a wait (same probe: a satisfied wait 3.68 us back to back against 2.10; round trip
# 8.83 against 5.71). SpinWaitLaunch(end_fence=True) puts it back.
END_FENCE = False


# Where the executor waits for a reduction's signals with this kernel instead of a stream
# memory wait (conccl.executors.cuda.program.spin_before_reductions): "graphs" (the default,
# captured calls), "always" (eager calls too: a kernel launch per call costs more host time
# than a memop batch, and a settled call then keeps its driver calls), "never" (stream memory
# waits only: a call's one SM step is its reduction). CONCCL_SPIN_WAITS sets it.
SPIN_MODES = ("graphs", "always", "never")


def spin_mode() -> str:
    """``CONCCL_SPIN_WAITS`` (:data:`SPIN_MODES`), else "graphs"; read where a group's executor is
    made: a bad value is refused there."""
    raw = os.environ.get("CONCCL_SPIN_WAITS", "") or "graphs"
    if raw not in SPIN_MODES:
        raise ValueError(f"CONCCL_SPIN_WAITS must be one of {', '.join(SPIN_MODES)}, got {raw!r}")
    return raw


def timeout_ns() -> int:
    """The wait's bound in nanoseconds: ``CONCCL_SPIN_TIMEOUT_S`` (seconds, may be fractional),
    else :data:`DEFAULT_TIMEOUT_S`. Read where a wait is built, not at import: a bad value must
    not break what runs without a GPU."""
    raw = os.environ.get("CONCCL_SPIN_TIMEOUT_S", "")
    if not raw:
        return DEFAULT_TIMEOUT_S * 10**9
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= 86400:  # NaN fails too
        raise ValueError(f"CONCCL_SPIN_TIMEOUT_S must be a number of seconds above 0 and at most 86400, got {raw!r}")
    return max(1, int(seconds * 1e9))


_SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
#error "conccl's spin wait needs sm_70 (ld.acquire, __nanosleep)"
#endif
__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v; asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ u32 ld_relaxed(const u32* p) {
    u32 v; asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ void st_relaxed(u32* p, u32 v) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u64 globaltimer() {  // ns, the same clock on every SM
    u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}

#define WORDS(q) q u32* w0, q u32* w1, q u32* w2, q u32* w3, q u32* w4, q u32* w5, q u32* w6, q u32* w7
#define VALUES u32 v0, u32 v1, u32 v2, u32 v3, u32 v4, u32 v5, u32 v6, u32 v7
#define PICK(x, k) ((k) == 0 ? x##0 : (k) == 1 ? x##1 : (k) == 2 ? x##2 : (k) == 3 ? x##3 : \
                    (k) == 4 ? x##4 : (k) == 5 ? x##5 : (k) == 6 ? x##6 : x##7)

// Waits until (int)(*w_i - v_i) >= 0 for every i < n, in order.
extern "C" __global__ void __launch_bounds__(32) conccl_spin_wait(WORDS(const), VALUES, int n, const u32* abort_word,
                                                                  u64 timeout_ns, u32* timed_out_word) {
    if (threadIdx.x != 0) return;
    const u64 start = globaltimer();
    for (int i = 0; i < n; ++i) {
        const u32* w = PICK(w, i);
        const u32 v = PICK(v, i);
        for (;;) {
            // The relaxed abort load first: an acquire orders the loads after it, not before,
            // so both are in flight at once and a poll costs one load's latency, not two.
            const u32 aborted = ld_relaxed(abort_word);
            if ((int)(ld_acquire(w) - v) >= 0) break;
            if (aborted) return;
            if (globaltimer() - start > timeout_ns) { st_relaxed(timed_out_word, 1u); return; }
#if POLL_SLEEP_NS > 0
            __nanosleep(POLL_SLEEP_NS);
#endif
        }
    }
    // What the stream runs next (copies, kernels) starts once the kernel has ended: it reads the
    // peer's data, released before its signal, through this GPU's L2 or NVLink, never this SM's
    // L1. The fence is optional (END_FENCE): measured at 1.6 us, and nothing after it to order.
#if END_FENCE
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
}

// Writes v_i into *w_i for every i < n: what cuStreamWriteValue32 with default flags does
// (a system-scope fence, then the write), run by one thread so the two can be compared. One
// fence, then relaxed stores: the PTX release pattern, st.release's meaning for every word at
// the price of one fence (st.release after the fence paid for two: 4.9 us back to back, now 3.5).
extern "C" __global__ void __launch_bounds__(32) conccl_signal_write(WORDS(), VALUES, int n) {
    if (threadIdx.x != 0) return;
    // Copies queued before the kernel finished before it started (stream order); the fence is
    // the memop's system-scope fence, so a peer that sees the word sees them too.
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    for (int i = 0; i < n; ++i) st_relaxed(PICK(w, i), PICK(v, i));
}
"""


@functools.lru_cache(maxsize=None)
def _module(device_index: int, poll_sleep_ns: int = POLL_SLEEP_NS, end_fence: bool = END_FENCE):
    """(module, spin wait, signal write) on ``device_index``'s primary context (current when
    torch runs there). Called with every argument positional: one cache entry per variant."""
    cu = driver()
    defines = f"#define POLL_SLEEP_NS {int(poll_sleep_ns)}\n#define END_FENCE {int(bool(end_fence))}\n"
    module = load_module(device_index, defines + _SOURCE, "conccl_spin.cu", "the spin-wait kernel")
    return module, check(cu.cuModuleGetFunction(module, b"conccl_spin_wait")), \
        check(cu.cuModuleGetFunction(module, b"conccl_signal_write"))


def _words(addresses: tuple[int, ...], deltas: tuple[int, ...], what: str) -> None:
    # Checked before anything touches CUDA: a bad program fails where it is built, on any machine.
    if not 1 <= len(addresses) <= MAX_WAITS:
        raise ValueError(f"{what} takes 1 to {MAX_WAITS} words per launch, got {len(addresses)}")
    if len(deltas) != len(addresses):
        raise ValueError(f"{what}: {len(addresses)} addresses but {len(deltas)} deltas")


class _Launch:
    """A kernel's parameters built once (the driver copies them at launch, also into a graph
    being captured); :meth:`launch` writes ``(seq + delta) & 0xFFFFFFFF`` into each value."""

    def _build(self, function, addresses, deltas, tail: list) -> None:
        self.function = function
        ptrs = list(addresses) + [addresses[0]] * (MAX_WAITS - len(addresses))  # unused words are never read
        values = [ctypes.c_uint(0) for _ in range(MAX_WAITS)]
        # Parameter order is the kernel's: 8 word pointers, 8 values, n, then the kernel's own.
        self._values = [ctypes.c_void_p(p) for p in ptrs] + values + [ctypes.c_int(len(addresses))] + tail
        self._params = (ctypes.c_void_p * len(self._values))(*[ctypes.addressof(v) for v in self._values])
        self.params = ctypes.addressof(self._params)
        self._patches = tuple(zip(values, deltas))

    def launch(self, cu, stream, seq: int):
        """Queue the kernel on ``stream`` (a ``CUstream``) for call ``seq``; returns
        cuLaunchKernel's result tuple, unchecked (the caller names the failing step)."""
        for value, delta in self._patches:
            value.value = (seq + delta) & 0xFFFFFFFF
        return cu.cuLaunchKernel(self.function, 1, 1, 1, THREADS, 1, 1, 0, stream, self.params, 0)


class SpinWaitLaunch(_Launch):
    """One prebuilt ``conccl_spin_wait``: waits, in order, until each word at ``addresses[i]``
    is GEQ ``seq + deltas[i]``; released early by a nonzero ``abort_address`` word; after
    ``timeout_ns`` sets the ``timed_out_address`` word to 1 and returns."""

    def __init__(self, device_index: int, addresses: tuple[int, ...], deltas: tuple[int, ...], abort_address: int,
                 timed_out_address: int, timeout_ns: int, *, poll_sleep_ns: int = POLL_SLEEP_NS,
                 end_fence: bool = END_FENCE):
        _words(addresses, deltas, "a spin wait")
        if timeout_ns <= 0:
            raise ValueError(f"a spin wait's timeout must be positive, got {timeout_ns} ns")
        _, function, _ = _module(device_index, poll_sleep_ns, end_fence)
        self._build(function, addresses, deltas, [ctypes.c_void_p(abort_address), ctypes.c_ulonglong(timeout_ns),
                                                  ctypes.c_void_p(timed_out_address)])


class SignalWriteLaunch(_Launch):
    """One prebuilt ``conccl_signal_write``: writes ``seq + deltas[i]`` into the word at
    ``addresses[i]`` (a system-scope fence first, then the stores)."""

    def __init__(self, device_index: int, addresses: tuple[int, ...], deltas: tuple[int, ...]):
        _words(addresses, deltas, "a signal write")
        _, _, function = _module(device_index, POLL_SLEEP_NS, END_FENCE)  # the default wait's module
        self._build(function, addresses, deltas, [])
