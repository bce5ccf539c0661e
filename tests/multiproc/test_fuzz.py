"""CPU multi-process tier: a randomized run of the group's calls on the reference executor,
every call checked against the registry's reference.

Every rank draws the same steps from ``random.Random(seed)`` (the ranks of a group must make
the same calls); what a rank decides alone (the addresses it gets) never draws. The steps mix:

- every collective of ``conccl.collectives.REGISTRY`` (a new one fails
  tests/unit/test_fuzzed_collectives.py until it gets a maker here), in every
  dtype it takes, from 0 and 1 element to a few thousand, 1-D and 2-D, in place and out of
  place; all-to-all with even splits (given or not) and uneven ones, zeros included, one rank
  sending and receiving nothing at times; reductions by SUM, AVG and PREMUL_SUM of several
  factors; explicit algorithms and stream modes or the group's (whose options change at
  times); blocking and ``async_op`` calls;
- tensors made anew for every call (a new view object each time) from a small pool of
  buffers, at per-rank offsets, so the group's remembered local steps and settled plans hit:
  peer-reachable ones (``executor.empty``), plain ones (``torch.empty``) and plain ones over an
  anonymous mapping of the test's own. A pool buffer is remade now and then (freed, allocated
  again with another kind, dtype or shape), and the calls that used it are replayed on the new
  one at the same offsets. Remaking a mapping as an ``executor.empty`` of its size hands back
  the same addresses (the kernel fills the hole it left), now peer-reachable: the only way an
  address changes meaning on this executor, which unmaps none of its own allocations while
  the group lives; so a remembered local step keyed without ``executor.views_generation`` is
  caught there. Some calls take fresh plain tensors instead;
- persistent ops made on such tensors, started several times with new input values between
  other calls, and closed (or dropped when their buffer is remade);
- calls that ask for what their tensors cannot do (push into a plain output, pull for a
  reduction), which must raise InvalidArgument on every rank and move nothing.

Each call is checked for: its output equal to ``Collective.reference`` of every rank's input
(``torch.equal``: the values are small integers, or reduced the reference's way, operands in
rank order in fp32, so bit for bit); no byte of the pool buffers it touched changed outside its
output, nor its input; and the path the executor ran (the schedule's algorithm, stream mode,
staging) being the documented one for its tensors: the call's algorithm, else the group's,
else push where every rank's output is peer-reachable and pull otherwise; a pull stages
through the workspace unless every rank's source is peer-reachable. A stale remembered step
shows there even where its bytes would still be right (a peer-reachable tensor taken for a
plain one is staged: the right bytes, another path).

Each rank returns its mismatches (step, what); the test prints the first ones. It is in the
long tier (marked ``long``: ``pytest --long``); CI runs it with a
fixed seed, 4000 steps with 2 ranks and 3000 with 3 (``CI_STEPS``; a step is a call, a
persistent start, or now and then a remake or an options change): about 15 s on 2 cores.
A longer or other run, by environment::

    CONCCL_FUZZ_CALLS=20000 CONCCL_FUZZ_SEED=7 CONCCL_FUZZ_WORLDS=2,3,4 \\
        PYTHONPATH=src python -m pytest -q -s --long tests/multiproc/test_fuzz.py

``CONCCL_FUZZ_CALLS``: steps per world (default: ``CI_STEPS``); ``CONCCL_FUZZ_SEED``: the base
seed (default ``SEED``; a failure names the seed of its round); ``CONCCL_FUZZ_WORLDS``: ranks
per group, comma-separated (default 2,3). One group runs at most ``ROUND`` steps, then the
next round a new group with the next seed, so the pool's shared memory stays small. ``-s``
prints what each round reached (calls per collective, refusals, empty tensors, persistent
starts, remakes, addresses handed back).
"""
from __future__ import annotations

import math
import mmap
import os
import random
from dataclasses import dataclass, replace
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from conccl import Algorithm, StreamMode  # noqa: E402
from conccl.collectives import REGISTRY  # noqa: E402
from conccl.collectives.all_reduce import one_pass  # noqa: E402
from conccl.collectives.reduce_scatter import DTYPES as REDUCED_DTYPES  # noqa: E402
from conccl.errors import InvalidArgument  # noqa: E402
from conccl.testing import spawn  # noqa: E402

SEED = int(os.environ.get("CONCCL_FUZZ_SEED", "3303"))
CI_STEPS = {2: 4000, 3: 3000}
CALLS = int(os.environ.get("CONCCL_FUZZ_CALLS", "0"))  # steps per world; 0: CI_STEPS
WORLDS = [int(w) for w in os.environ.get("CONCCL_FUZZ_WORLDS", "2,3").split(",")]
ROUND = 2500  # steps per group at most

MOVED_DTYPES = (torch.float32, torch.bfloat16, torch.int32, torch.uint8)
REDUCING = tuple(getattr(torch, d) for d in REDUCED_DTYPES)
SLOT_BYTES = (1 << 16, 3 << 15, 1 << 17)
SLOT_KINDS = ("sym", "sym", "plain", "mapped", "mapped")
N_SLOTS = 5
FACTORS = (0.5, 2.0, 0.25, 3.0, 0.3)
MAX_REPORTED = 30


def _refused(e: InvalidArgument) -> bool:
    """Whether ``e`` refuses the algorithm (what the test asks for on purpose; anything else a
    call raises is a failure)."""
    return any(m in str(e) for m in ("Algorithm.PUSH needs", "runs push only", "runs one way only"))


class _Stop(Exception):
    """The group may be out of step (a call raised where it should not): stop this rank."""


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _up16(n: int) -> int:
    return -(-n // 16) * 16


def _values(dtype, shape, rank: int, step: int):
    """Rank ``rank``'s input at ``step``: every rank and step its own values, exact in every dtype."""
    i = torch.arange(math.prod(shape), dtype=torch.int64)
    if dtype.is_floating_point:
        v = (i * 5 + rank * 11 + step * 3) % 17 - 8
    elif dtype == torch.uint8:
        v = (i * 7 + rank * 101 + step * 13) % 256
    else:
        v = rank * 10_000_000 + (step * 4099 + i) % 10_000_000
    return v.to(dtype).view(shape)


def _sentinel(dtype):
    return 0xEE if dtype == torch.uint8 else -99


def _op_name(op) -> str:
    kind = getattr(getattr(op, "op", op), "name", str(op))
    if kind == "PREMUL_SUM":
        factor = op.factor if hasattr(op, "factor") else op.__getstate__()[1]
        return f"PREMUL_SUM({factor})"
    return kind


@dataclass
class Spec:
    """One call, alike on every rank but for the per-rank lists (indexed by rank)."""

    coll: str
    dtype: object
    in_shapes: list
    out_shapes: list
    in_place: bool
    args: list  # per rank: the call's extra arguments (what the reference takes too)
    algorithm: Algorithm | None
    stream_mode: StreamMode | None
    async_op: bool
    # Where the tensors live: a pool slot's index or None (a fresh plain tensor), and each
    # rank's byte offset in it. In place, "out" places the one tensor the other is a view of
    # (all-gather: the output; reduce-scatter: the input; all-reduce: the tensor).
    out_src: int | None = None
    out_off: list | None = None
    in_src: int | None = None
    in_off: list | None = None

    def home_shapes(self):
        return self.in_shapes if self.coll == "reduce_scatter" else self.out_shapes

    def slots(self) -> set:
        return {s for s in (self.out_src, None if self.in_place else self.in_src) if s is not None}

    def describe(self, rank: int) -> str:
        where = lambda src, off: "fresh" if src is None else f"slot{src}+{off[rank]}"  # noqa: E731
        places = (f"in place in {where(self.out_src, self.out_off)}" if self.in_place else
                  f"out {where(self.out_src, self.out_off)}, in {where(self.in_src, self.in_off)}")
        args = self.args[rank]
        shown = ", ".join(_op_name(a) if isinstance(a, (dist.ReduceOp, dist.ReduceOp.RedOpType)) else repr(a)
                          for a in args)
        return (f"{self.coll} {str(self.dtype).removeprefix('torch.')} in {tuple(self.in_shapes[rank])} "
                f"out {tuple(self.out_shapes[rank])} ({shown}) algorithm={self.algorithm and self.algorithm.value} "
                f"stream_mode={self.stream_mode and self.stream_mode.value} async={self.async_op}; {places}")


class _Slot:
    """A pool buffer: peer-reachable (``executor.empty``), plain, or plain over a mapping of our own."""

    def __init__(self, ex, kind: str, nbytes: int, dtype, rows: int):
        self.kind, self.nbytes, self._map = kind, nbytes, None
        count = nbytes // torch.empty((), dtype=dtype).element_size()
        shape = (rows, count // rows) if count % rows == 0 else (count,)
        if kind == "sym":
            t = ex.empty(shape, dtype)  # a collective call: every rank remakes the slot at one step
        elif kind == "plain":
            t = torch.empty(shape, dtype=dtype)
        else:
            self._map = mmap.mmap(-1, nbytes)
            t = torch.frombuffer(self._map, dtype=torch.uint8)
        self.bytes = t.view(-1).view(torch.uint8)
        self.bytes.fill_(0x5A)
        self.base = self.bytes.data_ptr()

    def view(self, off: int, shape, dtype):
        return self.bytes[off:off + _nbytes(shape, dtype)].view(dtype).view(shape)

    def free(self) -> None:
        self.bytes = None
        if self._map is not None:
            self._map.close()  # every view of it is gone: the addresses go back to the kernel
            self._map = None


class _Fuzz:
    """One rank's run: the shared draws, this rank's tensors, the checks."""

    def __init__(self, comm, seed: int):
        self.comm, self.rank, self.world = comm, comm.rank, comm.world
        self.rng = random.Random(seed)
        self.step = 0
        self.mismatches: list = []
        self.count = 0
        self.coverage = {k: 0 for k in ("calls", "expected_errors", "empty", "persistent_starts", "remakes",
                                        "address_reused", "replays", "async", "one_shot")}
        for name in REGISTRY:
            self.coverage[name] = 0
        self.recent: list[Spec] = []
        self.replay: list[Spec] = []
        self.ops: list = []  # open persistent ops: [spec, op, out, inp, path]
        self.ran: list = []
        run = comm.executor.run

        def spy(schedule, *a, **k):
            self.ran.append(schedule)
            return run(schedule, *a, **k)

        comm.executor.run = spy
        self.slots = [self._new_slot() for _ in range(N_SLOTS)]

    # ------------------------------------------------------------------ drawing (shared)
    def _new_slot(self, nbytes: int | None = None) -> _Slot:
        r = self.rng
        kind = r.choice(SLOT_KINDS)
        nbytes = nbytes or r.choice(SLOT_BYTES)
        return _Slot(self.comm.executor, kind, nbytes, r.choice(MOVED_DTYPES), r.choice((1, 4, 16)))

    def _n(self) -> int:
        u = self.rng.random()
        if u < 0.07:
            return 0
        if u < 0.14:
            return 1
        if u < 0.6:
            return self.rng.randint(2, 64)
        return self.rng.randint(65, 3000)

    def _op(self):
        r = self.rng.random()
        if r < 0.3:
            return dist.ReduceOp.SUM
        if r < 0.45:
            return dist.ReduceOp.AVG
        return dist._make_nccl_premul_sum(self.rng.choice(FACTORS))

    def _algorithm(self, coll: str, out_src):
        r = self.rng.random()
        if coll == "all_reduce":
            return None if r < 0.6 else Algorithm.PUSH if r < 0.8 else Algorithm.STAGED_PUSH if r < 0.97 else Algorithm.PULL
        if coll == "reduce_scatter":
            return None if r < 0.7 else Algorithm.PUSH if r < 0.97 else Algorithm.PULL
        push = 0.25 if out_src is not None and self.slots[out_src].kind == "sym" else 0.04
        return None if r < 0.5 else Algorithm.PULL if r < 1 - push else Algorithm.PUSH

    def _stream_mode(self):
        return None if self.rng.random() < 0.5 else self.rng.choice(list(StreamMode))

    def _shapes(self, coll: str):
        w, r = self.world, self.rng
        if coll == "all_to_all":
            cols = r.choice((None, 1, 3, 8))
            u = r.random()
            if u < 0.35:
                k = r.randint(0, 8)
                m = [[k] * w for _ in range(w)]
            else:
                m = [[r.choice((0, 0, 0, 1, 2, 3, 5, 8, 16, 40)) for _ in range(w)] for _ in range(w)]
                if u > 0.75:  # one rank sends and receives nothing
                    z = r.randrange(w)
                    for q in range(w):
                        m[z][q] = m[q][z] = 0
            tail = () if cols is None else (cols,)
            ins = [(sum(m[q]),) + tail for q in range(w)]
            outs = [(sum(m[s][q] for s in range(w)),) + tail for q in range(w)]
            if u < 0.35 and r.random() < 0.5:
                args = [(None, None)] * w  # equal splits, not given
            else:
                args = [([m[s][q] for s in range(w)], list(m[q])) for q in range(w)]
            return ins, outs, args, False
        n = self._n()
        cols = r.choice((1, 1, 2, 4, 8))
        rows = n // cols
        two_d = cols > 1 and rows > 0 and r.random() < 0.5
        if coll == "all_gather":
            shape_in = (rows, cols) if two_d else (n,)
            shape_out = (w * rows, cols) if two_d else (w * n,)
            args = ()
        elif coll == "reduce_scatter":
            shape_in = (w * rows, cols) if two_d else (w * n,)
            shape_out = (rows, cols) if two_d else (n,)
            args = (self._op(),)
        elif coll == "all_reduce":
            shape_in = shape_out = (rows, cols) if two_d else (n,)
            args = (self._op(),)
        else:
            raise AssertionError(f"the fuzz has no maker for collective {coll!r}")
        in_place = r.random() < (0.4 if coll == "all_reduce" else 0.3)
        return [shape_in] * w, [shape_out] * w, [args] * w, in_place

    def _draw(self) -> Spec:
        r = self.rng
        coll = r.choice(sorted(REGISTRY))
        dtype = r.choice(REDUCING if coll in ("reduce_scatter", "all_reduce") else MOVED_DTYPES)
        ins, outs, args, in_place = self._shapes(coll)
        spec = Spec(coll, dtype, ins, outs, in_place, args, None, None, r.random() < 0.1)
        spec = self._place(spec)
        spec.algorithm = self._algorithm(coll, spec.out_src)
        spec.stream_mode = self._stream_mode()
        return spec

    def _offsets(self, slot: int, needs: list) -> list | None:
        size = self.slots[slot].nbytes
        if any(max(n, 1) > size for n in needs):
            return None
        return [16 * self.rng.randrange(0, (size - max(n, 1)) // 16 + 1) for n in needs]

    def _place(self, spec: Spec, keep: bool = False) -> Spec:
        """Draw where the tensors live (a slot or fresh, per-rank offsets); ``keep``: in the
        slots they are in now, at new offsets."""
        r, w = self.rng, self.world
        srcs = iter((spec.out_src, spec.in_src) if keep else ())
        pick = lambda: next(srcs) if keep else None if r.random() < 0.15 else r.randrange(len(self.slots))  # noqa: E731
        if spec.in_place:
            src = pick()
            needs = [_nbytes(s, spec.dtype) for s in spec.home_shapes()]
            off = self._offsets(src, needs) if src is not None else None
            return replace(spec, out_src=src if off else None, out_off=off, in_src=None, in_off=None)
        out_src = pick()
        in_src = pick()
        ob = [_nbytes(s, spec.dtype) for s in spec.out_shapes]
        ib = [_nbytes(s, spec.dtype) for s in spec.in_shapes]
        out_off = in_off = None
        if out_src is not None and out_src == in_src:  # one after the other in one buffer
            out_first, gap = r.random() < 0.5, r.choice((0, 16, 64, 208))
            a, b = (ob, ib) if out_first else (ib, ob)
            base = self._offsets(out_src, [_up16(a[q]) + gap + max(b[q], 1) for q in range(w)])
            if base is None:
                out_src = in_src = None
            else:
                first = base
                second = [base[q] + _up16(a[q]) + gap for q in range(w)]
                out_off, in_off = (first, second) if out_first else (second, first)
        else:
            if out_src is not None:
                out_off = self._offsets(out_src, ob)
                out_src = out_src if out_off else None
            if in_src is not None:
                in_off = self._offsets(in_src, ib)
                in_src = in_src if in_off else None
        return replace(spec, out_src=out_src, out_off=out_off, in_src=in_src, in_off=in_off)

    def _fits(self, spec: Spec) -> bool:
        """Whether ``spec``'s offsets still fit its slots (a remade slot may be smaller)."""
        for src, off, shapes in ((spec.out_src, spec.out_off, spec.home_shapes() if spec.in_place else spec.out_shapes),
                                 (None if spec.in_place else spec.in_src, spec.in_off, spec.in_shapes)):
            if src is not None and any(o + max(_nbytes(s, spec.dtype), 1) > self.slots[src].nbytes
                                       for o, s in zip(off, shapes)):
                return False
        return True

    def _again(self) -> Spec:
        """A recent call again (mutated), placed anew where a remade slot no longer holds it."""
        spec = self._mutate(self.rng.choice(self.recent))
        return spec if self._fits(spec) else self._place(spec)

    def _mutate(self, spec: Spec) -> Spec:
        """A recent call again: the same tensors with new values (a loop's next step), or with
        another op, algorithm or stream mode, or moved to other buffers."""
        r = self.rng
        u = r.random()
        if u < 0.45:
            return spec
        if u < 0.7 and spec.coll in ("reduce_scatter", "all_reduce"):
            return replace(spec, args=[(self._op(),)] * self.world)
        if u < 0.8:
            return replace(spec, algorithm=self._algorithm(spec.coll, spec.out_src), stream_mode=self._stream_mode(),
                           async_op=r.random() < 0.1)
        if u < 0.9 and self.world > 1:  # some ranks move their tensors in the same buffers, the others keep theirs
            moved = self._place(spec, keep=True)
            if moved.out_src != spec.out_src or moved.in_src != spec.in_src:  # did not fit: fresh now
                return moved
            ranks = set(r.sample(range(self.world), r.randint(1, self.world - 1)))
            pick = lambda new, old: None if new is None else [new[q] if q in ranks else old[q]  # noqa: E731
                                                               for q in range(self.world)]
            return replace(spec, out_off=pick(moved.out_off, spec.out_off), in_off=pick(moved.in_off, spec.in_off))
        return self._place(spec)

    # ------------------------------------------------------------------ this rank's tensors
    def _tensors(self, spec: Spec):
        me, dt = self.rank, spec.dtype

        def make(src, off, shape):
            return torch.empty(shape, dtype=dt) if src is None else self.slots[src].view(off[me], shape, dt)

        if not spec.in_place:
            return (make(spec.out_src, spec.out_off, spec.out_shapes[me]),
                    make(spec.in_src, spec.in_off, spec.in_shapes[me]))
        home = make(spec.out_src, spec.out_off, spec.home_shapes()[me])
        if spec.coll == "all_reduce":
            return home, home
        if spec.coll == "all_gather":
            n = math.prod(spec.in_shapes[me])
            return home, home.view(-1)[me * n:(me + 1) * n].view(spec.in_shapes[me])
        n = math.prod(spec.out_shapes[me])  # reduce_scatter: the output is the input's own chunk
        return home.view(-1)[me * n:(me + 1) * n].view(spec.out_shapes[me]), home

    def _out_range(self, spec: Spec):
        """(slot, start, end) of this rank's output bytes in a pool slot, or None."""
        me = self.rank
        if spec.out_src is None:
            return None
        start = spec.out_off[me]
        nb = _nbytes(spec.out_shapes[me], spec.dtype)
        if spec.in_place and spec.coll == "reduce_scatter":
            start += me * nb
        return spec.out_src, start, start + nb

    def _sym(self, src) -> bool:
        return src is not None and self.slots[src].kind == "sym"

    def _path(self, spec: Spec):
        """(algorithm, stream mode, staged or None: not checked) the call must run; None: it must
        raise InvalidArgument."""
        requested = spec.algorithm or self.comm.options.algorithm
        mode = spec.stream_mode or self.comm.options.stream_mode
        out_sym = self._sym(spec.out_src)
        if spec.coll == "all_reduce":  # one pass or two, by size (conccl.collectives.all_reduce)
            requested = spec.algorithm  # a group default does not choose its form
            if requested is Algorithm.PULL:
                return None
            nbytes = math.prod(spec.out_shapes[self.rank]) * spec.dtype.itemsize
            algorithm = requested or (Algorithm.STAGED_PUSH if one_pass(nbytes, self.world) else Algorithm.PUSH)
            if algorithm is Algorithm.STAGED_PUSH and spec.in_place and nbytes and mode is StreamMode.PER_PEER:
                mode = StreamMode.BATCH  # its pushes read what its reduction overwrites: one stream
            return algorithm, mode, True
        if spec.coll == "reduce_scatter":
            return None if requested is Algorithm.PULL else (Algorithm.PUSH, mode, True)
        if requested is Algorithm.PUSH and not out_sym:
            return None
        algorithm = requested or (Algorithm.PUSH if out_sym else Algorithm.PULL)
        src_sym = out_sym if spec.in_place else self._sym(spec.in_src)
        return algorithm, mode, algorithm is Algorithm.PULL and not src_sym and self.world > 1

    # ------------------------------------------------------------------ checks
    def _bad(self, what: str, spec: Spec | None = None) -> None:
        self.count += 1
        if len(self.mismatches) < MAX_REPORTED:
            self.mismatches.append((self.step, what + ("" if spec is None else f" [{spec.describe(self.rank)}]")))

    def _fill(self, spec: Spec, out, inp):
        """Write the sentinel into the output, then the input's values (in place, one is in the
        other); return the touched slots' bytes and the input as they are before the call."""
        out.fill_(_sentinel(spec.dtype))
        inp.copy_(_values(spec.dtype, spec.in_shapes[self.rank], self.rank, self.step))
        return [(s, self.slots[s].bytes.clone()) for s in sorted(spec.slots())], inp.clone()

    def _run(self, spec: Spec, go, path, tensors=None):
        """Run ``go(out, inp)`` (the call or a persistent start) for ``spec`` and check all it did."""
        out, inp = tensors or self._tensors(spec)
        before, inp_before = self._fill(spec, out, inp)
        out_before = out.clone()
        self.ran.clear()
        self.coverage["calls"] += 1
        self.coverage[spec.coll] += 1
        self.coverage["empty"] += any(math.prod(s) == 0 for s in spec.out_shapes + spec.in_shapes)
        self.coverage["async"] += spec.async_op
        try:
            work = go(out, inp)
            if spec.async_op:
                work.wait()
        except InvalidArgument as e:
            if path is not None or not _refused(e):
                self._bad(f"raised {e}", spec)
                raise _Stop from None
            self.coverage["expected_errors"] += 1
            if not torch.equal(out.view(-1).view(torch.uint8), out_before.view(-1).view(torch.uint8)):
                self._bad("a refused call wrote its output", spec)
            self._check_guard(spec, before, None)
            return
        except Exception as e:  # noqa: BLE001 - reported, then this rank stops
            self._bad(f"raised {type(e).__name__}: {e}", spec)
            raise _Stop from None
        if path is None:
            self._bad("ran, but must raise InvalidArgument", spec)
            return
        self._check_path(spec, path)
        inputs = [_values(spec.dtype, spec.in_shapes[q], q, self.step) for q in range(self.world)]
        expected = REGISTRY[spec.coll].reference(inputs, self.rank, spec.args)
        if not torch.equal(out.reshape(-1), expected.reshape(-1)):
            wrong = (out.reshape(-1) != expected.reshape(-1)).nonzero().reshape(-1)
            i = int(wrong[0])
            self._bad(f"output differs from the reference at {len(wrong)} of {out.numel()} elements, first "
                      f"[{i}]: {out.reshape(-1)[i].item()} != {expected.reshape(-1)[i].item()}", spec)
        if not spec.in_place and spec.in_src is None and not torch.equal(inp, inp_before):
            self._bad("the call changed its input", spec)
        self._check_guard(spec, before, self._out_range(spec))

    def _check_guard(self, spec: Spec, before, out_range) -> None:
        for s, old in before:
            now = self.slots[s].bytes
            a, b = out_range[1:] if out_range is not None and out_range[0] == s else (0, 0)
            for lo, hi in ((0, a), (b, now.numel())):
                if not torch.equal(now[lo:hi], old[lo:hi]):
                    at = lo + int((now[lo:hi] != old[lo:hi]).nonzero()[0])
                    self._bad(f"slot {s} changed outside the output (byte {at}; output at [{a}, {b}))", spec)

    def _check_path(self, spec: Spec, path) -> None:
        if len(self.ran) != 1:
            self._bad(f"ran {len(self.ran)} schedules", spec)
            return
        s = self.ran[0]
        algorithm, mode, staged = path
        got = (s.collective, s.algorithm, s.stream_mode, s.staged)
        want = (spec.coll, algorithm, mode, s.staged if staged is None else staged)
        if got != want:
            self._bad(f"ran {got[0]} {got[1].value} {got[2].value} staged={got[3]}, expected {want[1].value} "
                      f"{want[2].value} staged={want[3]}", spec)

    # ------------------------------------------------------------------ steps
    def _call(self, spec: Spec) -> None:
        coll = REGISTRY[spec.coll]
        fn = getattr(self.comm, coll.api_name)
        kw = {"algorithm": spec.algorithm, "stream_mode": spec.stream_mode}
        path = self._path(spec)
        if self.rng.random() < 0.3:  # as the public functions call: may run one-shot (conccl.collectives.one_shot)
            go = lambda out, inp: self.comm.call(coll, out, inp, tuple(spec.args[self.rank]),  # noqa: E731
                                                 async_op=spec.async_op, route=True, **kw)
            if path is not None and self._one_shot(spec):
                path = (Algorithm.PULL, StreamMode.SINGLE, True)
                self.coverage["one_shot"] += 1
        else:
            go = lambda out, inp: fn(out, inp, *spec.args[self.rank], async_op=spec.async_op, **kw)  # noqa: E731
        self._run(spec, go, path)
        self.recent = (self.recent + [spec])[-16:]

    def _one_shot(self, spec: Spec) -> bool:
        """Whether a routed call runs one-shot: on every rank, its output below the group's
        limit, with no algorithm or stream mode asked for."""
        limit = self.comm.options.one_shot_below
        return (spec.algorithm is None and spec.stream_mode is None and limit > 0
                and all(0 < _nbytes(shape, spec.dtype) < limit for shape in spec.out_shapes))

    def _persist_make(self) -> None:
        spec = self._again() if self.recent and self.rng.random() < 0.5 else self._draw()
        out, inp = self._tensors(spec)
        path = self._path(spec)
        fn = getattr(self.comm, "persistent_" + REGISTRY[spec.coll].api_name)
        try:
            op = fn(out, inp, *spec.args[self.rank], algorithm=spec.algorithm, stream_mode=spec.stream_mode)
        except InvalidArgument as e:
            if path is not None or not _refused(e):
                self._bad(f"persistent op refused: {e}", spec)
                raise _Stop from None
            self.coverage["expected_errors"] += 1
            return
        except Exception as e:  # noqa: BLE001
            self._bad(f"persistent op raised {type(e).__name__}: {e}", spec)
            raise _Stop from None
        if path is None:
            self._bad("persistent op made, but must raise InvalidArgument", spec)
            op.close()
            return
        self.ops.append([spec, op, out, inp, path])
        if len(self.ops) > 3:
            self.ops.pop(0)[1].close()

    def _persist_start(self) -> None:
        spec, op, out, inp, path = self.ops[self.rng.randrange(len(self.ops))]
        spec = replace(spec, async_op=self.rng.random() < 0.15)
        self.coverage["persistent_starts"] += 1
        self._run(spec, lambda _o, _i: op.start(async_op=spec.async_op), path, (out, inp))
        if self.rng.random() < 0.1:
            self._persist_close()

    def _persist_close(self) -> None:
        self.ops.pop(self.rng.randrange(len(self.ops)))[1].close()

    def _remake(self) -> None:
        r = self.rng
        k = r.randrange(len(self.slots))
        for o in [o for o in self.ops if k in o[0].slots()]:  # the program drops its ops on the buffer
            o[1].close()
            self.ops.remove(o)
        old = self.slots[k]
        old_kind, old_base, old_bytes = old.kind, old.base, old.nbytes
        try:
            old.free()
        except BufferError:  # a view of the mapping is still alive somewhere: a test bug
            self._bad(f"slot {k}: a view of its mapping outlived it")
            raise _Stop from None
        self.slots[k] = new = self._new_slot(old_bytes if r.random() < 0.75 else None)
        self.coverage["remakes"] += 1
        self.coverage["address_reused"] += new.kind != old_kind and new.base == old_base
        # the calls that used the buffer, again on the new one at the same offsets
        again = [s for s in self.recent if k in s.slots()][-4:]
        self.replay += [s if self._fits(s) else self._place(s) for s in again]

    def _set_options(self) -> None:
        r = self.rng
        self.comm.options.algorithm = None if r.random() < 0.8 else r.choice((Algorithm.PULL, Algorithm.PUSH))
        self.comm.options.stream_mode = r.choice(list(StreamMode))
        self.comm.options.one_shot_below = r.choice((0, 4096, 1 << 20))

    def run(self, steps: int) -> None:
        r = self.rng
        for self.step in range(steps):
            if self.replay:
                self.coverage["replays"] += 1
                self._call(self.replay.pop(0))
                continue
            u = r.random()
            if u < 0.02:
                self._remake()
            elif u < 0.032:
                self._set_options()
            elif u < 0.05:
                self._persist_make()
            elif u < 0.11 and self.ops:
                self._persist_start()
            elif u < 0.45 and self.recent:
                self._call(self._again())
            else:
                self._call(self._draw())


def _fuzz(comm, seed: int, steps: int):
    torch.set_num_threads(1)  # this process only (forked): ranks share the host's cores
    f = _Fuzz(comm, seed)
    try:
        f.run(steps)
    except _Stop:
        pass
    finally:
        for o in f.ops:
            o[1].close()
    return f.mismatches, f.count, f.coverage


def _rounds(world: int):
    steps = CALLS or CI_STEPS.get(world, 1000)
    n = -(-steps // ROUND)
    return [(SEED + 1000 * world + i, steps // n + (i < steps % n)) for i in range(n)]


@pytest.mark.long
@pytest.mark.parametrize("world", WORLDS)
def test_fuzz_every_call_matches_the_reference(world):
    for seed, steps in _rounds(world):
        results = spawn(world, _fuzz, seed, steps, timeout=timedelta(seconds=20), join_timeout_s=900)
        report = []
        for rank, (mismatches, count, coverage) in enumerate(results):
            report += [f"rank {rank} step {step}: {what}" for step, what in mismatches]
            if count > len(mismatches):
                report.append(f"rank {rank}: {count - len(mismatches)} more")
        cov = results[0][2]
        print(f"world {world} seed {seed}: {steps} steps, coverage {cov}")
        assert not report, (f"world {world}, seed {seed} (CONCCL_FUZZ_SEED={SEED}), {steps} steps: "
                            f"{sum(c for _, c, _ in results)} mismatches\n" + "\n".join(report[:40]))
        # what the mix must reach for the caches to be exercised at all
        assert cov["calls"] > steps // 2 and cov["expected_errors"] and cov["empty"] and cov["persistent_starts"]
        assert cov["remakes"] and cov["replays"] and all(cov[name] for name in REGISTRY), cov
        assert cov["one_shot"], cov
