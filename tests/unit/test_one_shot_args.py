"""The one-shot kernel's module on the CPU (conccl.kernels.one_shot): the argument struct's
layout against one computed by hand and against the C struct in the source, make_args padding
and refusing what the kernel cannot run, OneShotLaunch refusing it before touching CUDA, the
parameters it hands the driver, and what the source must keep (the acquire loads, the time
bound, the abort check, the fences before the signals, both kinds, the reduction's arithmetic),
read through the loader (kernels/cuda/one_shot.cu and conccl.cuh)."""
from __future__ import annotations

import ctypes
import re

import pytest

from conccl.kernels import loader
from conccl.kernels import one_shot as kernel
from conccl.kernels.one_shot import MAX_WORLD, OneShotArgs, OneShotLaunch, make_args

# (field, offset, size) by hand: ten arrays of 8 eight-byte entries (64 bytes each), six 8-byte
# scalars from 640, then eight 4-byte ones in pairs from 688: 720 bytes, no padding anywhere.
LAYOUT = [("staged", 0, 64), ("signal_to", 64, 64), ("done_to", 128, 64), ("free_to", 192, 64),
          ("wait_signal", 256, 64), ("wait_done", 320, 64), ("wait_free", 384, 64), ("src_off", 448, 64),
          ("dst_off", 512, 64), ("nbytes", 576, 64), ("input", 640, 8), ("output", 648, 8),
          ("abort_word", 656, 8), ("timed_out_word", 664, 8), ("timeout_ns", 672, 8), ("stage_bytes", 680, 8),
          ("world", 688, 4), ("rank", 692, 4), ("kind", 696, 4), ("dtype", 700, 4), ("graph", 704, 4),
          ("pad0", 708, 4), ("seq", 712, 4), ("scale", 716, 4)]


def test_the_struct_layout_is_the_hand_computed_one():
    assert ctypes.sizeof(OneShotArgs) == 720 and ctypes.alignment(OneShotArgs) == 8
    assert [name for name, *_ in OneShotArgs._fields_] == [name for name, *_ in LAYOUT]
    for name, offset, size in LAYOUT:
        field = getattr(OneShotArgs, name)
        assert (field.offset, field.size) == (offset, size), name
    signed = {"src_off", "dst_off", "nbytes", "stage_bytes"}
    for name, ctype in OneShotArgs._fields_:
        base = ctype._type_ if issubclass(ctype, ctypes.Array) else ctype
        if name in signed:
            assert base is ctypes.c_int64, name
        elif name == "scale":
            assert base is ctypes.c_float
        elif name == "seq":
            assert base is ctypes.c_uint
        elif name in ("world", "rank", "kind", "dtype", "graph", "pad0"):
            assert base is ctypes.c_int, name
        else:
            assert base is ctypes.c_uint64, name


def _c_struct():
    """(name, element bytes, count) of every field of the source's struct OneShotArgs, in order."""
    body = re.search(r"struct OneShotArgs \{(.*?)\n\};", loader.source("one_shot"), re.S).group(1)
    sizes = {"u64": 8, "i64": 8, "int": 4, "u32": 4, "float": 4}
    fields = []
    for decl in re.sub(r"//[^\n]*", "", body).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        ctype, names = decl.split(None, 1)
        for name in (n.strip() for n in names.split(",")):
            m = re.fullmatch(r"(\w+)(?:\[MAXW\])?", name)
            fields.append((m.group(1), sizes[ctype], MAX_WORLD if name.endswith("[MAXW]") else 1))
    return fields


def test_the_c_struct_declares_the_same_fields_in_the_same_order():
    assert "#define MAXW 8" in loader.source("one_shot") and MAX_WORLD == 8
    expected = [(name, 8 if size == 64 else size, MAX_WORLD if size == 64 else 1) for name, _, size in LAYOUT]
    assert _c_struct() == expected


PADS = [0x7000_0000 + 0x1000 * r for r in range(8)]  # a fake address space


def _args(world=3, rank=1, kind=0, dtype=0, graph=False, **over):
    """make_args for a gather of 100 bytes per rank, rank r's pad at PADS[r]."""
    words = lambda base: [0 if p == rank else base + 4 * p for p in range(world)]  # noqa: E731
    kw = dict(world=world, rank=rank, kind=kind, dtype=dtype, graph=graph,
              staged=[0x1_0000_0000 * (p + 1) for p in range(world)], signal_to=words(0x10), done_to=words(0x20),
              free_to=words(0x30), wait_signal=words(0x40), wait_done=words(0x50), wait_free=words(0x60),
              src_off=[0] * world, dst_off=[100 * p for p in range(world)], nbytes=[100] * world,
              input=0xA000_0000, output=0xB000_0000, stage_bytes=100, scale=1.0, abort_word=0xC000_0000,
              timed_out_word=0xC000_0004, timeout_ns=10**9)
    kw.update(over)
    return make_args(**kw)


def test_make_args_fills_the_struct_and_pads_every_array_with_zeros():
    a = _args(world=3, rank=1, graph=True, scale=0.25, kind="gather", dtype="bfloat16")
    assert list(a.staged) == [0x1_0000_0000, 0x2_0000_0000, 0x3_0000_0000] + [0] * 5
    assert list(a.signal_to) == [0x10, 0, 0x18] + [0] * 5
    assert list(a.wait_free) == [0x60, 0, 0x68] + [0] * 5
    assert list(a.dst_off) == [0, 100, 200] + [0] * 5 and list(a.nbytes) == [100] * 3 + [0] * 5
    assert (a.world, a.rank, a.kind, a.dtype, a.graph, a.seq, a.scale) == (3, 1, 0, 1, 1, 0, 0.25)
    assert (a.input, a.output, a.stage_bytes, a.timeout_ns) == (0xA000_0000, 0xB000_0000, 100, 10**9)
    assert (a.abort_word, a.timed_out_word) == (0xC000_0000, 0xC000_0004)
    full = _args(world=8, rank=7, kind=1, dtype=2, nbytes=[64] + [0] * 7)  # the names' codes, and 8 ranks
    assert (full.kind, full.dtype, full.world) == (1, 2, 8) and full.staged[7] == 0x8_0000_0000
    assert _args(kind="reduce", dtype="float32", nbytes=[64, 0, 0]).kind == 1
    one = make_args(world=1, rank=0, kind=1, dtype=0, graph=False, staged=[0], signal_to=[0], done_to=[0],
                    free_to=[0], wait_signal=[0], wait_done=[0], wait_free=[0], src_off=[0], dst_off=[0],
                    nbytes=[0], input=0, output=0, stage_bytes=0, scale=1.0, abort_word=8, timed_out_word=12,
                    timeout_ns=1)  # a group of one, nothing to move: no address needed
    assert one.world == 1 and list(one.nbytes) == [0] * 8


@pytest.mark.parametrize("over,match", [
    (dict(world=0), "world"), (dict(world=9), "world"), (dict(world=True), "world"),
    (dict(rank=-1), "rank"), (dict(rank=3), "rank"), (dict(rank=1.0), "rank"),
    (dict(staged=[1, 2]), "staged needs one entry per rank"),
    (dict(nbytes=[1, 2, 3, 4]), "nbytes needs one entry per rank"),
    (dict(wait_done=[0, 0]), "wait_done"),
    (dict(kind=2), "kind"), (dict(kind="scatter"), "kind"), (dict(dtype=3), "dtype"), (dict(dtype="int8"), "dtype"),
    (dict(nbytes=[100, -1, 100]), "byte counts"), (dict(stage_bytes=-1), "stage_bytes"),
    (dict(timeout_ns=0), "timeout"), (dict(input=-5), "input"), (dict(staged=[1, -2, 3]), "staged"),
    (dict(signal_to=[0x10, 0, 0]), r"address 0 through signal_to\[2\]"),
    (dict(staged=[1, 2, 0]), r"staged\[2\]"),  # a peer's piece to read from address 0
    (dict(abort_word=0), "abort_word"),
    (dict(kind=1, dtype=1, nbytes=[101, 0, 0]), "whole elements"),  # half a bf16
    (dict(kind=1, dtype=0, nbytes=[100, 0, 0], src_off=[2, 0, 0]), "whole elements"),
])
def test_make_args_refuses_what_the_kernel_cannot_run(over, match):
    with pytest.raises(ValueError, match=match):
        _args(**over)


def test_graph_and_eager_need_their_own_words():
    with pytest.raises(ValueError, match="wait_free"):
        _args(graph=True, wait_free=[0, 0, 0])
    _args(graph=False, wait_free=[0, 0, 0])  # an eager call never touches them
    with pytest.raises(ValueError, match="free_to"):
        _args(graph=False, free_to=[0, 0, 0])
    _args(graph=True, free_to=[0, 0, 0], wait_done=[0, 0, 0])


def _no_cuda(*args, **kwargs):
    raise AssertionError("touched CUDA before checking its arguments")


@pytest.mark.parametrize("field,value", [("world", 0), ("world", 9), ("rank", 3), ("rank", -1), ("kind", 2),
                                         ("dtype", 3), ("graph", 2), ("stage_bytes", -1), ("timeout_ns", 0),
                                         ("abort_word", 0)])
def test_the_launch_checks_its_struct_before_cuda(monkeypatch, field, value):
    monkeypatch.setattr(kernel, "_function", _no_cuda)
    args = _args()
    setattr(args, field, value)
    with pytest.raises(ValueError):
        OneShotLaunch(0, args)
    args = _args()
    args.nbytes[2] = -1
    with pytest.raises(ValueError, match="byte counts"):
        OneShotLaunch(0, args)


class _FakeDriver:
    def __init__(self):
        self.calls = []

    def cuLaunchKernel(self, *args):  # noqa: N802
        self.calls.append(args)
        return (0,)


def test_the_launch_passes_a_copy_of_the_struct_by_value_with_the_sequence_number(monkeypatch):
    monkeypatch.setattr(kernel, "_function", lambda device: "kernel")
    args = _args()
    launch = OneShotLaunch(2, args)
    args.world = 99  # the launch holds its own copy
    cu = _FakeDriver()
    assert launch.launch(cu, "stream", 5) == (0,)
    (function, gx, gy, gz, bx, by, bz, shared, stream, params, extra), = cu.calls
    assert (function, gx, gy, gz, bx, by, bz, shared, stream, extra) == ("kernel", 1, 1, 1, 1024, 1, 1, 0, "stream", 0)
    assert kernel.THREADS == 1024
    # The driver reads one pointer per kernel parameter: the one parameter is the struct.
    (ptr,) = (ctypes.c_void_p * 1).from_address(params)
    seen = OneShotArgs.from_buffer_copy((ctypes.c_char * 720).from_address(ptr))
    assert (seen.world, seen.rank, seen.seq, list(seen.nbytes[:3])) == (3, 1, 5, [100] * 3)
    launch.launch(cu, "stream", (1 << 32) + 7)  # written in place, modulo 2**32
    assert cu.calls[-1][9] == params and OneShotArgs.from_address(ptr).seq == 7
    launch.launch(cu, "stream", -1)
    assert OneShotArgs.from_address(ptr).seq == 0xFFFFFFFF


def _function(name: str, source: str) -> str:
    """The text of device function ``name`` (its signature line to its closing brace)."""
    start = source.index(f" {name}(")
    start = source.rindex("\n", 0, start) + 1
    return source[start:source.index("\n}\n", start) + 2]


def _kernel() -> str:
    src = loader.source("one_shot")
    return src[src.index('extern "C" __global__'):]


def test_the_waits_are_acquire_loads_bounded_in_time_and_abortable():
    src, header = loader.source("one_shot"), loader.source("conccl.cuh")
    wait, peer = _function("wait_geq", header), _function("wait_peer", src)
    assert 'asm volatile("ld.acquire.sys.global.u32' in header
    assert "(int)(ld_acquire(w) - v) >= 0) return true;" in wait  # GEQ, wraps around
    assert "%%globaltimer" in header  # a literal % in inline asm, else NVRTC rejects it
    assert "globaltimer() - start > timeout_ns" in wait and "st_relaxed(timed_out_word, 1u); return false;" in wait
    assert "ld_relaxed(abort_word)" in wait and "if (aborted) return false;" in wait
    assert wait.index("ld_relaxed(abort_word)") < wait.index("ld_acquire(w)")  # both loads in flight at once
    # the one-shot kernel's waits: the header's, on its own words, bounded and abortable by its struct's
    assert ("wait_geq<POLL_SLEEP_NS>((const u32*)word, v, (const u32*)a.abort_word, start, a.timeout_ns, "
            "(u32*)a.timed_out_word);") in peer
    kernel = _kernel()
    assert "const u64 start = globaltimer();" in kernel  # every bound counts from the kernel's start
    assert kernel.count("wait_peer(") == 3  # FREE (graph), READY, DONE(seq - 1) (eager)
    assert "wait_peer(a, a.wait_signal[t], v, start)" in kernel and "wait_peer(a, a.wait_free[t], 1u, start)" in kernel
    assert "wait_peer(a, a.wait_done[t], a.seq - 1u, start)" in kernel
    assert "st_release((u32*)a.free_to[t], a.seq)" in kernel


def test_every_signal_follows_a_system_scope_fence_after_a_barrier():
    kernel = _kernel()
    for word in ("signal_to", "done_to"):  # a barrier, then thread 0: one fence, then the stores
        pattern = (r"__syncthreads\(\);\n(\s*//[^\n]*\n)*\s*if \(t == 0 && w > 1\) \{\n\s*fence_sys\(\);\n"
                   rf"\s*for \(int p = 0; p < w; \+\+p\) if \(p != r\) st_relaxed\(\(u32\*\)a\.{word}\[p\], v\);")
        assert re.search(pattern, kernel), word
    assert 'asm volatile("fence.acq_rel.sys;" ::: "memory")' in _function("fence_sys", loader.source("conccl.cuh"))
    # the order of the call: stage, READY, wait, reads, DONE, release
    order = [kernel.index(s) for s in ("copy_bytes<false>((char*)a.staged[r]", "a.signal_to[p]", "a.wait_signal[t]",
                                       "gather_peers(a)", "a.done_to[p]", "a.wait_done[t]")]
    assert order == sorted(order)
    assert "const u32 v = a.graph ? 1u : a.seq;" in kernel
    assert "st_relaxed((u32*)a.wait_free[t], 0u)" in kernel and "st_relaxed((u32*)a.wait_signal[t], 0u)" in kernel


def test_both_kinds_and_every_dtype_are_there():
    kernel = _kernel()
    assert "if (a.kind == 0) gather_peers(a);" in kernel
    for code in range(3):
        assert f"reduce<{code}>(a);" in kernel
    assert "__launch_bounds__(THREADS) conccl_one_shot(const __grid_constant__ OneShotArgs a)" in kernel
    assert "ld.global.cg" in _function("ld_cg16", loader.source("one_shot"))  # peer data never from L1


def test_the_sum_is_the_reductions_arithmetic():
    mine, theirs, header = loader.source("one_shot"), loader.source("reduce"), loader.source("conccl.cuh")
    # one text of the conversions, conccl.cuh's, included by both
    assert loader.includes(mine) == loader.includes(theirs) == ["conccl.cuh"]
    for name in ("half_to_float", "to_half", "unpack", "pack"):
        defines = re.compile(rf"__device__[^;{{]*\b{name}\(")
        assert defines.search(header) and not defines.search(mine) and not defines.search(theirs), name
    vec = _function("reduce_vectors", mine)
    assert "acc[e] = __fmul_rn(f[e], scale)" in vec and "acc[e] = __fadd_rn(acc[e], __fmul_rn(f[e], scale))" in vec
    scalar = _function("reduce_scalar", mine)
    assert "float acc = __fmul_rn(load_elem<KIND>(operand(a, 0), i), scale);" in scalar
    assert "for (int q = 1; q < a.world; ++q) acc = __fadd_rn(acc, __fmul_rn(load_elem<KIND>(operand(a, q), i), scale));" \
        in scalar
    assert "__fmaf" not in mine and "fma" not in mine.replace("__fmul_rn", "") and "fma" not in header
    assert "return (const char*)(q == a.rank ? a.input : a.staged[q]) + a.src_off[0];" in mine
