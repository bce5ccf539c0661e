"""The spin-wait kernel's module on the CPU: what its source (kernels/cuda/spin.cu and the wait
of conccl.cuh) must keep (the acquire load, the time bound, the abort check, no fence at the
end), and the launch parameters it builds, read back from memory as the driver would copy them
(no CUDA: the compiled kernel is faked)."""
from __future__ import annotations

import ctypes
import re

import pytest

from conccl.kernels import loader, spin


def _body(name: str, source: str) -> str:
    start = source.index(f" {name}(")
    return source[start:source.index("\n}\n", start)]


def test_the_wait_is_an_acquire_load_bounded_in_time_and_abortable():
    src, header = loader.source("spin"), loader.source("conccl.cuh")
    body, wait = _body("conccl_spin_wait", src), _body("wait_geq", header)
    assert '#include "conccl.cuh"' in src
    # every word in order, the kernel ending where a wait ends early
    assert "for (int i = 0; i < n; ++i)" in body
    assert "if (!wait_geq<POLL_SLEEP_NS>(PICK(w, i), PICK(v, i), abort_word, start, timeout_ns, timed_out_word)) " \
           "return;" in body
    assert "const u64 start = globaltimer();" in body  # the bound counts from the kernel's start
    assert 'asm volatile("ld.acquire.sys.global.u32' in header and "ld_acquire(w)" in wait
    assert "(int)(ld_acquire(w) - v) >= 0) return true;" in wait  # GEQ as the memop's: wraps around
    assert "%%globaltimer" in header  # a literal % in inline asm, else NVRTC rejects it
    assert "globaltimer() - start > timeout_ns" in wait and "st_relaxed(timed_out_word, 1u); return false;" in wait
    assert "ld_relaxed(abort_word)" in wait and "if (aborted) return false;" in wait
    # the relaxed abort load before the acquire: both in flight at once
    assert wait.index("ld_relaxed(abort_word)") < wait.index("ld_acquire(w)")
    assert "if constexpr (SLEEP_NS > 0) __nanosleep(SLEEP_NS);" in wait
    assert "fence" not in body  # no fence after the waits: nothing of this thread's after them to order
    assert "__launch_bounds__(32) conccl_spin_wait" in src and spin.THREADS == 32
    assert re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\w+\) )?(\w+)\(', src) == ["conccl_spin_wait"]


def _no_cuda(*args, **kwargs):
    raise AssertionError("touched CUDA before checking its arguments")


@pytest.mark.parametrize("addresses,deltas", [
    (tuple(range(4, 40, 4)), (0,) * 9),  # 9 words: one more than MAX_WAITS
    ((), ()),
    ((4, 8), (0,)),
])
def test_word_counts_are_checked_before_cuda(monkeypatch, addresses, deltas):
    monkeypatch.setattr(spin, "_function", _no_cuda)
    with pytest.raises(ValueError):
        spin.SpinWaitLaunch(0, addresses, deltas, 4, 8, 10**9)


def test_nonpositive_timeout_is_refused(monkeypatch):
    monkeypatch.setattr(spin, "_function", _no_cuda)
    with pytest.raises(ValueError, match="timeout"):
        spin.SpinWaitLaunch(0, (4,), (0,), 8, 12, 0)


def _kernel_param_sizes(name: str) -> list[int]:
    """Bytes of each parameter of kernel ``name`` as its source declares them."""
    params = re.search(rf"{name}\(((?:[^()]|\([^()]*\))*)\)", loader.source("spin")).group(1)
    sizes = []
    for p in (p.strip() for p in params.split(",")):
        if p.startswith("WORDS("):
            sizes += [8] * spin.MAX_WAITS
        elif p == "VALUES":
            sizes += [4] * spin.MAX_WAITS
        else:
            sizes.append(8 if "*" in p or p.startswith("u64") else 4)
    return sizes


class _FakeDriver:
    def __init__(self):
        self.calls = []

    def cuLaunchKernel(self, *args):  # noqa: N802
        self.calls.append(args)
        return (0,)


def _read(params: int, sizes: list[int]) -> list[int]:
    """The parameter values as the driver reads them: params points at one pointer per parameter."""
    ptrs = (ctypes.c_void_p * len(sizes)).from_address(params)
    kind = {8: ctypes.c_uint64, 4: ctypes.c_uint32}
    return [kind[s].from_address(ptrs[i]).value for i, s in enumerate(sizes)]


def test_launch_parameters_follow_the_kernel_and_take_the_sequence_number(monkeypatch):
    monkeypatch.setattr(spin, "_function", lambda device, sleep: ("spin", device, sleep))
    sizes = _kernel_param_sizes("conccl_spin_wait")
    assert len(sizes) == 20
    launch = spin.SpinWaitLaunch(3, (0x1000, 0x2000, 0x3000), (0, -1, 5), 0x4000, 0x5000, 7 * 10**9)
    cu = _FakeDriver()
    assert launch.launch(cu, "stream", 0) == (0,)
    (function, gx, gy, gz, bx, by, bz, shared, stream, params, extra), = cu.calls
    assert function == ("spin", 3, spin.POLL_SLEEP_NS) and spin.POLL_SLEEP_NS == 20
    assert (gx, gy, gz, bx, by, bz, shared, stream, extra) == (1, 1, 1, 32, 1, 1, 0, "stream", 0)
    words = [0x1000, 0x2000, 0x3000] + [0x1000] * 5  # unused slots repeat the first word, never read
    assert _read(params, sizes) == words + [0, 0xFFFFFFFF, 5, 0, 0, 0, 0, 0] + [3, 0x4000, 7 * 10**9, 0x5000]
    launch.launch(cu, "stream", 0xFFFFFFFE)  # the values are rewritten in place, modulo 2**32
    assert _read(cu.calls[-1][9], sizes)[8:11] == [0xFFFFFFFE, 0xFFFFFFFD, 3]


def test_the_kernel_is_compiled_with_the_poll_sleep(monkeypatch):
    asked = []
    monkeypatch.setattr(loader, "function", lambda *args: asked.append(args) or "fn")
    spin._function.cache_clear()
    try:
        assert spin._function(2) == "fn" and spin._function(2, 0) == "fn"
    finally:
        spin._function.cache_clear()
    assert asked == [(2, "spin", "conccl_spin_wait", {"POLL_SLEEP_NS": 20}),
                     (2, "spin", "conccl_spin_wait", {"POLL_SLEEP_NS": 0})]
