"""The spin-wait kernel's module on the CPU: its bound's variable, what its source must keep (the
acquire load, the time bound, the abort check), and the launch parameters it builds, read back
from memory as the driver would copy them (no CUDA: the compiled module is faked)."""
from __future__ import annotations

import ctypes
import re

import pytest

from conccl.kernels import spin as cuda_spin


def test_timeout_env_is_read_where_asked_and_validated(monkeypatch):
    monkeypatch.delenv("CONCCL_SPIN_TIMEOUT_S", raising=False)
    assert cuda_spin.timeout_ns() == cuda_spin.DEFAULT_TIMEOUT_S * 10**9 == 300 * 10**9
    for raw, ns in (("10", 10 * 10**9), ("2.5", 2_500_000_000), ("0.001", 1_000_000), ("86400", 86400 * 10**9)):
        monkeypatch.setenv("CONCCL_SPIN_TIMEOUT_S", raw)
        assert cuda_spin.timeout_ns() == ns, raw
    for bad in ("0", "-1", "nan", "inf", "many", "1e6", " ", "10s"):
        monkeypatch.setenv("CONCCL_SPIN_TIMEOUT_S", bad)
        with pytest.raises(ValueError, match="CONCCL_SPIN_TIMEOUT_S"):
            cuda_spin.timeout_ns()


def _body(name: str) -> str:
    start = cuda_spin._SOURCE.index(f" {name}(")
    return cuda_spin._SOURCE[start:cuda_spin._SOURCE.index("\n}\n", start)]


def test_the_wait_is_an_acquire_load_bounded_in_time_and_abortable():
    body = _body("conccl_spin_wait")
    src = cuda_spin._SOURCE
    assert 'asm volatile("ld.acquire.sys.global.u32' in src and "ld_acquire(w)" in body
    assert "(int)(ld_acquire(w) - v) >= 0" in body  # GEQ as the memop's: wraps around
    assert "%%globaltimer" in src  # a literal % in inline asm, else NVRTC rejects it
    assert "globaltimer() - start > timeout_ns" in body and "st_relaxed(timed_out_word, 1u); return;" in body
    assert "ld_relaxed(abort_word)" in body and "if (aborted) return;" in body
    # the end fence: compiled in only where asked (END_FENCE), and then last
    assert body.rstrip().endswith('#if END_FENCE\n    asm volatile("fence.acq_rel.sys;" ::: "memory");\n#endif')
    assert cuda_spin.END_FENCE is False
    write = _body("conccl_signal_write")  # the release pattern: one system-scope fence, then the stores
    assert write.count("fence.acq_rel.sys") == 1 and write.index("fence.acq_rel.sys") < write.index("st_relaxed(")
    assert 'asm volatile("st.relaxed.sys.global.u32' in src
    assert "__launch_bounds__(32) conccl_spin_wait" in src and cuda_spin.THREADS == 32


def _no_cuda(*args, **kwargs):
    raise AssertionError("touched CUDA before checking its arguments")


@pytest.mark.parametrize("addresses,deltas", [
    (tuple(range(4, 40, 4)), (0,) * 9),  # 9 words: one more than MAX_WAITS
    ((), ()),
    ((4, 8), (0,)),
])
def test_word_counts_are_checked_before_cuda(monkeypatch, addresses, deltas):
    monkeypatch.setattr(cuda_spin, "_module", _no_cuda)
    with pytest.raises(ValueError):
        cuda_spin.SpinWaitLaunch(0, addresses, deltas, 4, 8, 10**9)
    with pytest.raises(ValueError):
        cuda_spin.SignalWriteLaunch(0, addresses, deltas)


def test_nonpositive_timeout_is_refused(monkeypatch):
    monkeypatch.setattr(cuda_spin, "_module", _no_cuda)
    with pytest.raises(ValueError, match="timeout"):
        cuda_spin.SpinWaitLaunch(0, (4,), (0,), 8, 12, 0)


def _kernel_param_sizes(name: str) -> list[int]:
    """Bytes of each parameter of kernel ``name`` as its source declares them."""
    params = re.search(rf"{name}\(((?:[^()]|\([^()]*\))*)\)", cuda_spin._SOURCE).group(1)
    sizes = []
    for p in (p.strip() for p in params.split(",")):
        if p.startswith("WORDS("):
            sizes += [8] * cuda_spin.MAX_WAITS
        elif p == "VALUES":
            sizes += [4] * cuda_spin.MAX_WAITS
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
    monkeypatch.setattr(cuda_spin, "_module", lambda device, sleep, fence: ("m", "spin", "write"))
    sizes = _kernel_param_sizes("conccl_spin_wait")
    assert len(sizes) == 20 and len(_kernel_param_sizes("conccl_signal_write")) == 17
    spin = cuda_spin.SpinWaitLaunch(3, (0x1000, 0x2000, 0x3000), (0, -1, 5), 0x4000, 0x5000, 7 * 10**9)
    cu = _FakeDriver()
    assert spin.launch(cu, "stream", 0) == (0,)
    (function, gx, gy, gz, bx, by, bz, shared, stream, params, extra), = cu.calls
    assert (function, gx, gy, gz, bx, by, bz, shared, stream, extra) == ("spin", 1, 1, 1, 32, 1, 1, 0, "stream", 0)
    words = [0x1000, 0x2000, 0x3000] + [0x1000] * 5  # unused slots repeat the first word, never read
    assert _read(params, sizes) == words + [0, 0xFFFFFFFF, 5, 0, 0, 0, 0, 0] + [3, 0x4000, 7 * 10**9, 0x5000]
    spin.launch(cu, "stream", 0xFFFFFFFE)  # the values are rewritten in place, modulo 2**32
    assert _read(cu.calls[-1][9], sizes)[8:11] == [0xFFFFFFFE, 0xFFFFFFFD, 3]

    write = cuda_spin.SignalWriteLaunch(3, (0x6000,), (2,))
    write.launch(cu, "s2", 10)
    assert cu.calls[-1][0] == "write" and cu.calls[-1][4:9:4] == (32, "s2")
    assert _read(cu.calls[-1][9], _kernel_param_sizes("conccl_signal_write")) == [0x6000] * 8 + [12] + [0] * 7 + [1]
