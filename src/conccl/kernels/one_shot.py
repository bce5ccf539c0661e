"""A whole small collective call as one kernel of one CTA: stage, signal, wait, read over NVLink.

A copy-engine call pays for its signals (stream memory operations: 6.5 us one way on 2 x H100
eager) and for a driver call per step. For a small call this kernel
(``kernels/cuda/one_shot.cu``) does the whole call in one launch, its signals by loads and
stores from the SM (a kernel polling a word woke in 2.85 us one way on the same GPUs,
:mod:`conccl.kernels.spin`; this kernel's own round trip is not measured yet): it copies the
rank's input into its staging buffer, signals READY to every peer, waits for every peer's READY,
reads what it needs from the peers' staging buffers with loads through peer pointers (NVLink),
writes the output, signals DONE and (eager) makes the release.

Two kinds: 0 gather (all-gather, all-to-all: pieces copied) and 1 reduce (all-reduce,
reduce-scatter: ``sum(scale * x_q)`` over every rank's piece in rank order, fp32, rounded once:
exactly :mod:`conccl.kernels.reduce`'s arithmetic, so the copy-engine path's bits).

What it costs and needs:

* SMs: one CTA of :data:`THREADS` threads on one SM, for the whole call, waits included: it
  spins on its peers' signals and then reads every peer's piece itself (loads over NVLink,
  about 128 KiB in flight for the CTA), so it is for small calls only.
* Launch it on a high-priority stream: beside a GEMM that fills every SM, the CTA scheduler
  gives it the first free slot instead of queueing it behind the GEMM's remaining CTAs.
* Workspace: ``stage_bytes`` of the caller's staging buffer, which must be peer-mapped; the
  caller double-buffers it (call ``seq`` uses half ``seq % 2``: :mod:`conccl.schedule.base`), so the
  staging of call ``seq`` only has to wait for the peers' reads of call ``seq - 2``.
* Bounded like :mod:`conccl.kernels.spin`'s wait: every spin ends after ``timeout_ns``
  from the kernel's start (``%globaltimer``), setting the ``timed_out`` word to 1, or at once on
  a nonzero abort word; the kernel then goes on **as if released** (the group is broken anyway,
  the watchdog reports it), so the output of a call that timed out is garbage.

Signals (words ``kind * world + src`` in the owner's pad, waits GEQ with wrap-around:
``(int)(word - value) >= 0``). Eager (``graph == 0``): READY and DONE carry ``seq``; at its end
the call waits for every peer's DONE(seq - 1) and writes FREE = ``seq`` to every peer (the
release of :func:`conccl.schedule.base.release_ops`). Captured (``graph == 1``: one graph replayed,
the sequence number frozen): every signal writes 1 and every waiter resets the word to 0 once
it has seen it; the call starts by waiting for each peer's FREE (>= 1, then reset: the peer
finished reading this rank's staging buffer in the previous replay; the caller primes the words
with 1 for the first one), and ``done_to`` points at the peers' FREE words, so the DONE it
writes is that FREE. The memory ordering (why a fence and relaxed stores, why ``ld.global.cg``
for peer data) is said in the kernel source.

Compiled once per process and device by :mod:`conccl.kernels.loader`; the module imports
without CUDA or cuda-python: both are loaded where a launch is first built, after its
arguments are checked.
"""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

from . import loader
from .spin import POLL_SLEEP_NS

MAX_WORLD = 8  # the kernel's arrays: an NVLink node's GPUs
THREADS = 1024  # the CTA: its threads share the copies and the sum; thread t < world waits for peer t
KIND_GATHER, KIND_REDUCE = 0, 1
KINDS = {"gather": KIND_GATHER, "reduce": KIND_REDUCE}
DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}  # the reduction's; a gather ignores it
ESIZE = {0: 4, 1: 2, 2: 2}

_u64, _i64 = ctypes.c_uint64, ctypes.c_int64
_ARRAYS = ("staged", "signal_to", "done_to", "free_to", "wait_signal", "wait_done", "wait_free",
           "src_off", "dst_off", "nbytes")
_OFFSETS = ("src_off", "dst_off", "nbytes")  # signed, the rest addresses


class OneShotArgs(ctypes.Structure):
    """The kernel's one parameter, passed by value: the same layout as ``struct OneShotArgs``
    in ``kernels/cuda/one_shot.cu`` (8-byte fields first, the 4-byte ones last and in pairs, so
    no padding: 720 bytes, 8-aligned; tests/unit/test_one_shot_args.py checks every offset)."""

    _fields_ = ([(name, (_i64 if name in _OFFSETS else _u64) * MAX_WORLD) for name in _ARRAYS]
                + [("input", _u64), ("output", _u64), ("abort_word", _u64), ("timed_out_word", _u64),
                   ("timeout_ns", _u64), ("stage_bytes", _i64),
                   ("world", ctypes.c_int), ("rank", ctypes.c_int), ("kind", ctypes.c_int), ("dtype", ctypes.c_int),
                   ("graph", ctypes.c_int), ("pad0", ctypes.c_int), ("seq", ctypes.c_uint), ("scale", ctypes.c_float)])


# one_shot.cu's options: its CTA (the __launch_bounds__ it is launched with) and the polls' sleep.
DEFINES = {"THREADS": THREADS, "POLL_SLEEP_NS": POLL_SLEEP_NS}


@functools.lru_cache(maxsize=None)
def _function(device_index: int):
    """``conccl_one_shot`` on ``device_index``'s primary context (current when torch runs there)."""
    return loader.function(device_index, "one_shot", "conccl_one_shot", DEFINES)


def _code(value, names: dict, what: str) -> int:
    code = names.get(value, value) if isinstance(value, str) else value
    if isinstance(code, bool) or not isinstance(code, int) or code not in names.values():
        raise ValueError(f"the one-shot kernel's {what} must be one of {sorted(names)} or {sorted(names.values())}, "
                         f"got {value!r}")
    return code


def make_args(*, world: int, rank: int, kind, dtype, graph: bool, staged: Sequence[int], signal_to: Sequence[int],
              done_to: Sequence[int], free_to: Sequence[int], wait_signal: Sequence[int], wait_done: Sequence[int],
              wait_free: Sequence[int], src_off: Sequence[int], dst_off: Sequence[int], nbytes: Sequence[int],
              input: int, output: int, stage_bytes: int, scale: float, abort_word: int, timed_out_word: int,
              timeout_ns: int) -> OneShotArgs:
    """The kernel's argument struct (pure: no CUDA). Every per-rank sequence has ``world``
    entries, indexed by rank (the own rank's signal words are never touched: 0 will do); the
    rest of the kernel's arrays are filled with 0. ``kind``: 0 / "gather" or 1 / "reduce";
    ``dtype``: 0 / "float32", 1 / "bfloat16", 2 / "float16" (a gather's is ignored: pass 0).
    ``seq`` is written at each launch (:meth:`OneShotLaunch.launch`). Raises ValueError for
    anything the kernel cannot run (checked again by :class:`OneShotLaunch`)."""
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD:
        raise ValueError(f"the one-shot kernel takes a world of 1 to {MAX_WORLD} ranks, got {world!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"the one-shot kernel's rank must be in 0..{world - 1}, got {rank!r}")
    per_rank = {"staged": staged, "signal_to": signal_to, "done_to": done_to, "free_to": free_to,
                "wait_signal": wait_signal, "wait_done": wait_done, "wait_free": wait_free, "src_off": src_off,
                "dst_off": dst_off, "nbytes": nbytes}
    args = OneShotArgs()
    for name, values in per_rank.items():
        values = list(values)
        if len(values) != world:
            raise ValueError(f"the one-shot kernel's {name} needs one entry per rank ({world}), got {len(values)}")
        low, high, what = (-(1 << 63), 1 << 63, "a 64-bit byte count") if name in _OFFSETS else \
            (0, 1 << 64, "a device address")
        for x in values:
            if isinstance(x, bool) or not isinstance(x, int) or not low <= x < high:
                raise ValueError(f"the one-shot kernel's {name} holds {x!r}: not {what}")
        getattr(args, name)[:] = values + [0] * (MAX_WORLD - world)
    for name, x in (("input", input), ("output", output), ("abort_word", abort_word),
                    ("timed_out_word", timed_out_word), ("timeout_ns", timeout_ns)):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 1 << 64:
            raise ValueError(f"the one-shot kernel's {name} must be a 64-bit unsigned integer, got {x!r}")
        setattr(args, name, x)
    if not isinstance(stage_bytes, int) or not 0 <= stage_bytes < 1 << 63:
        raise ValueError(f"the one-shot kernel's stage_bytes must be a byte count, got {stage_bytes!r}")
    args.stage_bytes, args.world, args.rank = stage_bytes, world, rank
    args.kind, args.dtype = _code(kind, KINDS, "kind"), _code(dtype, DTYPES, "dtype")
    args.graph, args.scale, args.seq = int(bool(graph)), float(scale), 0
    _validate(args)
    return args


def _validate(a: OneShotArgs) -> None:
    """Everything the kernel relies on, checked before anything touches CUDA: a bad address
    would fault the GPU and kill the context, a bad count or code would read past the arrays."""
    if not 1 <= a.world <= MAX_WORLD:
        raise ValueError(f"the one-shot kernel takes a world of 1 to {MAX_WORLD} ranks, got {a.world}")
    if not 0 <= a.rank < a.world:
        raise ValueError(f"the one-shot kernel's rank must be in 0..{a.world - 1}, got {a.rank}")
    if a.kind not in KINDS.values():
        raise ValueError(f"the one-shot kernel's kind must be 0 (gather) or 1 (reduce), got {a.kind}")
    if a.dtype not in DTYPES.values():
        raise ValueError(f"the one-shot kernel's dtype must be 0 (float32), 1 (bfloat16) or 2 (float16), got {a.dtype}")
    if a.graph not in (0, 1):
        raise ValueError(f"the one-shot kernel's graph flag must be 0 or 1, got {a.graph}")
    if a.stage_bytes < 0 or any(a.nbytes[p] < 0 for p in range(a.world)):
        raise ValueError(f"the one-shot kernel's byte counts must be >= 0: stage_bytes {a.stage_bytes}, "
                         f"nbytes {list(a.nbytes[:a.world])}")
    if a.timeout_ns <= 0:
        raise ValueError("the one-shot kernel's timeout must be positive")
    r, peers = a.rank, [p for p in range(a.world) if p != a.rank]
    needed = [("abort_word", a.abort_word), ("timed_out_word", a.timed_out_word)]
    needed += [(f"{name}[{p}]", getattr(a, name)[p]) for name in ("signal_to", "done_to", "wait_signal")
               for p in peers]
    needed += [(f"wait_free[{p}]", a.wait_free[p]) for p in peers if a.graph]
    needed += [(f"{name}[{p}]", getattr(a, name)[p]) for name in ("free_to", "wait_done") for p in peers
               if not a.graph]
    if a.stage_bytes:
        needed += [("input", a.input), (f"staged[{r}]", a.staged[r])]
    if a.kind == KIND_GATHER:
        if a.nbytes[r]:
            needed += [("input", a.input), ("output", a.output)]
        needed += [x for p in peers if a.nbytes[p] for x in ((f"staged[{p}]", a.staged[p]), ("output", a.output))]
    elif a.nbytes[0]:
        esize = ESIZE[a.dtype]
        if a.nbytes[0] % esize or a.src_off[0] % esize or a.dst_off[0] % esize:
            raise ValueError(f"the one-shot reduction's bytes and offsets must be whole elements of {esize} bytes: "
                             f"nbytes {a.nbytes[0]}, src_off {a.src_off[0]}, dst_off {a.dst_off[0]}")
        needed += [("input", a.input), ("output", a.output)] + [(f"staged[{p}]", a.staged[p]) for p in peers]
    missing = sorted({name for name, address in needed if not address})
    if missing:
        raise ValueError(f"the one-shot kernel would touch address 0 through {', '.join(missing)}")


class OneShotLaunch:
    """One prebuilt launch of ``conccl_one_shot``: grid 1, :data:`THREADS` threads, the struct
    as its one parameter (a copy of ``args``, validated first; the driver copies it at each
    launch, into a graph being captured too). :meth:`launch` writes the call's sequence number
    into it (a captured call: any; the kernel writes and waits for 1)."""

    def __init__(self, device_index: int, args: OneShotArgs):
        _validate(args)  # before anything touches CUDA: a bad call fails where it is built, on any machine
        self.args = OneShotArgs.from_buffer_copy(args)
        self.function = _function(device_index)
        self._params = (ctypes.c_void_p * 1)(ctypes.addressof(self.args))
        self.params = ctypes.addressof(self._params)

    def launch(self, cu, stream, seq: int):
        """Queue the kernel on ``stream`` (a ``CUstream``; a high-priority one: module doc) for
        call ``seq``; returns cuLaunchKernel's result tuple, unchecked (the caller names the
        failing step)."""
        self.args.seq = seq & 0xFFFFFFFF
        return cu.cuLaunchKernel(self.function, 1, 1, 1, THREADS, 1, 1, 0, stream, self.params, 0)
