"""GPU tier: the spin-wait kernel (conccl.kernels.spin) on one GPU: it returns on a word
already reached, waits for a write from another stream and orders a copy after it, ends on the
abort word, ends on its time bound and says so, and is one kernel per launch.

The cases run once, in one process on one GPU (conccl.launch.run_per_gpu with nprocs=1;
marked ``gpus(1)``: a machine of one GPU runs them, conftest.py); every wait is bounded (20 s),
so a broken release fails its case instead of hanging the run.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpus(1)

ABORT, TIMED_OUT = 14, 15  # word indices in the test's word tensor
BOUND_NS = 20 * 10**9


def _cases(rank, world):
    import time

    from torch.profiler import ProfilerActivity, profile

    from conccl.device.driver import check, driver, signal_flags
    from conccl.kernels.spin import SpinWaitLaunch

    cu = driver()
    dev = torch.cuda.current_device()
    write_flags = signal_flags(cu)[1]
    words = torch.zeros(16, dtype=torch.int32, device="cuda")
    high, other = torch.cuda.Stream(priority=-1), torch.cuda.Stream()  # the wait's stream, the releasing one
    s, o = cu.CUstream(high.cuda_stream), cu.CUstream(other.cuda_stream)

    def addr(i):
        return words.data_ptr() + 4 * i

    def spin(idx, deltas, timeout_ns=BOUND_NS):
        return SpinWaitLaunch(dev, tuple(addr(i) for i in idx), deltas, addr(ABORT), addr(TIMED_OUT), timeout_ns)

    def write(i, value):
        check(cu.cuStreamWriteValue32(o, cu.CUdeviceptr(addr(i)), value & 0xFFFFFFFF, write_flags))

    def reset(**set_words):
        torch.cuda.synchronize()
        words.zero_()
        for i, v in set_words.items():
            words[int(i[1:])] = v
        torch.cuda.synchronize()

    def word(i):
        return int(words[i].item()) & 0xFFFFFFFF

    def queued_and_held(launch, seq):
        """Launch on the high-priority stream, then whether it is still waiting 50 ms later."""
        check(launch.launch(cu, s, seq))
        done = torch.cuda.Event()
        done.record(high)
        time.sleep(0.05)
        return done, not done.query()

    out = {}
    # (a) words already reached, one of them past a wrap: 2 is GEQ 0xFFFFFFFE
    reset(w0=5, w1=2)
    t0 = time.perf_counter()
    check(spin((0, 1), (2, -5)).launch(cu, s, 3))  # values 5 and 0xFFFFFFFE
    high.synchronize()
    out["reached"] = {"s": time.perf_counter() - t0, "timed_out": word(TIMED_OUT)}

    # (b) two words, released in the wrong order by another stream; a copy queued behind the
    # wait reads a payload written before the release
    reset()
    dst = torch.zeros(1, dtype=torch.int32, device="cuda")
    done, held = queued_and_held(spin((2, 3), (0, 0)), 7)
    check(cu.cuMemcpyAsync(cu.CUdeviceptr(dst.data_ptr()), cu.CUdeviceptr(addr(4)), 4, s))
    write(3, 7)  # the second word first: the wait still holds on the first
    time.sleep(0.05)
    held_on_first = not done.query()
    write(4, 0xABC)  # the payload, then the signal (the write's fence orders them)
    write(2, 7)
    high.synchronize()
    out["released"] = {"held": held, "held_on_first": held_on_first, "copied": int(dst.item()),
                       "timed_out": word(TIMED_OUT)}

    # (c) the abort word ends a wait that nothing releases
    reset()
    done, held = queued_and_held(spin((5,), (0,)), 1)
    write(ABORT, 1)
    t0 = time.perf_counter()
    high.synchronize()
    out["aborted"] = {"held": held, "s": time.perf_counter() - t0, "timed_out": word(TIMED_OUT), "word": word(5)}

    # (d) a 1 ms bound ends it and says so
    reset()
    t0 = time.perf_counter()
    check(spin((6,), (0,), timeout_ns=1_000_000).launch(cu, s, 1))
    high.synchronize()
    out["bounded"] = {"s": time.perf_counter() - t0, "timed_out": word(TIMED_OUT)}

    # (e) one kernel per launch, nothing else
    reset(w7=1)
    reached = spin((7,), (0,))
    check(reached.launch(cu, s, 1))  # warm-up, outside the profile
    high.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            check(reached.launch(cu, s, 1))
        high.synchronize()
    out["kernels"] = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return out


@pytest.fixture(scope="module")
def results():
    from conccl.launch import run_per_gpu

    return run_per_gpu(_cases, nprocs=1, timeout_s=300)[0]


def test_a_word_already_reached_returns_at_once(results):
    r = results["reached"]
    assert r["timed_out"] == 0 and r["s"] < 1.0, r


def test_a_write_from_another_stream_releases_it_and_a_copy_after_it_sees_the_data(results):
    r = results["released"]
    assert r["held"] and r["held_on_first"], r  # it waited, for both words in order
    assert r["timed_out"] == 0 and r["copied"] == 0xABC, r


def test_the_abort_word_releases_it(results):
    r = results["aborted"]
    assert r["held"] and r["timed_out"] == 0 and r["word"] == 0 and r["s"] < 1.0, r


def test_a_short_bound_ends_it_and_sets_the_timed_out_word(results):
    r = results["bounded"]
    assert r["timed_out"] == 1 and r["s"] < 1.0, r


def test_the_profiler_shows_one_kernel_per_launch(results):
    kernels = results["kernels"]
    assert kernels.count("conccl_spin_wait") == 3 and set(kernels) == {"conccl_spin_wait"}, kernels
