"""What the measured study runs: a collective's buffers and callables (:class:`CollectiveCase`),
a GEMM's (:class:`GemmCase`) and an eager call's on ordinary tensors (:class:`EagerCase`).
Before the last execution of every collective configuration the output is poisoned, and after
it every rank checks its output against the pattern (:mod:`conccl.study.patterns`); an eager
case compares conccl's output with NCCL's before it is timed."""
from __future__ import annotations

import torch
import torch.distributed as dist

import conccl

from .. import collectives
from .patterns import fill_pattern, fill_values, matches_pattern, matches_sum
from .rig import Rig
from .scenarios import Gemm


class CollectiveCase:
    """Buffers of one collective in the symmetric arenas, the callables that run it with each
    implementation, and its poison / check, all from the collective's equal-chunk layout:
    input chunk ``k`` of rank ``r`` holds ``pattern(r, k)``, and output chunk ``c`` must end up
    holding the pattern of its source, ``layout.sources[c]``. A collective the study runs in
    place (an all-gather, as FSDP runs it) takes its input from its own output chunk.

    A reducing collective (an output chunk with several sources) gets whole-number values
    instead, and its output chunk must hold their sum; one that reduces a single tensor in
    place (all-reduce) is "poisoned" by restoring its input, which each execution reduces anew."""

    def __init__(self, rig: Rig, collective: str, size: int, arenas):
        self.rig, self.collective, self.size = rig, collective, size
        self.coll = collectives.get(collective)
        w, r = rig.world, rig.rank
        self.layout = lay = self.coll.layout(w, r)
        self.in_place = self.coll.in_place(w)
        self.reducing = any(len(srcs) > 1 for srcs in lay.sources)
        in_bytes = self.coll.input_bytes(size, w)
        out_arena, in_arena = arenas
        self.out = out_arena[:size].view(torch.bfloat16)
        self.out16 = self.out.view(torch.int16)
        if self.coll.single_tensor:  # reduced in place, as torch.distributed.all_reduce
            self.inp = self.out
        elif self.in_place:
            self.inp = self.out.view(lay.output_chunks, -1)[lay.in_place_chunk]
        else:
            self.inp = in_arena[:in_bytes].view(torch.bfloat16)
        ins = self.inp.view(torch.int16).view(lay.input_chunks, -1)
        for k in range(lay.input_chunks):
            (fill_values if self.reducing else fill_pattern)(ins[k], r, k)
        # The tensor an in-place reduction overwrites, to restore before the checked execution.
        self.pristine = in_arena[:in_bytes].view(torch.bfloat16) if self.coll.single_tensor else None
        if self.pristine is not None:
            self.pristine.copy_(self.inp)
        # PyTorch's op takes an input of its own, at the same offset on every rank.
        self.lc_in = in_arena[:in_bytes].view(torch.bfloat16) if self.in_place else self.inp
        if self.in_place:
            self.lc_in.copy_(self.inp)
        self.lc_out = None
        self._conccl_op = None

    def _chunks(self, target):
        t = target if target is not None else self.out
        return t.view(torch.int16).view(self.layout.output_chunks, -1)

    def poison(self, target=None) -> None:
        """Overwrite every output chunk but the one that is the input itself (an in-place
        reduction: restore its input, so the checked execution's result is known)."""
        if self.pristine is not None and target is None:
            self.out.copy_(self.pristine)
            return
        chunks = self._chunks(target)
        for c in range(self.layout.output_chunks):
            if not (self.in_place and c == self.layout.in_place_chunk and target is None):
                chunks[c].fill_(-1)

    def check(self, target=None) -> bool:
        chunks = self._chunks(target)
        if self.reducing:
            ok = all(matches_sum(chunks[c], srcs) for c, srcs in enumerate(self.layout.sources))
        else:
            ok = all(matches_pattern(chunks[c], *srcs[0]) for c, srcs in enumerate(self.layout.sources))
        return self.rig.all_true(ok)

    def fn(self, impl: str, group=None):
        if impl == "nccl":
            op = getattr(dist, self.coll.api_name)
            if self.coll.single_tensor:
                return lambda: op(self.out, group=group)
            return lambda: op(self.out, self.inp, group=group)
        if impl == "conccl":
            # As a loop over the same buffers runs it: a persistent op, agreed with the peers
            # once (the first time any strategy asks, on every rank alike), then only started.
            return self.conccl_op().start
        if impl == "torch_lc":
            name = dist.group.WORLD.group_name

            def run():
                # The last output goes first (stream-ordered, the allocator hands its block to
                # the next): held across the call, two outputs would need twice the memory
                # (a 20 GiB scenario ran out of memory on an 80 GB H100 so).
                self.lc_out = None
                out = torch.ops.symm_mem._low_contention_all_gather(self.lc_in, name)
                self.lc_out = torch.ops._c10d_functional.wait_tensor(out)
            return run
        raise ValueError(f"unknown collective implementation {impl!r}")

    def conccl_op(self):
        if self._conccl_op is None:
            tensors = (self.out,) if self.coll.single_tensor else (self.out, self.inp)
            self._conccl_op = getattr(conccl, "persistent_" + self.coll.api_name)(*tensors)
        return self._conccl_op

    def close(self) -> None:
        """Let go of what holds the arenas: the persistent op, PyTorch's last output."""
        if self._conccl_op is not None:
            self._conccl_op.close()
            self._conccl_op = None
        self.lc_out = None

    def poison_lc(self) -> None:
        """PyTorch's op allocates its output every call: poison the last one and let it go, so
        the allocator's next block holds no correct bytes from before."""
        if self.lc_out is not None:
            self.poison(self.lc_out)
            self.lc_out = None

    def hbm_bytes(self) -> int:
        """Bytes this rank's HBM reads and writes in the collective (its peers' share arrives by
        NVLink and is written here; its own share is read once per peer)."""
        return self.coll.hbm_bytes(self.size, self.rig.world)


class EagerCase:
    """One collective called eagerly through the public functions on ordinary tensors (what
    ``set_eager_path("auto")`` chooses between): ``calls`` calls back to back per execution,
    conccl's (copy engines; its input staged, as any plain tensor's) into one output and
    torch.distributed's into another, from the same input; a single-tensor collective (the
    all-reduce) in place on its output, as it is called (no copy of the input first: the values
    grow from call to call, which costs neither implementation anything). :meth:`check`
    compares the two outputs of one call each from the same input, bit for bit (the inputs
    are the study's patterns, or whole numbers where the collective sums: exact in any order)."""

    def __init__(self, rig: Rig, collective: str, size: int, calls: int):
        self.rig, self.calls = rig, calls
        self.coll = collectives.get(collective)
        w, r = rig.world, rig.rank
        lay = self.coll.layout(w, r)
        reducing = any(len(srcs) > 1 for srcs in lay.sources)
        self.inp = torch.empty(self.coll.input_bytes(size, w) // 2, dtype=torch.bfloat16, device=rig.device)
        ins = self.inp.view(torch.int16).view(lay.input_chunks, -1)
        for k in range(lay.input_chunks):
            (fill_values if reducing else fill_pattern)(ins[k], r, k)
        self.outs = {impl: torch.empty(size // 2, dtype=torch.bfloat16, device=rig.device) for impl in EAGER_IMPLS}

    def fn(self, impl: str):
        call, out, inp, calls = getattr(_EAGER_LIBS[impl], self.coll.api_name), self.outs[impl], self.inp, self.calls
        if self.coll.single_tensor:
            def run():
                for _ in range(calls):
                    call(out)
        else:
            def run():
                for _ in range(calls):
                    call(out, inp)
        return run

    def check(self) -> bool:
        """One call of each from the same input, then the outputs equal bit for bit on every rank."""
        for impl in EAGER_IMPLS:
            self.outs[impl].fill_(-1)
            self.coll.call_with(_EAGER_LIBS[impl], self.outs[impl], self.inp)  # a single tensor: the input copied in
        torch.cuda.synchronize()
        a, b = (self.outs[impl].view(torch.int16) for impl in EAGER_IMPLS)
        return self.rig.all_true(bool(torch.equal(a, b)))


EAGER_IMPLS = ("conccl", "nccl")
_EAGER_LIBS = {"conccl": conccl, "nccl": dist}  # whose public functions each implementation calls
# Every public collective: set_eager_path("auto") routes each (the scenarios study two).
EAGER_COLLECTIVES = tuple(collectives.REGISTRY)


class GemmCase:
    def __init__(self, rig: Rig, gemm: Gemm):
        g = torch.Generator(device=rig.device).manual_seed(1234 + rig.rank)
        self.gemm = gemm
        self.a = torch.randn(gemm.m, gemm.k, dtype=torch.bfloat16, device=rig.device, generator=g)
        self.b = torch.randn(gemm.k, gemm.n, dtype=torch.bfloat16, device=rig.device, generator=g)
        self.c = torch.empty(gemm.m, gemm.n, dtype=torch.bfloat16, device=rig.device)

    def fn(self):
        return lambda: torch.mm(self.a, self.b, out=self.c)

