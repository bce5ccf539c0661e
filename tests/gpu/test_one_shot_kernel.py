"""GPU tier: the one-shot kernel (conccl.kernels.one_shot) on one GPU, its peers played by
the host: every rank's pad and staging buffer live on this GPU, rank 0's part is the kernel's,
and the others' is done before the launch (their staged data written, their READY and DONE
words in rank 0's pad set), so the kernel runs to its end alone. Checked: the gather's output
(own piece from the input, the peers' from their staging buffers; aligned, odd sizes, byte and
word paths, 2, 3 and 8 ranks), the sum for fp32/bf16/fp16 bit for bit against torch's fp32 sum
rounded once and against the reduction kernel on the same operands, the words it writes in the
peers' pads (eager: READY seq, DONE seq, FREE seq; graph: FREE and READY 1, its own words
reset to 0), a captured launch replayed, the time bound and the abort word, and one kernel per
launch in the profiler.

The cases run once, in one process on one GPU (conccl.launch.run_per_gpu with nprocs=1;
marked ``gpus(1)``: a machine of one GPU runs them, conftest.py); every wait is bounded (20 s),
so a wrong word fails its case instead of hanging the run.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpus(1)

BOUND_NS = 20 * 10**9
WORDS = 64  # per pad: signal words kind * world + src (at most 4 * 8 + 7), then the spin words
ABORT, TIMED_OUT = 62, 63  # in rank 0's pad
READY, DONE, FREE = 0, 1, 4  # conccl.schedule.base.Signal
DTYPES = {"float32": (torch.float32, 0), "bfloat16": (torch.bfloat16, 1), "float16": (torch.float16, 2)}


def _cases(rank, world):
    import time

    from torch.profiler import ProfilerActivity, profile

    from conccl.device.driver import check, driver
    from conccl.kernels.one_shot import OneShotLaunch, make_args
    from conccl.kernels.reduce import ReduceLaunch

    cu = driver()
    dev = torch.cuda.current_device()
    high = torch.cuda.Stream(priority=-1)  # as the caller must: module doc
    s = cu.CUstream(high.cuda_stream)
    gen = torch.Generator().manual_seed(1234)

    def rand_bytes(n):
        return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).cuda()

    def as_bytes(t):
        return t.contiguous().view(-1).view(torch.uint8)

    class Sim:
        """W ranks' pads and staging buffers on this GPU; rank 0 is the kernel's."""

        def __init__(self, W, stage_cap):
            self.W = W
            self.pads = [torch.zeros(WORDS, dtype=torch.int32, device="cuda") for _ in range(W)]
            self.stage = [torch.zeros(max(stage_cap, 16), dtype=torch.uint8, device="cuda") for _ in range(W)]

        def addr(self, owner, kind, src):
            return self.pads[owner].data_ptr() + 4 * (kind * self.W + src)

        def word(self, owner, kind, src):
            return int(self.pads[owner][kind * self.W + src].item()) & 0xFFFFFFFF

        def set(self, owner, kind, src, value):
            self.pads[owner][kind * self.W + src] = value - (1 << 32) if value >= 1 << 31 else value

        def args(self, kind, dtype, graph, src_off, dst_off, nbytes, inp, out, stage_bytes, scale=1.0,
                 timeout_ns=BOUND_NS):
            W, peers = self.W, range(self.W)

            def words(on_peer, k):
                return [0 if p == 0 else (self.addr(p, k, 0) if on_peer else self.addr(0, k, p)) for p in peers]

            return make_args(world=W, rank=0, kind=kind, dtype=dtype, graph=graph,
                             staged=[b.data_ptr() for b in self.stage], signal_to=words(True, READY),
                             done_to=words(True, FREE if graph else DONE), free_to=words(True, FREE),
                             wait_signal=words(False, READY), wait_done=words(False, DONE),
                             wait_free=words(False, FREE), src_off=src_off, dst_off=dst_off, nbytes=nbytes,
                             input=inp, output=out, stage_bytes=stage_bytes, scale=scale,
                             abort_word=self.pads[0].data_ptr() + 4 * ABORT,
                             timed_out_word=self.pads[0].data_ptr() + 4 * TIMED_OUT, timeout_ns=timeout_ns)

        def prime(self, graph, seq):
            """The peers' part before the kernel: READY(seq) and DONE(seq - 1) in rank 0's pad
            (a graph: READY and FREE 1)."""
            for p in range(1, self.W):
                self.set(0, READY, p, 1 if graph else seq)
                if graph:
                    self.set(0, FREE, p, 1)
                else:
                    self.set(0, DONE, p, (seq - 1) & 0xFFFFFFFF)

        def words_after(self, graph, seq):
            """What the kernel must have left: [(what, got, expected)] for every word it touches."""
            out = []
            for p in range(1, self.W):
                out.append((f"READY on {p}", self.word(p, READY, 0), 1 if graph else seq & 0xFFFFFFFF))
                if graph:
                    out += [(f"FREE on {p}", self.word(p, FREE, 0), 1), (f"DONE on {p}", self.word(p, DONE, 0), 0),
                            (f"own READY from {p}", self.word(0, READY, p), 0),
                            (f"own FREE from {p}", self.word(0, FREE, p), 0)]
                else:
                    out += [(f"DONE on {p}", self.word(p, DONE, 0), seq & 0xFFFFFFFF),
                            (f"FREE on {p}", self.word(p, FREE, 0), seq & 0xFFFFFFFF)]
            out.append(("timed out", int(self.pads[0][TIMED_OUT]), 0))
            return [w for w in out if w[1] != w[2]]

    def launch_once(launch, seq):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        check(launch.launch(cu, s, seq))
        high.synchronize()
        return time.perf_counter() - t0

    out = {}

    # --- gathers ---------------------------------------------------------------------------
    def gather(name, W, in_bytes, pieces, out_bytes, seq=7, graph=False, in_place_at=None):
        """pieces[p] = (src_off, dst_off, nbytes); rank p's staged input is random data; rank 0
        stages all of its input."""
        sim = Sim(W, in_bytes)
        output = rand_bytes(out_bytes)  # garbage where nothing is written: it must stay
        inp = output[in_place_at:in_place_at + in_bytes] if in_place_at is not None else rand_bytes(in_bytes)
        for p in range(1, W):
            sim.stage[p].copy_(rand_bytes(sim.stage[p].numel()))
        expected = output.clone()
        for p, (src, dst, n) in pieces.items():
            if n:
                expected[dst:dst + n] = (inp if p == 0 else sim.stage[p])[src:src + n]
        full = [pieces.get(p, (0, 0, 0)) for p in range(W)]
        staged_before = inp.clone()
        args = sim.args(0, 0, graph, [f[0] for f in full], [f[1] for f in full], [f[2] for f in full],
                        inp.data_ptr(), output.data_ptr(), in_bytes)
        sim.prime(graph, seq)
        torch.cuda.synchronize()
        elapsed = launch_once(OneShotLaunch(dev, args), seq)
        torch.cuda.synchronize()
        bad = (output != expected).nonzero().flatten()
        out[name] = {"mismatches": int(bad.numel()), "first": bad[:8].tolist(),
                     "staged": bool(torch.equal(sim.stage[0][:in_bytes], staged_before)),
                     "words": sim.words_after(graph, seq), "s": elapsed}

    n = 65536
    gather("all_gather_64k", 2, n, {0: (0, 0, n), 1: (0, n, n)}, 2 * n)
    gather("all_gather_odd", 2, 1001, {0: (0, 0, 1001), 1: (0, 1001, 1001)}, 2002)  # tails, byte path for p=1
    gather("all_gather_in_place", 2, 4096, {0: (0, 0, 0), 1: (0, 4096, 4096)}, 8192, in_place_at=0)
    # all-to-all-like pieces, misaligned: own piece at 5 -> 0 (byte path), rank 1's at 7 -> 1003 (bytes),
    # rank 2's at 4 -> 2004 (4-byte words), 3 ranks: the CTA split into two groups
    gather("all_to_all_misaligned", 3, 3000, {0: (5, 0, 1000), 1: (7, 1003, 999), 2: (4, 2004, 996)}, 3000)
    gather("all_gather_8_ranks", 8, 4112, {p: (0, 4112 * p, 4112) for p in range(8)}, 8 * 4112)
    gather("seq_wraps", 2, 256, {0: (0, 0, 256), 1: (0, 256, 256)}, 512, seq=0)  # DONE(seq - 1) = 0xFFFFFFFF
    gather("graph_gather", 2, n, {0: (0, 0, n), 1: (0, n, n)}, 2 * n, seq=1, graph=True)

    # --- sums ------------------------------------------------------------------------------
    def reduce(name, W, dtype, numel, scale=1.0, src_elems=0, dst_elems=0, graph=False, seq=9):
        tdtype, code = DTYPES[dtype]
        es = torch.empty((), dtype=tdtype).element_size()
        total = numel + src_elems
        xs = [(torch.randn(total, generator=gen) * 4).to(tdtype).cuda() for _ in range(W)]
        sim = Sim(W, total * es)
        for p in range(1, W):
            sim.stage[p][:total * es].copy_(as_bytes(xs[p]))
        output = torch.full((numel + dst_elems,), 7.0, dtype=tdtype, device="cuda")
        args = sim.args(1, code, graph, [src_elems * es] + [0] * (W - 1), [dst_elems * es] + [0] * (W - 1),
                        [numel * es] + [0] * (W - 1), xs[0].data_ptr(), output.data_ptr(), total * es, scale)
        sim.prime(graph, seq)
        torch.cuda.synchronize()
        elapsed = launch_once(OneShotLaunch(dev, args), seq)
        got = output[dst_elems:].clone()
        # torch's fp32 sum in rank order, rounded once (on the CPU: IEEE, no fused multiply-add)
        s32 = torch.tensor(scale, dtype=torch.float32)
        ops = [x[src_elems:].cpu().float() for x in xs]
        acc = ops[0] * s32
        for x in ops[1:]:
            acc = acc + x * s32
        want = acc.to(tdtype)
        # the reduction kernel on the same operands: rank 0's input, the others' staged copies
        ref = torch.zeros(numel, dtype=tdtype, device="cuda")
        srcs = tuple(xs[0].data_ptr() + src_elems * es if q == 0 else sim.stage[q].data_ptr() + src_elems * es
                     for q in range(W))
        check(ReduceLaunch(dev, ref.data_ptr(), srcs, numel * es, dtype, scale).launch(cu, s))
        high.synchronize()
        bits = {2: torch.int16, 4: torch.int32}[es]
        g, w, r = got.cpu().view(bits), want.view(bits), ref.cpu().view(bits)
        out[name] = {"vs_torch": int((g != w).sum()), "vs_reduce_kernel": int((g != r).sum()),
                     "first": (g != w).nonzero().flatten()[:8].tolist(),
                     "untouched": bool((output[:dst_elems] == 7.0).all()), "words": sim.words_after(graph, seq),
                     "staged": bool(torch.equal(sim.stage[0][:total * es], as_bytes(xs[0]))), "s": elapsed}

    for dtype in DTYPES:
        reduce(f"all_reduce_{dtype}", 2, dtype, 4099)  # 16-byte vectors, then a tail
        reduce(f"scaled_{dtype}", 2, dtype, 1000, scale=0.1)
        reduce(f"unaligned_{dtype}", 2, dtype, 777, src_elems=1, dst_elems=3)  # element by element
        reduce(f"offset_{dtype}", 2, dtype, 2048, src_elems=64 // (4 if dtype == "float32" else 2))  # a later piece
    reduce("four_ranks_bfloat16", 4, "bfloat16", 5000, scale=0.25)
    reduce("eight_ranks_bfloat16", 8, "bfloat16", 5003, scale=0.125)
    reduce("eight_ranks_float32", 8, "float32", 3001)
    reduce("three_ranks_float16", 3, "float16", 4096, scale=1 / 3)
    reduce("graph_reduce_bfloat16", 2, "bfloat16", 4099, graph=True, seq=1)

    # --- a captured launch, replayed twice (graph convention: the host re-primes the words) --
    sim = Sim(2, 8192)
    inp, output = rand_bytes(8192), torch.zeros(16384, dtype=torch.uint8, device="cuda")
    launch = OneShotLaunch(dev, sim.args(0, 0, True, [0, 0], [0, 8192], [8192, 8192], inp.data_ptr(),
                                         output.data_ptr(), 8192))
    sim.prime(True, 1)
    torch.cuda.synchronize()
    check(launch.launch(cu, s, 1))  # the first launch outside the capture: NVRTC, module load
    high.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=high):
        check(launch.launch(cu, s, 1))
    replays = []
    for _ in range(2):  # new data each time: the replay reads it anew
        sim.stage[1].copy_(rand_bytes(sim.stage[1].numel()))
        inp.copy_(rand_bytes(8192))
        sim.pads[1].zero_()  # rank 1's part: it saw (and reset) what the last launch wrote there
        sim.prime(True, 1)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        replays.append({"own": bool(torch.equal(output[:8192], inp)),
                        "peer": bool(torch.equal(output[8192:], sim.stage[1][:8192])),
                        "staged": bool(torch.equal(sim.stage[0][:8192], inp)), "words": sim.words_after(True, 1)})
    out["captured"] = replays

    # --- the time bound and the abort word ----------------------------------------------------
    sim = Sim(2, 256)
    inp, output = rand_bytes(256), torch.zeros(512, dtype=torch.uint8, device="cuda")
    pieces = ([0, 0], [0, 256], [256, 256])
    bounded = OneShotLaunch(dev, sim.args(0, 0, False, *pieces, inp.data_ptr(), output.data_ptr(), 256,
                                          timeout_ns=1_000_000))
    torch.cuda.synchronize()
    elapsed = launch_once(bounded, 3)  # nothing primed: READY never comes
    out["bounded"] = {"s": elapsed, "timed_out": int(sim.pads[0][TIMED_OUT]), "ready_sent": sim.word(1, READY, 0)}
    sim.pads[0].zero_()
    sim.pads[0][ABORT] = 1
    aborted = OneShotLaunch(dev, sim.args(0, 0, False, *pieces, inp.data_ptr(), output.data_ptr(), 256))
    torch.cuda.synchronize()
    elapsed = launch_once(aborted, 4)
    out["aborted"] = {"s": elapsed, "timed_out": int(sim.pads[0][TIMED_OUT]), "ready_sent": sim.word(1, READY, 0)}

    # --- one kernel per launch, and what a launch costs with every word already there ---------
    sim = Sim(2, 4096)
    inp, output = rand_bytes(4096), torch.zeros(8192, dtype=torch.uint8, device="cuda")
    launch = OneShotLaunch(dev, sim.args(0, 0, False, [0, 0], [0, 4096], [4096, 4096], inp.data_ptr(),
                                         output.data_ptr(), 4096))
    sim.prime(False, 5)
    launch_once(launch, 5)  # warm-up, outside the profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        check(launch.launch(cu, s, 5))
        high.synchronize()
    out["kernels"] = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(high)
    for _ in range(200):
        check(launch.launch(cu, s, 5))
    end.record(high)
    end.synchronize()
    out["us_per_launch"] = start.elapsed_time(end) * 1000 / 200  # information: printed by the test
    return out


@pytest.fixture(scope="module")
def results():
    from conccl.launch import run_per_gpu

    return run_per_gpu(_cases, nprocs=1, timeout_s=600)[0]


GATHERS = ["all_gather_64k", "all_gather_odd", "all_gather_in_place", "all_to_all_misaligned", "all_gather_8_ranks",
           "seq_wraps", "graph_gather"]


@pytest.mark.parametrize("name", GATHERS)
def test_a_gather_copies_the_own_piece_and_every_peers_and_signals(results, name):
    r = results[name]
    assert r["mismatches"] == 0, r
    assert r["staged"] and r["words"] == [] and r["s"] < 5.0, r


SUMS = [f"{case}_{dtype}" for case in ("all_reduce", "scaled", "unaligned", "offset") for dtype in DTYPES] + [
    "four_ranks_bfloat16", "eight_ranks_bfloat16", "eight_ranks_float32", "three_ranks_float16",
    "graph_reduce_bfloat16"]


@pytest.mark.parametrize("name", SUMS)
def test_a_sum_is_torchs_fp32_sum_rounded_once_and_the_reduction_kernels_bits(results, name):
    r = results[name]
    assert r["vs_torch"] == 0 and r["vs_reduce_kernel"] == 0, r
    assert r["untouched"] and r["staged"] and r["words"] == [] and r["s"] < 5.0, r


def test_a_captured_launch_replays_with_the_graph_convention(results):
    for replay in results["captured"]:
        assert replay["own"] and replay["peer"] and replay["staged"] and replay["words"] == [], results["captured"]


def test_the_time_bound_ends_the_waits_and_says_so(results):
    r = results["bounded"]
    assert r["timed_out"] == 1 and r["s"] < 2.0 and r["ready_sent"] == 3, r


def test_the_abort_word_ends_the_waits(results):
    r = results["aborted"]
    assert r["timed_out"] == 0 and r["s"] < 2.0 and r["ready_sent"] == 4, r


def test_the_profiler_shows_one_kernel_per_launch(results):
    print(f"one-shot launch, 2 ranks x 4 KiB gather, words already there: {results['us_per_launch']:.2f} us")
    assert results["kernels"] == ["conccl_one_shot"], results["kernels"]
