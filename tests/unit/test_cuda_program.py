"""No-device tier: lowering a schedule to driver calls keeps every operation, in order."""
from __future__ import annotations

import pytest

from conccl.collectives.all_gather import plan_all_gather
from conccl.collectives.all_to_all import equal_split_matrix, plan_all_to_all
from conccl.executors.cuda import lowering as cuda_lowering
from conccl.executors.cuda import program as cuda_program
from conccl.executors.cuda.lowering import CopyBatch, CopyStep, ReduceStep, SignalBatch, SignalStep, lower
from conccl.schedule.base import Algorithm, Buf, Copy, Phase, SetSignal, StreamMode, WaitSignal, signal_word

# Fake address space: rank r's buffer b at BASE[b] + r * STRIDE; pads at PAD + r * STRIDE.
STRIDE, PAD = 1 << 40, 7 << 36
BASE = {Buf.INPUT: 1 << 36, Buf.OUTPUT: 3 << 36, Buf.WORKSPACE: 5 << 36}


def _address(rank, buf):
    return BASE[buf] + rank * STRIDE


def _pads(world):
    return [PAD + r * STRIDE for r in range(world)]


def _expected(schedule, slot_ops, batch):
    """What the driver must be asked for, op by op, in schedule order."""
    world, rank, pads = schedule.world, schedule.rank, _pads(schedule.world)
    out = []
    for op in slot_ops:
        if isinstance(op, Copy):
            t = op.transfer
            small_local = t.phase is Phase.LOCAL and t.nbytes <= cuda_lowering.HOIST_LOCAL_MAX_BYTES
            kind = "batched" if batch and (t.src_rank != t.dst_rank or (small_local and out and out[-1][0] == "batched")) \
                else "copy"
            out.append((kind, _address(t.dst_rank, t.dst) + t.dst_offset, _address(t.src_rank, t.src) + t.src_offset,
                        t.nbytes))
        elif isinstance(op, WaitSignal):
            out.append(("wait", pads[rank] + 4 * signal_word(op.kind, op.peer, world), op.seq_delta))
        else:
            assert isinstance(op, SetSignal)
            out.append(("write", pads[op.peer] + 4 * signal_word(op.kind, rank, world), op.seq_delta))
    return out


def _flatten(steps):
    out = []
    for step in steps:
        if isinstance(step, SignalBatch):
            out += [("wait" if w else "write", addr, d) for w, addr, d in step.signals]
        elif isinstance(step, SignalStep):
            out.append(("wait" if step.is_wait else "write", step.address, step.seq_delta))
        elif isinstance(step, CopyStep):
            out.append(("copy", *step))
        else:
            assert isinstance(step, CopyBatch)
            out += [("batched", *c) for c in step.copies]
    return out


def _kinds(steps) -> list:
    return [type(step) for step in steps]


def _plans(world):
    for rank in range(world):
        for mode in StreamMode:
            yield plan_all_gather(world, rank, 1000, algorithm=Algorithm.PULL, stream_mode=mode)
            yield plan_all_gather(world, rank, 1000, algorithm=Algorithm.PUSH, stream_mode=mode,
                                  input_symmetric=True, output_symmetric=True)
            yield plan_all_to_all(world, rank, equal_split_matrix(world, 96), algorithm=Algorithm.PULL, stream_mode=mode)
            yield plan_all_to_all(world, rank, equal_split_matrix(world, 96), algorithm=Algorithm.PUSH,
                                  stream_mode=mode, output_symmetric=True)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("batching", cuda_program.BATCHING_MODES)
def test_lowering_keeps_every_op_in_order(world, batching):
    for schedule in _plans(world):
        lowered = lower(schedule, _address, _pads(world), batching)
        assert len(lowered) == schedule.num_slots
        batch = schedule.stream_mode is StreamMode.BATCH
        for ops, steps in zip(schedule.slots, lowered):
            # BATCH: the lowering may move a small own-shard copy up (checked on its own below)
            assert _flatten(steps) == _expected(schedule, cuda_lowering.hoist_small_local(ops) if batch else ops, batch)
            # No two signal batches (or two copy batches) in a row: each run is one driver call.
            kinds = _kinds(steps)
            assert all(not (a == b and a in (SignalBatch, CopyBatch)) for a, b in zip(kinds, kinds[1:]))
            batched = [s.is_wait for step in steps if isinstance(step, SignalBatch) for s in step.signals]
            # only what the driver was found to take goes into a batch
            assert {"all": True, "waits": all(batched), "none": not batched}[batching]
            if batching == "all":
                assert SignalStep not in kinds


def test_push_all_gather_is_eight_driver_calls_on_four_ranks():
    s = plan_all_gather(4, 1, 1 << 18, algorithm=Algorithm.PUSH, stream_mode=StreamMode.SINGLE,
                        input_symmetric=True, output_symmetric=True)
    (steps,) = lower(s, _address, _pads(4))
    # READY to peers + wait READY + the release (wait DONE(s-1), FREE to peers) | 3 peer copies
    # | DONE to peers | own shard | wait DONE
    assert _kinds(steps) == [SignalBatch, CopyStep, CopyStep, CopyStep, SignalBatch, CopyStep, SignalBatch]
    assert [len(step.signals) for step in steps if isinstance(step, SignalBatch)] == [12, 3, 3]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_hoisting_moves_only_small_own_shard_copies_over_signal_writes(world):
    for schedule in _plans(world):
        for ops in schedule.slots:
            hoisted = cuda_lowering.hoist_small_local(ops)
            assert sorted(map(id, hoisted)) == sorted(map(id, ops))  # a permutation
            moved = [op for op in ops if cuda_lowering._is_small_local(op)]
            rest = [op for op in ops if op not in moved]
            assert [op for op in hoisted if op not in moved] == rest  # everything else in order
            for op in moved:
                i, j = ops.index(op), hoisted.index(op)
                assert j <= i
                # stepped over signal writes only, and now right behind a peer copy
                assert all(isinstance(x, SetSignal) for x in ops[j:i])
                if j < i:
                    prev = hoisted[j - 1].transfer
                    assert prev.src_rank != prev.dst_rank


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("row", [64, 3 << 20])  # bytes of each part's row: small, then past the hoisting limit
def test_a_reduce_scatter_from_parts_is_one_batch_of_copies_per_run(world, row):
    """One copy per parameter and peer, and one per parameter for the own row: in BATCH they go
    to the driver as batches (the small own copies join the peer batch; large ones form their
    own batch after this rank's DONE), never one call per parameter, and the own row's copies
    only after the DONE(-1) waits."""
    from conccl.collectives.reduce_scatter import from_parts, plan_reduce_scatter

    parts = tuple((i * row, row, 5 * i * world * row, world * row) for i in range(3))
    for rank in range(world):
        s = from_parts(plan_reduce_scatter(world, rank, 3 * row, "bfloat16", stream_mode=StreamMode.BATCH),
                       3 * row, parts)
        (steps,) = lower(s, _address, _pads(world))
        kinds = _kinds(steps)
        assert CopyStep not in kinds, kinds
        n = [len(step.copies) for step in steps if isinstance(step, CopyBatch)]
        if row <= cuda_lowering.HOIST_LOCAL_MAX_BYTES:
            assert kinds == [SignalBatch, CopyBatch, SignalBatch, ReduceStep] and n == [3 * world], kinds
        else:
            assert kinds == [SignalBatch, CopyBatch, SignalBatch, CopyBatch, SignalBatch, ReduceStep], kinds
            assert n == [3 * (world - 1), 3]
        first = steps[0].signals  # the release's DONE(-1) waits and the pushes' FREE(-1) waits come before every copy
        assert sum(1 for w, _, d in first if w and d == -1) == 2 * (world - 1)


def test_push_all_gather_of_1mib_is_three_driver_calls_on_four_ranks():
    s = plan_all_gather(4, 1, 1 << 18, algorithm=Algorithm.PUSH, stream_mode=StreamMode.BATCH,
                        input_symmetric=True, output_symmetric=True)
    (steps,) = lower(s, _address, _pads(4))
    # READY to peers + wait READY + the release | 3 peer copies and the own shard | DONE to
    # peers + wait DONE
    assert _kinds(steps) == [SignalBatch, CopyBatch, SignalBatch]
    assert [len(steps[0].signals), len(steps[1].copies), len(steps[2].signals)] == [12, 4, 6]
    # a larger own shard keeps its place after the DONE writes, off the critical path
    big = plan_all_gather(4, 1, 2 * cuda_lowering.HOIST_LOCAL_MAX_BYTES, algorithm=Algorithm.PUSH,
                          stream_mode=StreamMode.BATCH, input_symmetric=True, output_symmetric=True)
    (steps,) = lower(big, _address, _pads(4))
    assert _kinds(steps) == [SignalBatch, CopyBatch, SignalBatch, CopyStep, SignalBatch]


def test_long_signal_runs_are_split_below_the_driver_limit(monkeypatch):
    monkeypatch.setattr(cuda_lowering, "MAX_SIGNALS_PER_BATCH", 4)
    s = plan_all_gather(8, 0, 64, algorithm=Algorithm.PUSH, stream_mode=StreamMode.SINGLE,
                        input_symmetric=True, output_symmetric=True)
    (steps,) = lower(s, _address, _pads(8))
    assert max(len(step.signals) for step in steps if isinstance(step, SignalBatch)) == 4
    assert _flatten(steps) == _expected(s, s.slots[0], False)


class _RecordingDriver:
    """What CompiledProgram asks of cuda-python, recording each call as plain values (the
    signal values as they are when the call is made: the program writes them in place)."""

    class CUstreamBatchMemOpType:  # noqa: N801 - cuda-python's names
        CU_STREAM_MEM_OP_WAIT_VALUE_32, CU_STREAM_MEM_OP_WRITE_VALUE_32 = "wait", "write"

    class CUstreamWaitValue_flags:  # noqa: N801
        CU_STREAM_WAIT_VALUE_GEQ = "geq"

    class CUstreamWriteValue_flags:  # noqa: N801
        CU_STREAM_WRITE_VALUE_DEFAULT = "fenced"

    class CUmemcpySrcAccessOrder:  # noqa: N801
        CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = "stream order"

    class CUstreamBatchMemOpParams:  # noqa: N801
        def __init__(self):
            import types

            self.operation, self.waitValue, self.writeValue = None, types.SimpleNamespace(), types.SimpleNamespace()

    class CUmemcpyAttributes:  # noqa: N801
        srcAccessOrder = None

    def __init__(self, fail_at: int | None = None):
        self.calls, self.fail_at = [], fail_at

    def _record(self, *call):
        self.calls.append(call)
        return (1 if len(self.calls) - 1 == self.fail_at else 0,)

    def CUdeviceptr(self, address):  # noqa: N802
        return ("ptr", address)

    def cuStreamBatchMemOp(self, stream, count, params, flags):  # noqa: N802
        subs = [p.waitValue if p.operation == "wait" else p.writeValue for p in params]
        assert count == len(params) and flags == 0
        return self._record("batch", stream, tuple((s.operation == "wait", s.address[1], s.value, s.flags) for s in subs))

    def cuStreamWaitValue32(self, stream, address, value, flags):  # noqa: N802
        return self._record("single", stream, ((True, address[1], value, flags),))

    def cuStreamWriteValue32(self, stream, address, value, flags):  # noqa: N802
        return self._record("single", stream, ((False, address[1], value, flags),))

    def cuMemcpyAsync(self, dst, src, nbytes, stream):  # noqa: N802
        return self._record("copy", stream, ((dst[1], src[1], nbytes),))

    def cuMemcpyBatchAsync(self, dsts, srcs, sizes, count, attrs, attr_index, num_attrs, stream):  # noqa: N802
        assert count == len(dsts) == len(srcs) == len(sizes) and attr_index == [0] and num_attrs == 1
        assert [a.srcAccessOrder for a in attrs] == ["stream order"]
        return self._record("copies", stream, tuple((d[1], s[1], n) for d, s, n in zip(dsts, srcs, sizes)))

    def cuLaunchKernel(self, function, *args):  # noqa: N802
        return self._record("kernel", args[7], function)


def _asked(step, seq: int):
    """The driver call a lowered step must become in call ``seq``."""
    def signal(s):
        return s.is_wait, s.address, (seq + s.seq_delta) & 0xFFFFFFFF, "geq" if s.is_wait else "fenced"

    if isinstance(step, SignalBatch):
        return "batch", tuple(signal(s) for s in step.signals)
    if isinstance(step, SignalStep):
        return "single", (signal(step),)
    if isinstance(step, CopyStep):
        return "copy", (tuple(step),)
    if isinstance(step, CopyBatch):
        return "copies", tuple(map(tuple, step.copies))
    assert isinstance(step, ReduceStep)
    return "kernel", step.dtype


@pytest.mark.parametrize("batching", cuda_program.BATCHING_MODES)
def test_a_compiled_program_makes_each_lowered_step_one_driver_call_with_the_sequence_number(monkeypatch, batching):
    from conccl.collectives.reduce_scatter import plan_reduce_scatter
    from conccl.kernels import reduce as cuda_reduce

    dtypes = {d: d for d in ("float32", "bfloat16", "float16")}  # a kernel "function" is its dtype here
    monkeypatch.setattr(cuda_reduce, "_functions", lambda device: (dtypes, dtypes, dtypes, dtypes))
    monkeypatch.setattr(cuda_reduce, "grid_bound", lambda device: 66)
    schedules = [*_plans(3), plan_reduce_scatter(3, 1, 4096, "bfloat16", 0.5, stream_mode=StreamMode.PER_PEER)]
    for schedule in schedules:
        lowered = lower(schedule, _address, _pads(3), batching)
        cu = _RecordingDriver()
        program = cuda_program.CompiledProgram(lowered, cu, 0)
        for seq in (5, 1 << 32):  # the second wraps: written as 0 (its -1 as 0xFFFFFFFF)
            for k, steps in enumerate(lowered):
                cu.calls.clear()
                program.launch_slot(k, f"stream {k}", seq)
                assert [(kind, stream, what) for kind, stream, what in cu.calls] == \
                    [(_asked(step, seq)[0], f"stream {k}", _asked(step, seq)[1]) for step in steps]


def test_a_failed_driver_call_is_named_with_its_slot_and_step(monkeypatch):
    def check(err):
        raise RuntimeError("CUDA driver error CUDA_ERROR_TEST")

    monkeypatch.setattr(cuda_program, "check", check)
    s = plan_all_gather(4, 1, 1 << 18, algorithm=Algorithm.PUSH, stream_mode=StreamMode.SINGLE,
                        input_symmetric=True, output_symmetric=True)
    lowered = lower(s, _address, _pads(4))
    for index, what in ((0, "cuStreamBatchMemOp of 12 ops"), (2, "cuMemcpyAsync of 262144 bytes")):
        cu = _RecordingDriver(fail_at=index)
        with pytest.raises(RuntimeError, match=rf"CUDA_ERROR_TEST in {what} \(slot 0, step {index} of 7\)"):
            cuda_program.CompiledProgram(lowered, cu, 0).launch_slot(0, "stream", 1)
        assert len(cu.calls) == index + 1  # nothing after the failed call


def test_symmetric_registry_generation_grows_with_every_allocation():
    """A communicator remembers a call's peer views until the generation changes: an
    allocation registered at an address seen before must change it."""
    import types

    torch = pytest.importorskip("torch")
    from conccl.device.symmetric import SymmetricRegistry

    reg = SymmetricRegistry()
    t = torch.empty(4)
    before = reg.generation
    reg.add(t, types.SimpleNamespace(buffer_ptrs=[1, 2]))
    reg.add(t, types.SimpleNamespace(buffer_ptrs=[3, 4]))  # the same address again
    assert reg.generation == before + 2


def test_a_reduce_scatter_lowers_to_copies_signals_and_one_reduction_last():
    from conccl.collectives.reduce_scatter import plan_reduce_scatter

    s = plan_reduce_scatter(4, 1, 4096, "bfloat16", 0.5, stream_mode=StreamMode.PER_PEER)
    bases = {Buf.INPUT: 1 << 20, Buf.OUTPUT: 2 << 20, Buf.WORKSPACE: 3 << 20}
    lowered = lower(s, lambda rank, buf: bases[buf] + rank * (1 << 30), [0x1000 * (r + 1) for r in range(4)])
    reduces = [(k, i, step) for k, steps in enumerate(lowered) for i, step in enumerate(steps)
               if isinstance(step, ReduceStep)]
    assert len(reduces) == 1
    k, i, (dst, srcs, nbytes, dtype, scale, out_dtype) = reduces[0]
    assert out_dtype is None  # the result in the operands' dtype
    assert (k, i) == (0, len(lowered[0]) - 1)  # slot 0, after every wait
    me = 1 << 30  # rank 1's own buffers
    assert dst == bases[Buf.OUTPUT] + me and nbytes == 4096 and dtype == "bfloat16" and scale == 0.5
    assert srcs == tuple(bases[Buf.INPUT] + me + 4096 if r == 1 else bases[Buf.WORKSPACE] + me + r * 4096
                         for r in range(4))


def test_a_widening_reduction_lowers_with_its_result_dtype_and_is_its_own_program_shape():
    """bf16 chunks summed into fp32: the step carries float32 (the widening kernel), and a
    compiled program of the plain sum is never re-addressed into it (their shapes differ)."""
    from conccl.collectives.reduce_scatter import plan_reduce_scatter

    bases = {Buf.INPUT: 1 << 20, Buf.OUTPUT: 2 << 20, Buf.WORKSPACE: 3 << 20}
    at = lambda rank, buf: bases[buf] + rank * (1 << 30)  # noqa: E731
    plain = lower(plan_reduce_scatter(2, 0, 4096, "bfloat16", 0.5), at, _pads(2))
    wide = lower(plan_reduce_scatter(2, 0, 4096, "bfloat16", 0.5, out_dtype="float32"), at, _pads(2))
    (step,) = [s for steps in wide for s in steps if isinstance(s, ReduceStep)]
    assert (step.dtype, step.out_dtype, step.nbytes) == ("bfloat16", "float32", 4096)
    assert cuda_lowering.shape(plain) != cuda_lowering.shape(wide)


def test_reduce_grid_bound_is_half_the_sms(monkeypatch):
    from conccl.kernels import reduce as cuda_reduce

    class FakeDriver:  # what grid_bound asks of the driver: the device's SM count
        class CUdevice_attribute:  # noqa: N801 - cuda-python's name
            CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = "sms"

        class CUresult:  # noqa: N801
            CUDA_SUCCESS = 0

        sms = {0: 132, 1: 1}

        def cuDeviceGet(self, index):  # noqa: N802
            return 0, index

        def cuDeviceGetAttribute(self, attr, dev):  # noqa: N802
            return 0, self.sms[dev]

    monkeypatch.setattr(cuda_reduce, "driver", FakeDriver)
    monkeypatch.setattr("conccl.device.driver.driver", FakeDriver)
    monkeypatch.setenv("CONCCL_REDUCE_CTAS", "48")  # no longer read: the grid is half the SMs, always
    cuda_reduce.grid_bound.cache_clear()
    try:
        assert cuda_reduce.grid_bound(0) == 66 and cuda_reduce.grid_bound(1) == 1  # half, at least one
    finally:
        cuda_reduce.grid_bound.cache_clear()


def test_each_reduction_kernel_launches_with_the_cta_size_of_its_launch_bounds(monkeypatch):
    """A launch larger than a kernel's __launch_bounds__ is refused by the driver: the kernel and
    its CTA size are chosen together, for every operand count and alignment (one operand, a
    group of one rank, takes the general kernel)."""
    import re

    from conccl.kernels import loader, reduce as cuda_reduce

    source = loader.source("reduce")
    bounds = {name: bound for bound, name in re.findall(r"__launch_bounds__\((\w+)\) (\w+)\(", source)}
    assert len(bounds) == 11  # three families x three dtypes, and the two widening kernels: every one bounded
    sizes = {"THREADS_PER_CTA": cuda_reduce.THREADS, "THREADS_MANY_PER_CTA": cuda_reduce.THREADS_MANY}
    assert cuda_reduce.DEFINES == sizes  # what the kernels are compiled with
    names = lambda family: {dtype: family.format(k) for dtype, k in (("float32", "f32"), ("bfloat16", "bf16"),  # noqa: E731
                                                                     ("float16", "f16"))}
    wide = {"bfloat16": "reduce_wide_bf16", "float16": "reduce_wide_f16"}
    monkeypatch.setattr(cuda_reduce, "_functions", lambda device: (names("reduce_{}"), names("reduce_vec_{}"),
                                                                   names("reduce_vec2_{}"), wide))
    monkeypatch.setattr(cuda_reduce, "grid_bound", lambda device: 66)
    seen = set()
    for nsrc in range(1, cuda_reduce.MAX_OPERANDS + 1):
        for shift in (0, 2):  # 2: every pointer off 16-byte alignment (the scalar kernels)
            for dtype in ("float32", "bfloat16", "float16"):
                srcs = tuple(4096 * (k + 1) + shift for k in range(nsrc))
                for out in (None, dtype, "float32"):  # float32 over a 16-bit dtype: the widening kernel
                    r = cuda_reduce.ReduceLaunch(0, 1 << 20, srcs, 1 << 20, dtype, 1.0, out)
                    assert r.threads == sizes[bounds[r.function]], (nsrc, shift, dtype, r.function, r.threads)
                    assert r.grid <= 66
                    assert (r.function in wide.values()) == (out == "float32" and dtype != "float32"), (dtype, out)
                    seen.add(r.function)
    assert seen == set(bounds)  # every kernel was chosen somewhere
    with pytest.raises(ValueError, match="float32"):  # narrowing is no reduction's
        cuda_reduce.ReduceLaunch(0, 1 << 20, (4096,), 1 << 20, "float32", 1.0, "bfloat16")


def _signals(steps):
    """Every signal step of ``steps`` as (wait?, address, delta), batches opened, in order."""
    out = []
    for step in steps:
        if isinstance(step, SignalBatch):
            out += list(step.signals)
        elif isinstance(step, SignalStep):
            out.append(step)
    return out


@pytest.mark.parametrize("captured", [False, True])
@pytest.mark.parametrize("mode", list(StreamMode))
def test_spin_waits_replace_exactly_the_waits_before_a_reduction(captured, mode):
    """A reduce-scatter and both all-reduces, eager and captured: with ``spin`` the waits right
    before each reduction (every one but the eager two-pass all-reduce's) become one spin-wait step on the same words with the same values,
    nothing else changes but the resets that follow it (captured), which move behind the
    reduction; without it the lowering has no spin step."""
    from conccl.collectives.all_reduce import plan_all_reduce
    from conccl.collectives.reduce_scatter import plan_reduce_scatter
    from conccl.executors.cuda.lowering import SpinWaitStep
    from conccl.schedule.captured import graph_schedule
    from conccl.schedule.base import Reduce, ResetSignal

    world, rank, spin_words = 4, 2, PAD + 12345 * 4
    plans = (plan_reduce_scatter(world, rank, 4096, "bfloat16", stream_mode=mode),
             plan_all_reduce(world, rank, 6000, 2, "bfloat16", stream_mode=mode),
             plan_all_reduce(world, rank, 6000, 2, "bfloat16", stream_mode=mode, algorithm=Algorithm.STAGED_PUSH))
    for eager in plans:
        s = graph_schedule(eager) if captured else eager
        plain = lower(s, _address, _pads(world), spin_words=spin_words)
        spun = lower(s, _address, _pads(world), spin_words=spin_words, spin=True)
        assert not any(isinstance(x, SpinWaitStep) for steps in plain for x in steps)
        if eager.collective == "reduce_scatter" or eager.algorithm is Algorithm.STAGED_PUSH or captured:
            assert sum(isinstance(x, SpinWaitStep) for steps in spun for x in steps) == 1
        for ops, before, after in zip(s.slots, plain, spun):
            # reductions right behind a wait (the two-pass all-reduce's eager one sends its release first)
            reduce_at = [i for i, op in enumerate(ops) if isinstance(op, Reduce) and i
                         and isinstance(ops[i - 1], (WaitSignal, ResetSignal))]
            spins = [x for x in after if isinstance(x, SpinWaitStep)]
            assert len(spins) == len(reduce_at)
            for i, step in zip(reduce_at, spins):
                run = []
                j = i - 1
                while j >= 0 and isinstance(ops[j], (WaitSignal, ResetSignal)):
                    run.insert(0, ops[j])
                    j -= 1
                waits = [op for op in run if isinstance(op, WaitSignal)]
                assert step.abort_word == spin_words and step.words == tuple(
                    (_pads(world)[rank] + 4 * signal_word(w.kind, w.peer, world), w.seq_delta) for w in waits)
                k = after.index(step)
                assert isinstance(after[k + 1], ReduceStep)  # the kernel right before the reduction
            # the same waits and writes but the spun ones, the resets behind the reduction
            spun_waits = {(a, d) for x in spins for a, d in x.words}
            kept = [x for x in _signals(before) if not (x.is_wait and (x.address, x.seq_delta) in spun_waits)]
            assert sorted(_signals(after)) == sorted(kept)
            assert [type(x) for x in after if not isinstance(x, (SignalBatch, SignalStep, SpinWaitStep))] == \
                [type(x) for x in before if not isinstance(x, (SignalBatch, SignalStep))]


def test_no_spin_without_a_reduction_after_the_waits_and_none_without_spin_words():
    from conccl.executors.cuda.lowering import SpinWaitStep

    for s in (plan_all_gather(2, 0, 4096), plan_all_to_all(3, 1, equal_split_matrix(3, 64))):
        assert not any(isinstance(x, SpinWaitStep) for steps in lower(s, _address, _pads(s.world), spin_words=PAD,
                                                                       spin=True) for x in steps)
    from conccl.collectives.reduce_scatter import plan_reduce_scatter
    with pytest.raises(TypeError, match="spin words"):
        lower(plan_reduce_scatter(2, 0, 4096, "bfloat16"), _address, _pads(2), spin=True)
