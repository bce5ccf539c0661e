"""CPU multi-process tier: the parts calls (``conccl.group.parts``) through a group's whole
protocol on the reference executor, against the flat calls they stand for, bit for bit:
``Group.all_gather_into_parts`` (FSDP without its copy-out) and
``Group.reduce_scatter_from_parts`` (FSDP without its copy-in)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl.testing import spawn  # noqa: E402

SHAPES = [(5, 3), (1,), (7,), (2, 2, 3)]  # parameters' shapes: no world divides every dim 0


def _padded_rows(shape, world):
    """Elements per rank of a parameter FSDP pads on dim 0 (``_get_dim0_padded_size``)."""
    rest = 1
    for d in shape[1:]:
        rest *= d
    return -(-shape[0] // world) * rest


def _grads(rank, dtype):
    g = torch.Generator().manual_seed(17 + rank)
    return [torch.randn(s, generator=g).to(dtype) for s in SHAPES]


def _chunk_cat(grads, world):
    """FSDP's copy-in: row d of every gradient (zero-padded on dim 0), in order, for rank d."""
    rows = []
    for t in grads:
        flat = torch.zeros(world * _padded_rows(t.shape, world), dtype=t.dtype)
        flat[:t.numel()] = t.reshape(-1)
        rows.append(flat.view(world, -1))
    return torch.cat(rows, dim=1).reshape(-1)


def _reduce_from_parts(comm, dtype, mode):
    import torch.distributed as dist

    from conccl.schedule.base import StreamMode

    comm.options.stream_mode = StreamMode(mode)
    w, r = comm.world, comm.rank
    grads = _grads(r, dtype)
    rows = [_padded_rows(s, w) for s in SHAPES]
    out = []
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist._make_nccl_premul_sum(0.5)):
        flat_out = torch.full((sum(rows),), float("nan"), dtype=dtype)
        comm.call(comm_coll("reduce_scatter"), flat_out, _chunk_cat(grads, w), (op,))
        parts_out = torch.full((sum(rows),), float("nan"), dtype=dtype)
        # in a different arena order than the parameters' (the lowest address is not the first)
        arena = torch.empty(sum(t.numel() for t in grads) + 64, dtype=dtype)
        parts, at = [None] * len(grads), 0
        for i in reversed(range(len(grads))):
            parts[i] = arena[at:at + grads[i].numel()].view(grads[i].shape)
            parts[i].copy_(grads[i])
            at += grads[i].numel() + 16
        if r == 0 and w > 2:  # a flat caller and a parts caller interoperate
            comm.call(comm_coll("reduce_scatter"), parts_out, _chunk_cat(grads, w), (op,))
        else:
            comm.reduce_scatter_from_parts(parts_out, parts, rows, op)
        real = torch.cat([torch.arange(n) < max(0, min(n, g.numel() - r * n)) for g, n in zip(grads, rows)])
        out.append(torch.equal(flat_out[real].view(torch.uint8), parts_out[real].view(torch.uint8))
                   and bool(real.any()) and not parts_out[real].isnan().any())
    # an all-reduce (its peers read the own workspace slot after it), then a SUM call twice on
    # one output: the second is remembered (no new local step or moved schedule)
    comm.call(comm_coll("all_reduce"), flat_out, flat_out.clone(), (dist.ReduceOp.SUM,))
    again = torch.full_like(parts_out, float("nan"))
    comm.reduce_scatter_from_parts(again, parts, rows, dist.ReduceOp.SUM)
    again.fill_(float("nan"))
    cached = (len(comm.local_steps), len(comm.moved_schedules))
    seq = comm.seq
    comm.reduce_scatter_from_parts(again, parts, rows, dist.ReduceOp.SUM)
    cached = cached == (len(comm.local_steps), len(comm.moved_schedules))
    flat_out = torch.full_like(parts_out, float("nan"))
    comm.call(comm_coll("reduce_scatter"), flat_out, _chunk_cat(grads, w), (dist.ReduceOp.SUM,))
    out.append(torch.equal(flat_out[real].view(torch.uint8), again[real].view(torch.uint8)))
    out.append(cached)
    bad = None
    try:
        comm.reduce_scatter_from_parts(parts_out, parts, [n + 1 for n in rows])
    except Exception as e:  # noqa: BLE001 - the test reads the message
        bad = f"{type(e).__name__}: {e}"
    return out, comm.seq - seq, bad


def comm_coll(name):
    from conccl.collectives import REGISTRY

    return REGISTRY[name]


@pytest.mark.parametrize("world,mode", [(2, "batch"), (3, "batch"), (3, "per_peer")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reduce_scatter_from_parts_equals_the_flat_call(world, mode, dtype):
    for out, seqs, bad in spawn(world, _reduce_from_parts, dtype, mode):
        assert out == [True] * 5, out
        assert seqs == 2
        assert bad and "rows of" in bad, bad


def _widening_from_parts(comm, dtype, mode):
    """16-bit parts reduced into an fp32 output (FSDP2's reduce_dtype=float32 over bf16
    gradients) against what stock FSDP does: cast the packed input to fp32, reduce in fp32."""
    import torch.distributed as dist

    from conccl.schedule.base import StreamMode

    comm.options.stream_mode = StreamMode(mode)
    w, r = comm.world, comm.rank
    grads = _grads(r, dtype)
    rows = [_padded_rows(s, w) for s in SHAPES]
    real = torch.cat([torch.arange(n) < max(0, min(n, g.numel() - r * n)) for g, n in zip(grads, rows)])
    out = []
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist._make_nccl_premul_sum(0.5)):
        flat_out = torch.full((sum(rows),), float("nan"))
        comm.call(comm_coll("reduce_scatter"), flat_out, _chunk_cat(grads, w).float(), (op,))
        wide = torch.full((sum(rows),), float("nan"))
        comm.reduce_scatter_from_parts(wide, grads, rows, op)
        out.append(torch.equal(flat_out[real].view(torch.uint8), wide[real].view(torch.uint8))
                   and not wide[real].isnan().any())
    bad = None
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    try:  # an output neither the parts' dtype nor fp32 is refused before anything moves (every rank alike)
        comm.reduce_scatter_from_parts(torch.empty(sum(rows), dtype=other), grads, rows)
    except Exception as e:  # noqa: BLE001 - the test reads the message
        bad = f"{type(e).__name__}: {e}"
    return out, bad


@pytest.mark.parametrize("world,mode", [(2, "batch"), (3, "per_peer")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_parts_reduce_into_fp32_like_a_cast_then_an_fp32_reduce_scatter(world, mode, dtype):
    for out, bad in spawn(world, _widening_from_parts, dtype, mode):
        assert out == [True] * 3, out
        assert bad and "InvalidArgument" in bad and "float32" in bad, bad


def _gather_into_parts(comm):
    w, r = comm.world, comm.rank
    rows = [_padded_rows(s, w) for s in SHAPES]
    n = sum(rows)
    flat = torch.full((w * n,), -1.0)
    flat[r * n:(r + 1) * n] = torch.arange(n) + 1000.0 * r  # this rank's shard, in place
    arena = torch.full((w * n + 64,), -2.0)
    parts, at = [None] * len(rows), 0
    for i in reversed(range(len(rows))):  # out of order, with gaps
        parts[i] = arena[at:at + w * rows[i]]
        at += w * rows[i] + 16
    seqs = []
    for _ in range(2):  # the second call takes the remembered moved schedule
        seq = comm.seq
        comm.all_gather_into_parts(flat, flat[r * n:(r + 1) * n], parts)
        seqs.append(comm.seq - seq)
    every = torch.stack([torch.arange(n) + 1000.0 * p for p in range(w)])  # (world, n)
    offs = [sum(rows[:i]) for i in range(len(rows))]
    right = all(torch.equal(parts[i].view(w, rows[i]), every[:, offs[i]:offs[i] + rows[i]]) for i in range(len(rows)))
    gaps = arena[[i for i in range(len(arena)) if not any(
        0 <= i - (p.data_ptr() - arena.data_ptr()) // 4 < p.numel() for p in parts)]]
    plans = len(comm.moved_schedules)
    # no flat output at all: the peers read the input itself (FSDP's sharded parameters, moved
    # into one buffer); here a plain tensor, which the group stages through its workspace
    shard = torch.arange(n, dtype=torch.float32) + 1000.0 * r
    arena.fill_(-2.0)
    comm.all_gather_into_parts(None, shard, parts)
    right_no_output = all(torch.equal(parts[i].view(w, rows[i]), every[:, offs[i]:offs[i] + rows[i]])
                          for i in range(len(rows)))
    bad = None
    try:
        comm.all_gather_into_parts(flat, flat[r * n:(r + 1) * n], [torch.empty(w * n + 1)])
    except Exception as e:  # noqa: BLE001 - the test reads the message
        bad = f"{type(e).__name__}: {e}"
    return right and right_no_output, bool((gaps == -2.0).all()), seqs, plans, bad


@pytest.mark.parametrize("world", [2, 3])
def test_group_gathers_into_parts_through_its_protocol(world):
    for right, gaps, seqs, plans, bad in spawn(world, _gather_into_parts):
        assert right and gaps and seqs == [1, 1] and plans == 1, (right, gaps, seqs, plans)
        assert bad and "do not split a chunk" in bad, bad


def _parts_right_after_an_all_reduce(comm):
    """Rank 1 reads rank 0's workspace slowly, so it is still to pull rank 0's reduced chunk out of
    rank 0's workspace when rank 0, done with the all-reduce, starts a reduce-scatter from parts
    and stages its own row in that very slot. The all-reduce is async on every rank, so that
    the reference executor runs it only after the next call was agreed (as a GPU would queue
    both). The own row must wait for rank 1's DONE of the all-reduce (one stream per peer:
    the mode where that wait and the own copy share a slot)."""
    import time

    import torch.distributed as dist

    from conccl.schedule.base import Buf, StreamMode

    comm.options.stream_mode = StreamMode.PER_PEER
    w, r = comm.world, comm.rank
    n = 4096
    if r == 1:
        reach = comm.executor._bytes

        def slow(rank, buf, *rest):
            if rank == 0 and buf is Buf.WORKSPACE:
                time.sleep(0.2)
            return reach(rank, buf, *rest)

        comm.executor._bytes = slow
    t = torch.arange(n, dtype=torch.float32) + 1000.0 * r
    want = sum(torch.arange(n, dtype=torch.float32) + 1000.0 * p for p in range(w))
    work = comm.call(comm_coll("all_reduce"), t, t, (dist.ReduceOp.SUM,), async_op=True)
    grads = [torch.full((n // w,), 7.0 + r) for _ in range(w)]  # rows unlike the reduced chunk
    out = torch.empty(n // w)
    comm.reduce_scatter_from_parts(out, grads, [n // w // w] * w)
    work.wait()
    return torch.equal(t, want), torch.equal(out, torch.full_like(out, sum(7.0 + p for p in range(w))))


@pytest.mark.parametrize("world", [2, 3])
def test_the_own_row_waits_for_the_previous_calls_readers(world):
    for all_reduce_right, reduce_right in spawn(world, _parts_right_after_an_all_reduce):
        assert all_reduce_right and reduce_right, (all_reduce_right, reduce_right)
