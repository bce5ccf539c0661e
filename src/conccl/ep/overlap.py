"""A MoE layer over micro-batches, its communication beside its expert GEMMs.

``moe_layer(x, topk_idx, topk_weights, num_experts, experts, chunks=2)`` splits the tokens into
``chunks`` micro-batches and runs ``combine(experts(dispatch(chunk)))`` for each, in a pipeline
over two streams::

    communication stream:  D0 | D1  C0 | D2  C1 | ...          (D: dispatch, C: combine)
    current stream:             E0   |  E1   |  E2 ...          (E: the expert GEMMs)

chunk i's experts start when its rows arrived (an event, not the whole stream), chunk i+1 is
dispatched meanwhile and chunk i's combine starts when its experts finished: the copy engines
move chunk i+1's rows while the SMs run chunk i's GEMMs (what the paper's overlap pays for).
The communication stream has the highest priority, so its small kernels (routing, gathers,
sums: conccl.ep's module doc) take SMs as soon as a GEMM block retires instead of queueing
behind the GEMM. Autograd runs each chunk's backward on the stream its forward ran on, so the
backward overlaps alike.

Arithmetic: per chunk, exactly :func:`~conccl.ep.dispatch` and
:func:`~conccl.ep.combine`'s; a token's result does not depend on the other tokens
of its chunk, but the expert GEMMs' rows may round differently at another row count, so the
result equals the same chunks run one after another (``overlap=False``) bit for bit, and the
unchunked layer to the GEMMs' rounding.

Host: dispatch reads its sizes on the host (one sync per chunk, on the communication stream
only: the GEMMs already queued keep running); with ``fixed_sizes=True`` nothing waits.
"""
from __future__ import annotations

import contextlib

import torch

_STREAMS: dict = {}  # device index -> the communication stream


def _comm_stream(device) -> "torch.cuda.Stream":
    s = _STREAMS.get(device.index)
    if s is None:
        low, high = torch.cuda.Stream.priority_range()
        s = _STREAMS[device.index] = torch.cuda.Stream(device, priority=high)
    return s


class _Sequential:
    """Stand-ins for streams and events where there are none (the CPU), or where the chunks run
    one after another: the same order of calls."""

    comm = cur = None

    def stream(self):
        return contextlib.nullcontext()

    def event(self, stream):
        return None

    def wait(self, stream, event):
        pass

    def keep(self, t, stream):
        pass


class _Streams(_Sequential):
    def __init__(self, device, comm):
        self.comm, self.cur = comm, torch.cuda.current_stream(device)

    def stream(self):
        return torch.cuda.stream(self.comm)

    def event(self, stream):
        e = torch.cuda.Event()
        e.record(stream)
        return e

    def wait(self, stream, event):
        stream.wait_event(event)

    def keep(self, t, stream):
        t.record_stream(stream)  # made on one stream, used on the other: kept until that one passes


def _bounds(tokens: int, chunks: int) -> list[tuple[int, int]]:
    step = -(-tokens // chunks) if tokens else 0
    return [(s, min(s + step, tokens)) for s in range(0, tokens, step)] if step else [(0, 0)]


def moe_layer(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor | None, num_experts: int,
              experts, *, chunks: int = 2, group=None, overlap: bool = True, stream=None,
              fixed_sizes: bool = False) -> torch.Tensor:
    """``[T, H]``: each token's expert outputs, weighted and summed (:func:`conccl.ep.combine`),
    computed over ``chunks`` micro-batches of the rows of ``x`` [T, H] (``topk_idx``,
    ``topk_weights`` [T, k] alike), their dispatch and combine on a communication stream beside
    the expert GEMMs on the current stream (module doc). ``experts(expert_x, counts) -> [N, H']``:
    the local experts on the rows dispatch returned (``counts[e]`` rows of local expert e, in
    order), run on the current stream (work it puts on other streams it must join there itself).
    ``overlap=False``: the same chunks one after another on the current stream.
    ``stream``: the communication stream (default: one of the highest priority per device).
    Collective (every rank the same ``chunks``; ranks may hold different numbers of tokens).
    Differentiable in ``x``, ``topk_weights`` and whatever ``experts`` uses.

    ``fixed_sizes=True``: every chunk's dispatch with fixed sizes (:mod:`.fixed`: no host sync,
    so the host queues the whole layer ahead of the GPU; every rank the same token count):
    ``experts`` then gets ``counts`` as an int32 device tensor and rows with room for the worst
    case past its sum (ignore them: ``torch._grouped_mm`` with ``offs=counts.cumsum(0)`` does)."""
    from . import combine, dispatch

    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    # every rank runs the same number of chunks, even with fewer tokens than chunks (empty ones)
    bounds = _bounds(x.shape[0], chunks)
    bounds += [(x.shape[0], x.shape[0])] * (chunks - len(bounds))
    on = _Streams(x.device, stream or _comm_stream(x.device)) if (overlap and x.is_cuda) else _Sequential()
    if on.comm is not None:
        on.comm.wait_stream(on.cur)  # the inputs were made on the current stream
    # split once: the backward of one split is one concatenation, of per-chunk slices a
    # full-size zero gradient each
    sizes = [e - s for s, e in bounds]
    xs, idxs = x.split(sizes), topk_idx.split(sizes)
    ws = [None] * chunks if topk_weights is None else topk_weights.split(sizes)
    sent, outs = [None] * chunks, [None] * chunks

    def send(i):
        with on.stream():
            sent[i] = dispatch(xs[i], idxs[i], ws[i], num_experts, group, fixed_sizes=fixed_sizes)
            sent[i] = (*sent[i], on.event(on.comm))

    send(0)
    for i in range(chunks):
        rows, counts, handle, arrived = sent[i]
        on.wait(on.cur, arrived)
        on.keep(rows, on.cur)
        if torch.is_tensor(counts):  # fixed sizes: the counts are a device tensor made there too
            on.keep(counts, on.cur)
        y = experts(rows, counts)
        done = on.event(on.cur)
        if i + 1 < chunks:
            send(i + 1)  # its copies run beside chunk i's GEMMs
        with on.stream():
            on.wait(on.comm, done)
            on.keep(y, on.comm)
            outs[i] = combine(y, handle, ws[i])
    if on.comm is not None:
        on.cur.wait_stream(on.comm)
        for o in outs:
            on.keep(o, on.cur)
    return torch.cat(outs) if outs else x[:0]
