"""CPU multi-process tier for ``conccl.tp.parallelize_module``: a small Llama-style block of plain
``nn.Linear`` layers (attention with local heads, a SwiGLU MLP, RMS norms and residuals on the
sequence-sharded rows) parallelized with a ColwiseParallel/RowwiseParallel-style plan trains
like the whole block; bad plans are refused with nothing changed."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl import tp as ctp  # noqa: E402
from conccl.errors import InvalidArgument  # noqa: E402
from conccl.testing import spawn  # noqa: E402

PLAN = {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.o": "rowwise",
        "mlp.gate": "colwise", "mlp.up": "colwise", "mlp.down": "rowwise"}


class _Attention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x):  # x [s, d] (whole) or, parallelized, the rank's rows
        q, k, v = self.q(x), self.k(x), self.v(x)  # [s, local heads * hd]: every row, this rank's heads
        s, heads = q.shape[0], q.shape[1] // self.hd  # local heads from the width, as after a TP plan
        q, k, v = (t.view(s, heads, self.hd).transpose(0, 1) for t in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(a.transpose(0, 1).reshape(s, heads * self.hd))


class _MLP(torch.nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.gate, self.up = torch.nn.Linear(d, f, bias=False), torch.nn.Linear(d, f, bias=False)
        self.down = torch.nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class _Block(torch.nn.Module):
    def __init__(self, d=16, f=32, heads=4):
        super().__init__()
        self.n1, self.n2 = torch.nn.RMSNorm(d), torch.nn.RMSNorm(d)
        self.attn, self.mlp = _Attention(d, heads), _MLP(d, f)

    def forward(self, x):
        h = x + self.attn(self.n1(x))
        return h + self.mlp(self.n2(h))


def _train(comm, steps):
    torch.manual_seed(0)
    w, r = comm.world, comm.rank
    seq, d = 4 * w, 16
    whole, block = _Block(), _Block()
    block.load_state_dict(whole.state_dict())
    xs = [torch.randn(seq, d) for _ in range(steps)]
    opt = torch.optim.SGD(whole.parameters(), lr=0.05)
    ref = []
    for x in xs:
        loss = (whole(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref.append(loss.item())
    ctp.parallelize_module(block, PLAN, comm, schedule="direct-p2", backward_schedule="direct")
    assert type(block.attn.q) is ctp.ColumnParallelLinear and type(block.mlp.down) is ctp.RowParallelLinear
    opt = torch.optim.SGD(block.parameters(), lr=0.05)
    rows = slice(r * seq // w, (r + 1) * seq // w)
    got = []
    for x in xs:
        local = (block(x[rows]) ** 2).sum() / (seq * d)  # this rank's share of the mean
        opt.zero_grad()
        local.backward()
        # the norms' weights are replicated: their gradients are partial sums over the rows
        for p in (*block.n1.parameters(), *block.n2.parameters()):
            comm_all_reduce(comm, p.grad)
        opt.step()
        got.append(local.item())
    part = slice(r * 32 // w, (r + 1) * 32 // w)
    return ref, got, whole.mlp.gate.weight.detach()[part].tolist(), block.mlp.gate.weights[0].detach().tolist()


def comm_all_reduce(comm, t):
    from torch.distributed import ReduceOp

    from conccl.collectives.all_reduce import ALL_REDUCE

    comm.call(ALL_REDUCE, t, t, (ReduceOp.SUM,))


@pytest.mark.parametrize("world", [2, 4])
def test_a_parallelized_llama_block_trains_like_the_whole_block(world):
    results = spawn(world, _train, 3)
    ref = results[0][0]
    total = [sum(res[1][i] for res in results) for i in range(len(ref))]
    assert total == pytest.approx(ref, rel=1e-4, abs=1e-6)
    for _, _, want, got in results:
        assert torch.allclose(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)


def _bad_plans(comm):
    block = _Block()
    before = {k: v.clone() for k, v in block.state_dict().items()}
    errors = []
    for plan in ({"attn.q": "colwise", "attn.zz": "rowwise"}, {"attn.q": "sideways"}, {"n1": "colwise"},
                 {"attn.q": "colwise", "mlp.down": "colwise"}):  # down: 16 outputs, not divisible by 3
        try:
            ctp.parallelize_module(block, plan, comm)
            errors.append(None)
        except InvalidArgument as e:
            errors.append(str(e)[:60])
    biased = torch.nn.Sequential(torch.nn.Linear(6, 6))
    try:
        ctp.parallelize_module(biased, {"0": "colwise"}, comm)
        errors.append(None)
    except InvalidArgument as e:
        errors.append(str(e)[:60])
    unchanged = type(block.attn.q) is torch.nn.Linear and all(
        torch.equal(v, before[k]) for k, v in block.state_dict().items())
    return errors, unchanged


def test_bad_plans_are_refused_and_change_nothing():
    for errors, unchanged in spawn(3, _bad_plans):
        assert None not in errors and unchanged, errors
