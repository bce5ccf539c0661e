"""GPU tier: conccl's copy-engine collectives on real GPUs, against NCCL.

Each test starts one process per GPU (skipping: conftest.py).
"""
from __future__ import annotations

import itertools
import time

import pytest

torch = pytest.importorskip("torch")

DTYPES = ["bfloat16", "float16", "float32", "int8"]
GiB = 1 << 30


def _random(nbytes: int, dtype, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda", generator=g).view(dtype)


def _same_bits(a, b) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _modes():
    import conccl

    A, S = conccl.Algorithm, conccl.StreamMode
    # (label, algorithm, stream mode, symmetric input, symmetric output)
    return [
        ("pull-staged", A.PULL, S.PER_PEER, False, False),
        ("pull-staged-single", A.PULL, S.SINGLE, False, False),
        ("pull-staged-batch", A.PULL, S.BATCH, False, False),
        ("pull-symmetric", A.PULL, S.PER_PEER, True, False),
        ("push", A.PUSH, S.PER_PEER, False, True),
        ("push-batch", A.PUSH, S.BATCH, False, True),
    ]


_ARENAS: dict = {}


def _alloc(n, dtype, symmetric, role="in"):
    """A fresh tensor, or a view at the start of a per-role symmetric arena allocated once:
    symmetric allocation is collective, so tests keep it out of the loops."""
    import conccl

    if not symmetric:
        return torch.empty(n, dtype=dtype, device="cuda")
    if role not in _ARENAS:
        _ARENAS[role] = conccl.empty(GiB + 4096, dtype=torch.uint8)
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    return _ARENAS[role][:nbytes].view(dtype)


def _a2a_equal_to_nccl(comm, out, inp, out_splits=None, in_splits=None, algo=None, smode=None) -> bool:
    import torch.distributed as dist

    ref = torch.empty_like(out)
    comm.all_to_all_single(out, inp, out_splits, in_splits, algorithm=algo, stream_mode=smode)
    dist.all_to_all_single(ref, inp, out_splits, in_splits)
    torch.cuda.synchronize()
    return _same_bits(out, ref)


def _check_equal_with_nccl(rank, world):
    import torch.distributed as dist

    import conccl
    from conccl.group import Group

    comm: Group = conccl.get_group()
    failures = []
    # Element counts per rank, from one element to 1 GiB of all-gather output.
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        esize = torch.empty((), dtype=dtype).element_size()
        counts = [1, 7, 1000, 4097, (1 << 20) + 3, (1 << 24) + 1, GiB // world // esize]
        for count in counts:
            for coll in ("all_gather", "all_to_all"):
                modes = _modes() if count in (7, (1 << 20) + 3) else _modes()[:1]
                for label, algo, smode, sym_in, sym_out in modes:
                    n_in = count * world if coll == "all_to_all" else count
                    n_out = count * world
                    inp = _alloc(n_in, dtype, sym_in)
                    inp.copy_(_random(n_in * esize, dtype, seed=rank * 7919 + count))
                    out = _alloc(n_out, dtype, sym_out, "out")
                    out.view(torch.uint8).fill_(0xAB)  # poison: every element must be written
                    ref = torch.empty(n_out, dtype=dtype, device="cuda")
                    if coll == "all_gather":
                        comm.all_gather_into_tensor(out, inp, algorithm=algo, stream_mode=smode)
                        dist.all_gather_into_tensor(ref, inp)
                    else:
                        comm.all_to_all_single(out, inp, algorithm=algo, stream_mode=smode)
                        dist.all_to_all_single(ref, inp)
                    torch.cuda.synchronize()
                    if not _same_bits(out, ref):
                        failures.append(f"{coll} {dtype_name} count={count} {label}")
                    del inp, out, ref
        torch.cuda.empty_cache()
    # Uneven splits, zero-length ones included, in every mode.
    for label, algo, smode, sym_in, sym_out in _modes():
        in_splits = [((rank + 2 * d) % 4) * 37 for d in range(world)]
        out_splits = [((s + 2 * rank) % 4) * 37 for s in range(world)]
        inp = _alloc(sum(in_splits) * 3, torch.bfloat16, sym_in).view(-1, 3)
        inp.copy_(_random(inp.numel() * 2, torch.bfloat16, seed=rank).view(-1, 3))
        out = _alloc(sum(out_splits) * 3, torch.bfloat16, sym_out, "out").view(-1, 3)
        if not _a2a_equal_to_nccl(comm, out, inp, out_splits, in_splits, algo, smode):
            failures.append(f"all_to_all uneven {label}")
    # One-way traffic (only rank 0 receives, then only rank 0 sends): empty views of
    # symmetric buffers on some ranks. An empty view's data_ptr() is 0; it once sent peers'
    # copies to a wild address.
    piece = 4096 * 3 + 5
    for to_zero in (True, False):
        for label, algo, smode, sym_in, sym_out in _modes():
            if to_zero:
                in_splits = [piece if (rank != 0 and d == 0) else 0 for d in range(world)]
                out_splits = [piece if (rank == 0 and s != 0) else 0 for s in range(world)]
            else:
                in_splits = [piece if (rank == 0 and d != 0) else 0 for d in range(world)]
                out_splits = [piece if (rank != 0 and s == 0) else 0 for s in range(world)]
            inp = _alloc(sum(in_splits), torch.int8, sym_in)
            inp.copy_(_random(inp.numel(), torch.int8, seed=rank + 11))
            out = _alloc(sum(out_splits), torch.int8, sym_out, "out")
            if not _a2a_equal_to_nccl(comm, out, inp, out_splits, in_splits, algo, smode):
                failures.append(f"all_to_all one-way to_zero={to_zero} {label}")
    # Views that start at a different offset of the symmetric buffers on every rank.
    for label, algo, smode, sym_in, sym_out in _modes():
        n = 1000 * world
        big_in = _alloc(n + 64 * world, torch.float16, sym_in)
        big_out = _alloc(n * world + 64 * world, torch.float16, sym_out, "out")
        big_out.view(torch.uint8).fill_(0xAB)
        inp = big_in[64 * (world - 1 - rank):64 * (world - 1 - rank) + n]
        inp.copy_(_random(n * 2, torch.float16, seed=rank + 5))
        out = big_out[64 * rank:64 * rank + n * world]
        ref = torch.empty_like(out)
        comm.all_gather_into_tensor(out, inp, algorithm=algo, stream_mode=smode)
        dist.all_gather_into_tensor(ref, inp)
        torch.cuda.synchronize()
        outside = torch.cat([big_out[:64 * rank], big_out[64 * rank + n * world:]]).view(torch.uint8)
        if not _same_bits(out, ref) or not bool((outside == 0xAB).all()):
            failures.append(f"all_gather views at rank offsets {label}")
        if not _a2a_equal_to_nccl(comm, big_out[64 * rank:64 * rank + n], inp, algo=algo, smode=smode):
            failures.append(f"all_to_all views at rank offsets {label}")
    # In place: the input is the output's own chunk.
    for sym in (False, True):
        out = _alloc(4096 * world, torch.float32, sym, "out")
        out.copy_(_random(out.numel() * 4, torch.float32, seed=rank).view(torch.float32))
        ref = torch.empty_like(out)
        mine = out[rank * 4096:(rank + 1) * 4096]
        dist.all_gather_into_tensor(ref, mine.clone())
        conccl.all_gather_into_tensor(out, mine)
        torch.cuda.synchronize()
        if not _same_bits(out, ref):
            failures.append(f"all_gather in place symmetric={sym}")
    return failures


def test_bitwise_equal_to_nccl():
    from conccl.launch import run_per_gpu

    results = run_per_gpu(_check_equal_with_nccl)
    assert all(r == [] for r in results), results


def _profile_collectives(rank, world):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    import conccl

    n = 1 << 22
    found = {}
    conccl.get_group()  # set-up (NCCL handshakes, pad zeroing) happens outside the profile
    for coll, sym, mode in itertools.product(("all_gather", "all_to_all"), (False, True),
                                             (conccl.StreamMode.BATCH, conccl.StreamMode.SINGLE)):
        conccl.set_options(stream_mode=mode)
        inp = _alloc(n * world if coll == "all_to_all" else n, torch.bfloat16, sym)
        inp.normal_()
        out = torch.empty(n * world, dtype=torch.bfloat16, device="cuda")
        # a first call outside the profile grows the workspace (a symmetric allocation)
        (conccl.all_gather_into_tensor(out, inp) if coll == "all_gather" else conccl.all_to_all_single(out, inp))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                if coll == "all_gather":
                    conccl.all_gather_into_tensor(out, inp)
                else:
                    conccl.all_to_all_single(out, inp)
            torch.cuda.synchronize()
        gpu = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
        found[f"{coll} symmetric={sym} {mode.value}"] = {
            "kernels": sorted({g for g in gpu if "memcpy" not in g.lower() and "memset" not in g.lower()}),
            "memcpy": sum("memcpy" in g.lower() for g in gpu),
        }
    conccl.set_options(stream_mode=conccl.StreamMode.BATCH)
    return found


def test_profiler_shows_no_kernel():
    from conccl.launch import run_per_gpu

    results = run_per_gpu(_profile_collectives)
    world = len(results)
    for found in results:
        for what, seen in found.items():
            assert seen["kernels"] == [], (what, seen)
            # the copy engines did the moving: one copy per peer per call, or, batched, the
            # peer copies as one cudaMemcpyBatchAsync and the own shard
            assert seen["memcpy"] >= 3 * ((world - 1) if what.endswith("single") else 2), (what, seen)


def _async_ordering_soak(rank, world):
    import conccl

    report = {}
    # Async: the collective queues behind a long sleep on the caller's stream, so it cannot be
    # complete at once; wait() must not block the host; the output is right afterwards.
    n = 1 << 24
    inp = torch.full((n,), float(rank + 1), device="cuda")
    out = torch.zeros(n * world, device="cuda")
    torch.cuda._sleep(200_000_000)  # ~100 ms of GPU time
    work = conccl.all_gather_into_tensor(out, inp, async_op=True)
    report["completed_early"] = work.is_completed()
    t0 = time.perf_counter()
    work.wait()
    report["wait_host_ms"] = (time.perf_counter() - t0) * 1e3
    check = out.view(world, n)[:, ::4096].clone()  # consumer right after wait()
    torch.cuda.synchronize()
    report["completed_after_sync"] = work.is_completed()
    report["async_right"] = bool((check == torch.arange(1, world + 1, device="cuda")[:, None]).all())

    # Ordering: a producer writes the input right before the call, a consumer reads right after.
    wrong = torch.zeros((), dtype=torch.int64, device="cuda")
    for i in range(20):
        torch.cuda._sleep(5_000_000)
        inp.fill_(float(i * world + rank))  # producer kernel on the caller's stream
        conccl.all_gather_into_tensor(out, inp)
        expected = (i * world + torch.arange(world, device="cuda")).float().repeat_interleave(n)
        wrong += (out != expected).sum()  # consumer kernel on the caller's stream
    report["ordering_wrong"] = int(wrong)

    # 1,000 back-to-back calls of both kinds, each checked on the GPU, no host sync between.
    m = 1 << 14
    a = torch.empty(m, dtype=torch.int32, device="cuda")
    b = torch.empty(m * world, dtype=torch.int32, device="cuda")
    c = torch.empty(m * world, dtype=torch.int32, device="cuda")
    d = torch.empty(m * world, dtype=torch.int32, device="cuda")
    ranks = torch.arange(world, device="cuda", dtype=torch.int32)
    wrong.zero_()
    for i in range(1000):
        if i % 2 == 0:
            a.fill_(i * 100 + rank)
            conccl.all_gather_into_tensor(b, a)
            wrong += (b != (i * 100 + ranks).repeat_interleave(m)).sum()
        else:
            c.view(world, m).copy_((i * 10000 + rank * 100 + ranks)[:, None].expand(world, m))
            conccl.all_to_all_single(d, c)
            wrong += (d != (i * 10000 + ranks * 100 + rank).repeat_interleave(m)).sum()
    torch.cuda.synchronize()
    report["soak_wrong"] = int(wrong)

    # Calls that hop between streams: blocking ones run on the caller's stream itself, async
    # ones on the group's; the group must still run them in order (signal words only grow).
    side = torch.cuda.Stream()
    bufs = [(torch.empty(m, dtype=torch.int32, device="cuda"), torch.empty(m * world, dtype=torch.int32, device="cuda"))
            for _ in range(3)]
    wrongs = [torch.zeros((), dtype=torch.int64, device="cuda") for _ in range(2)]
    for i in range(300):
        how = i % 3
        src, dst = bufs[how]
        with torch.cuda.stream(side if how == 1 else torch.cuda.default_stream()):
            src.fill_(i * 100 + rank)
            work = conccl.all_gather_into_tensor(dst, src, async_op=how == 2)
            if how == 2:
                work.wait()
            wrongs[how == 1] += (dst != (i * 100 + ranks).repeat_interleave(m)).sum()
    torch.cuda.synchronize()
    report["streams_wrong"] = int(sum(wrongs))
    return report


def test_async_ordering_and_1000_calls():
    from conccl.launch import run_per_gpu

    for r in run_per_gpu(_async_ordering_soak):
        assert r["completed_early"] is False, r
        assert r["wait_host_ms"] < 20, r
        assert r["completed_after_sync"] and r["async_right"], r
        assert r["ordering_wrong"] == 0 and r["soak_wrong"] == 0 and r["streams_wrong"] == 0, r


def _bad_input_leaves_output(rank, world):
    import conccl

    out = torch.full((8 * world,), 5.0, device="cuda")
    errors = []
    for bad in (torch.empty(16, device="cuda")[::2], torch.empty(8, device="cuda", dtype=torch.float16),
                torch.empty(8), torch.empty(9, device="cuda")):
        try:
            conccl.all_gather_into_tensor(out, bad)
        except conccl.InvalidArgument as e:
            errors.append(str(e))
    torch.cuda.synchronize()
    return len(errors), bool((out == 5.0).all())


def test_bad_input_raises_and_output_untouched():
    from conccl.launch import run_per_gpu

    for n_errors, untouched in run_per_gpu(_bad_input_leaves_output):
        assert n_errors == 4 and untouched
