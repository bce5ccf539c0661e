"""The MLP block benchmark's reference math (conccl.bench.tp_block), no device: its column and
row functions, with the collectives of a world of one, are the unsharded block's forward and
backward; the unsharded reference takes each rank's rows and shards."""
from __future__ import annotations

import torch

from conccl.bench import tp_block


class _OneRank:
    """A world of one: the all-gather and the reduce-scatter move nothing."""

    def ag_mm(self, x, ws):
        return x, [x @ w for w in ws]

    def mm_rs(self, x, w):
        return x @ w


def _block(d=8, ffn=12, tokens=6, world=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    full_w = [torch.randn(n_out, n_in, generator=g, dtype=torch.float64) for n_out, n_in in ((ffn, d), (ffn, d), (d, ffn))]
    xs = [torch.randn(tokens // world, d, generator=g, dtype=torch.float64) for _ in range(world)]
    dys = [torch.randn(tokens // world, d, generator=g, dtype=torch.float64) for _ in range(world)]
    return full_w, xs, dys


def test_the_column_and_row_functions_are_the_blocks_forward_and_backward():
    Column, Row = tp_block._functions(torch)
    full_w, xs, dys = _block(world=1)
    ref = tp_block._unsharded(torch, full_w, xs, dys, rank=0, rows=xs[0].shape[0], fs=full_w[0].shape[0])
    params = [w.clone().requires_grad_() for w in full_w]
    x = xs[0].clone().requires_grad_()
    gate, up = Column.apply(x, _OneRank(), params[0], params[1])
    y = Row.apply(torch.nn.functional.silu(gate) * up, params[2], _OneRank())
    y.backward(dys[0])
    for got, want in zip([y, x.grad] + [p.grad for p in params], ref):
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert tp_block._relative(torch, [y], [ref[0]]) < 1e-12
    assert tp_block._relative(torch, [y + 1], [ref[0]]) > 1e-3  # the measure sees a difference


def test_the_unsharded_reference_takes_each_ranks_rows_and_shards():
    full_w, xs, dys = _block(world=2)
    ffn, rows = full_w[0].shape[0], xs[0].shape[0]
    whole = tp_block._unsharded(torch, full_w, xs, dys, rank=0, rows=2 * rows, fs=ffn)
    for rank in range(2):
        part = tp_block._unsharded(torch, full_w, xs, dys, rank=rank, rows=rows, fs=ffn // 2)
        own, cols = slice(rank * rows, (rank + 1) * rows), slice(rank * ffn // 2, (rank + 1) * ffn // 2)
        assert torch.equal(part[0], whole[0][own]) and torch.equal(part[1], whole[1][own])
        assert torch.equal(part[2], whole[2][cols]) and torch.equal(part[4], whole[4][:, cols])


def test_the_block_records_what_auto_ran():
    """`auto` in the block resolves per shape; the record and the table name the picks (the
    shipped H100 table: push for the all-gather+GEMM shape at world 2), a named schedule none."""
    from conccl import tp as ctp
    from conccl.planner import tp as tp_planner

    class _Ctp:  # conccl.tp's resolver, planned for an H100 (no GPU here)
        @staticmethod
        def resolve_schedule(schedule, op, M, K, N, world, dtype, device):
            return tp_planner.choose(op, M, K, N, world, "bfloat16", device_name="NVIDIA H100 80GB HBM3").schedule

    picks = tp_block.auto_picks(_Ctp, "auto", 8192, 4096, 7168, 2, torch.bfloat16, None)
    assert picks.startswith("ag_gemm push") and ", gemm_rs " in picks and "push" not in picks.split("gemm_rs")[1]
    assert tp_block.auto_picks(ctp, "direct", 8192, 4096, 7168, 2, torch.bfloat16, None) is None
    rec = tp_block.BlockRecord(8192, 4096, 14336, 2, "conccl", "auto", 1.0, 0.01, 1.1, 0.5, True, 0.0, 0.001,
                               resolved=picks)
    doc = tp_block.document({"machine_kind": "x", "world": 2}, [rec], 1, 2)
    assert f"| conccl | auto ({picks}) |" in tp_block.markdown(doc)
