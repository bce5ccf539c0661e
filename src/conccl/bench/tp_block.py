"""``conccl bench tp --block``: a sequence-parallel SwiGLU MLP block, forward and backward.

The block of a Llama-style layer under tensor and sequence parallelism (Megatron-LM's): the
input ``[tokens / world, d]`` is gathered and multiplied by the gate and up projections' column
shards, ``silu(gate) * up`` is multiplied by the down projection's row shard and
reduce-scattered back to ``[tokens / world, d]``. Backward mirrors it: the down projection's
input gradient is an all-gather+GEMM, the gate and up projections' a GEMM+reduce-scatter, the
weight gradients GEMMs over the gathered rows. Implementations, each the same math:

- ``compute_only``: every GEMM of the block with no communication (the gathered input a fixed
  tensor, the reduce-scatter a slice): the floor every ratio divides by;
- ``serial_nccl``: ``torch.distributed``'s all-gather and reduce-scatter (NCCL), then or after
  the whole GEMM;
- ``torch_async_tp``: PyTorch's ``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``;
- ``torch_tp_plan``: PyTorch's own tensor-parallel plan of the block, as torchtitan writes it for
  a feed-forward (``PrepareModuleInput`` gathering the sequence-sharded input once,
  ``ColwiseParallel`` gate and up, ``RowwiseParallel`` down reduce-scattered back to the
  sequence shard; DTensor, NCCL, eager: no overlap), the plan ``conccl.tp.parallelize_module``
  stands in for;
- ``conccl_plan``: the same model of plain layers under ``conccl.tp.parallelize_module`` (gate
  and up each gather the rows: the plan has no module that gathers once for both);
- ``conccl``: :class:`conccl.tp.ColumnParallelLinear` and :class:`~conccl.tp.RowParallelLinear`
  (their schedules: ``auto`` and each asked for).

Timing as the op bench (:func:`conccl.bench.timing.timed_in_turn`): implementations in turn, the GPU
asleep while the host queues an iteration (longer than the host needs, measured first), CUDA
events, the slowest rank's median; the host's time per iteration beside it. Checked: each
implementation's output and gradients against serial NCCL's (bit for bit or the largest
difference), and every one against the unsharded block on one GPU (largest difference over
the reference's largest magnitude, within :data:`UNSHARDED_TOL`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .async_tp import world_async_tp
from .timing import every_rank, sleep_cycles_for, slowest, timed_in_turn

DEFAULT_BLOCK = (8192, 4096, 14336)  # tokens (all ranks), d, ffn: Llama-3 8B's MLP
# bf16 block against the unsharded one, as the largest difference over the largest magnitude:
# the sharded sums (a reduce-scatter of world partials) round differently than one GEMM's.
UNSHARDED_TOL = 2e-2


@dataclass(frozen=True)
class BlockRecord:
    tokens: int
    d: int
    ffn: int
    world: int
    impl: str
    schedule: str | None
    ms: float | None
    ms_spread: float | None
    ratio: float | None  # over compute_only
    host_ms: float | None
    bitwise_vs_nccl: bool | None = None
    max_diff_vs_nccl: float | None = None
    rel_diff_vs_unsharded: float | None = None
    error: str | None = None
    resolved: str | None = None  # what "auto" ran: "ag_gemm NAME, gemm_rs NAME" (the block's two shapes)


def auto_picks(ctp, schedule, tokens: int, d: int, fs: int, world: int, dtype, device) -> str | None:
    """What ``schedule`` "auto" runs in the block, whose layers make two shapes of op (forward
    and backward alike): the all-gather+GEMM ``tokens x d x fs`` (column forward, row backward)
    and the GEMM+reduce-scatter ``tokens x fs x d`` (row forward, column backward). None for a
    named schedule."""
    if schedule != "auto":
        return None
    ag = ctp.resolve_schedule("auto", "ag_gemm", tokens, d, fs, world, dtype, device).name
    rs = ctp.resolve_schedule("auto", "gemm_rs", tokens, fs, d, world, dtype, device).name
    return f"ag_gemm {ag}, gemm_rs {rs}"


def _functions(torch):
    class Column(torch.autograd.Function):
        """The column-parallel layer with ``ops`` moving the bytes (as conccl.tp's layer)."""

        @staticmethod
        def forward(ctx, x, ops, *weights):
            gathered, outs = ops.ag_mm(x, [w.t() for w in weights])
            ctx.save_for_backward(gathered, *weights)
            ctx.ops = ops
            return tuple(outs)

        @staticmethod
        def backward(ctx, *grads):
            gathered, *weights = ctx.saved_tensors
            grads = [g.contiguous() for g in grads]
            dy = grads[0] if len(grads) == 1 else torch.cat(grads, dim=-1)
            w = weights[0] if len(weights) == 1 else torch.cat(weights, dim=0)
            return (ctx.ops.mm_rs(dy, w), None, *[g.t() @ gathered for g in grads])

    class Row(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, ops):
            ctx.save_for_backward(x, weight)
            ctx.ops = ops
            return ops.mm_rs(x, weight.t())

        @staticmethod
        def backward(ctx, dy_shard):
            x, weight = ctx.saved_tensors
            dy, (dx,) = ctx.ops.ag_mm(dy_shard.contiguous(), [weight])
            return dx, dy.t() @ x, None

    return Column, Row


class _NcclOps:
    def __init__(self, torch, dist, world):
        self.torch, self.dist, self.world = torch, dist, world

    def ag_mm(self, x, ws):
        full = self.torch.empty((self.world * x.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
        self.dist.all_gather_into_tensor(full, x)
        return full, [full @ w for w in ws]

    def mm_rs(self, x, w):
        out = self.torch.empty((x.shape[0] // self.world, w.shape[1]), dtype=x.dtype, device=x.device)
        self.dist.reduce_scatter_tensor(out, x @ w)
        return out


class _AsyncTPOps:
    def __init__(self, torch, group_name):
        self.torch, self.name = torch, group_name

    def ag_mm(self, x, ws):
        A, outs = self.torch.ops.symm_mem.fused_all_gather_matmul(x, ws, 0, self.name)
        return A, outs

    def mm_rs(self, x, w):
        return self.torch.ops.symm_mem.fused_matmul_reduce_scatter(x, w, "sum", 0, self.name)


class _ComputeOnlyOps:
    """The block's GEMMs with nothing moved: a fixed gathered tensor, the own rows' slice."""

    def __init__(self, torch, rank, world, rows, d, ffn_shard, dtype, device):
        self.rank, self.world = rank, world
        self.full = {n: torch.randn((world * rows, n), dtype=dtype, device=device) for n in (d, ffn_shard)}

    def ag_mm(self, x, ws):
        full = self.full[x.shape[1]]
        return full, [full @ w for w in ws]

    def mm_rs(self, x, w):
        rows = x.shape[0] // self.world
        return (x @ w)[self.rank * rows:(self.rank + 1) * rows]


def _stepping(rank: int, xs, dys, forward, params, local=lambda g: g):
    """(step, params): a step runs ``forward`` on this rank's input rows and backward from its
    output gradient, and returns the output, the input's gradient and each parameter's local
    gradient (``local``), the order every implementation returns them in."""
    def step():
        x = xs[rank].clone().requires_grad_()
        y = forward(x)
        y.backward(dys[rank])
        y = y.wait() if hasattr(y, "wait") else y  # a DTensor plan's AsyncCollectiveTensor: its work ended
        return [y, x.grad] + [local(p.grad) for p in params]
    return step, params


def _mlp(torch, full_w):
    """The block as a model of plain ``nn.Linear`` layers (gate, up: ``[ffn, d]``; down:
    ``[d, ffn]``; the weights ``full_w``), as a model's code has it before a plan shards it."""
    silu = torch.nn.functional.silu

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            dev, dt = full_w[0].device, full_w[0].dtype
            (ffn, d) = full_w[0].shape
            self.gate = torch.nn.Linear(d, ffn, bias=False, device=dev, dtype=dt)
            self.up = torch.nn.Linear(d, ffn, bias=False, device=dev, dtype=dt)
            self.down = torch.nn.Linear(ffn, d, bias=False, device=dev, dtype=dt)
            with torch.no_grad():
                for lin, w in zip((self.gate, self.up, self.down), full_w):
                    lin.weight.copy_(w)

        def forward(self, x):
            return self.down(silu(self.gate(x)) * self.up(x))

    return MLP()


def conccl_plan(torch, rank: int, xs, dys, full_w, schedule: str, group=None):
    """(step, params) of the block as :func:`dtensor_plan`'s model with
    ``conccl.tp.parallelize_module`` in place of PyTorch's plan (``conccl_plan``): gate and up
    column-parallel (each gathers the rows itself: no module gathers once for both), down
    row-parallel, over ``group`` (default: the world)."""
    from .. import tp as ctp

    mlp = _mlp(torch, full_w)
    ctp.parallelize_module(mlp, {"gate": "colwise", "up": "colwise", "down": "rowwise"}, group, schedule=schedule,
                           backward_schedule=schedule)
    return _stepping(rank, xs, dys, mlp, [mlp.gate.weights[0], mlp.up.weights[0], mlp.down.weight])


def dtensor_plan(torch, dist, rank: int, world: int, full_w, xs, dys):
    """(step, params) of the block under PyTorch's tensor-parallel plan (``torch_tp_plan``):
    an MLP of ``full_w`` (gate, up: ``[ffn, d]``; down: ``[d, ffn]``) parallelized over the
    default group, whose step runs this rank's ``xs[rank]`` forward and ``dys[rank]`` backward
    and returns the output, the input's gradient and each weight's local gradient shard (as
    the other implementations, in their order)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   parallelize_module)

    mlp = _mlp(torch, full_w)
    mesh = DeviceMesh.from_group(dist.group.WORLD, full_w[0].device.type)
    parallelize_module(mlp, mesh, PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),)))
    parallelize_module(mlp, mesh, {"gate": ColwiseParallel(), "up": ColwiseParallel(),
                                   "down": RowwiseParallel(output_layouts=Shard(0))})
    return _stepping(rank, xs, dys, mlp, [mlp.gate.weight, mlp.up.weight, mlp.down.weight],
                     local=lambda g: g.to_local())


def run_rank(rank: int, world: int, block=DEFAULT_BLOCK, schedules=("auto",), warmup: int = 3, runs: int = 20,
             dtype: str = "bfloat16", progress=None) -> list:
    """Every implementation of the block on this rank; the records (the same on every rank)."""
    import torch
    import torch.distributed as dist

    from .. import tp as ctp

    tokens, d, ffn = block
    if tokens % world or ffn % world:
        raise ValueError(f"tokens {tokens} and ffn {ffn} must be divisible by the world size {world}")
    rows, fs = tokens // world, ffn // world
    dt, dev = getattr(torch, dtype), torch.device("cuda", torch.cuda.current_device())
    Column, Row = _functions(torch)

    def gen(seed):
        return torch.Generator(device=dev).manual_seed(seed)

    full_w = [torch.randn((n_out, n_in), device=dev, dtype=dt, generator=gen(s)) / n_in ** 0.5
              for s, (n_out, n_in) in enumerate(((ffn, d), (ffn, d), (d, ffn)))]
    xs = [torch.randn((rows, d), device=dev, dtype=dt, generator=gen(100 + r)) for r in range(world)]
    dys = [torch.randn((rows, d), device=dev, dtype=dt, generator=gen(200 + r)) for r in range(world)]
    wg, wu = (w[rank * fs:(rank + 1) * fs].contiguous() for w in full_w[:2])
    wd = full_w[2][:, rank * fs:(rank + 1) * fs].contiguous()

    def plain(ops):
        params = [p.clone().requires_grad_() for p in (wg, wu, wd)]

        def forward(x):
            gate, up = Column.apply(x, ops, params[0], params[1])
            return Row.apply(torch.nn.functional.silu(gate) * up, params[2], ops)
        return _stepping(rank, xs, dys, forward, params)

    def layered(schedule):
        col = ctp.ColumnParallelLinear(d, (ffn, ffn), world_size=world, schedule=schedule, backward_schedule=schedule,
                                       device=dev, dtype=dt)
        row = ctp.RowParallelLinear(ffn, d, world_size=world, schedule=schedule, backward_schedule=schedule,
                                    device=dev, dtype=dt)
        with torch.no_grad():
            col.weights[0].copy_(wg)
            col.weights[1].copy_(wu)
            row.weight.copy_(wd)
        def forward(x):
            gate, up = col(x)
            return row(torch.nn.functional.silu(gate) * up)
        return _stepping(rank, xs, dys, forward, [col.weights[0], col.weights[1], row.weight])

    impls = [("compute_only", None, plain(_ComputeOnlyOps(torch, rank, world, rows, d, fs, dt, dev))),
             ("serial_nccl", None, plain(_NcclOps(torch, dist, world)))]
    async_tp = world_async_tp(torch, dist)
    if async_tp is not None:
        impls.append(("torch_async_tp", None, plain(_AsyncTPOps(torch, async_tp.group_name))))
    try:
        impls.append(("torch_tp_plan", None, dtensor_plan(torch, dist, rank, world, full_w, xs, dys)))
    except Exception as e:  # noqa: BLE001 - no DTensor tensor parallelism here: a record says so
        records_early = [BlockRecord(tokens, d, ffn, world, "torch_tp_plan", None, None, None, None, None,
                                     error=f"{type(e).__name__}: {str(e)[:200]}")]
    else:
        records_early = []
    impls += [("conccl", s, layered(s)) for s in schedules]
    impls += [("conccl_plan", s, conccl_plan(torch, rank, xs, dys, full_w, s)) for s in schedules]

    reference = _unsharded(torch, full_w, xs, dys, rank, rows, fs)
    records, ran = records_early, []
    for impl, schedule, (step, params) in impls:
        try:
            got = [t.detach().clone() for t in step()]
            for p in params:
                p.grad = None
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a case that cannot run is a record, not the end
            records.append(BlockRecord(tokens, d, ffn, world, impl, schedule, None, None, None, None,
                                       error=f"{type(e).__name__}: {str(e)[:200]}"))
            continue
        ran.append((impl, schedule, step, params, got))
    everywhere = set.intersection(*every_rank(dist, world, {(i, s) for i, s, *_ in ran}))
    for impl, schedule, *_ in ran:
        if (impl, schedule) not in everywhere:
            records.append(BlockRecord(tokens, d, ffn, world, impl, schedule, None, None, None, None,
                                       error="failed on another rank"))
    ran = [r for r in ran if (r[0], r[1]) in everywhere]
    # every rank alike (what ran everywhere): each comparison below gathers over the group
    nccl = next((got for impl, _, _, _, got in ran if impl == "serial_nccl"), None)

    def zeroed(step, params):
        def fn():
            step()
            for p in params:
                p.grad = None
        return fn

    fns = [zeroed(step, params) for _, _, step, params, _ in ran]
    host: list = []
    cycles = sleep_cycles_for(torch, fns)
    times = timed_in_turn(torch, fns, warmup, runs, host, sleep_cycles=cycles)
    base = slowest(dist, world, times[0])[0] if ran and ran[0][0] == "compute_only" else None
    for (impl, schedule, _, _, got), ms, queued in zip(ran, times, host):
        med, spread = slowest(dist, world, ms)
        cmp = None if nccl is None or impl in ("compute_only", "serial_nccl") else _compare(torch, got, nccl)
        rel = None if impl == "compute_only" else max(every_rank(dist, world, _relative(torch, got, reference)))
        bitwise = None if cmp is None else all(every_rank(dist, world, cmp[0]))
        diff = None if cmp is None else max(every_rank(dist, world, cmp[1]))
        picks = auto_picks(ctp, schedule, tokens, d, fs, world, dt, dev) if impl.startswith("conccl") else None
        records.append(BlockRecord(tokens, d, ffn, world, impl, schedule, med, spread,
                                   med / base if base else None, slowest(dist, world, queued)[0],
                                   bitwise, diff, rel, resolved=picks))
        if progress is not None and rank == 0:
            progress(records[-1])
    return records


def _compare(torch, got, want) -> tuple[bool, float]:
    same = all(torch.equal(a, b) for a, b in zip(got, want))
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, want))
    return same, diff


def _relative(torch, got, ref) -> float:
    return max(float((a.detach().float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
               for a, b in zip(got, ref))


def _unsharded(torch, full_w, xs, dys, rank, rows, fs):
    """This rank's share of the unsharded block's output and gradients, on one GPU."""
    params = [w.clone().requires_grad_() for w in full_w]
    x = torch.cat(xs).requires_grad_()
    y = (torch.nn.functional.silu(x @ params[0].t()) * (x @ params[1].t())) @ params[2].t()
    y.backward(torch.cat(dys))
    own = slice(rank * rows, (rank + 1) * rows)
    cols = slice(rank * fs, (rank + 1) * fs)
    out = [y[own], x.grad[own], params[0].grad[cols], params[1].grad[cols], params[2].grad[:, cols]]
    return [t.detach().contiguous() for t in out]


def document(meta: dict, records: list, warmup: int, runs: int) -> dict:
    return {"machine_kind": meta.get("machine_kind"), "commit": meta.get("commit"), "torch": meta.get("torch"),
            "meta": meta, "config": {"warmup": warmup, "runs": runs, "unsharded_tol": UNSHARDED_TOL},
            "results": [asdict(r) for r in records]}


def markdown(doc: dict) -> str:
    meta = doc["meta"]
    lines = [f"# conccl bench tp --block ({meta.get('machine_kind')}, {meta.get('device')}, world {meta.get('world')})",
             "", f"{meta.get('date')}, commit {str(doc.get('commit'))[:12]}, torch {doc.get('torch')}. A SwiGLU MLP "
             "block forward+backward; milliseconds: the slowest rank's median of "
             f"{doc['config']['runs']} runs in turn; ratio over compute_only; the largest difference against the "
             f"unsharded block over its largest magnitude (tolerance {doc['config']['unsharded_tol']}).", "",
             "| tokens x d x ffn | impl | schedule | ms | spread | x compute | host ms | = NCCL bits | max diff vs NCCL "
             "| vs unsharded |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc["results"]:
        shape = f"{r['tokens']}x{r['d']}x{r['ffn']}"
        if r["error"]:
            lines.append(f"| {shape} | {r['impl']} | {r['schedule'] or ''} | error: {r['error'][:80]} | | | | | | |")
            continue

        def f(v, spec):
            return "" if v is None else format(v, spec)
        schedule = (r["schedule"] or "") + (f" ({r['resolved']})" if r.get("resolved") else "")
        lines.append(f"| {shape} | {r['impl']} | {schedule} | {r['ms']:.3f} | {100 * r['ms_spread']:.1f}% "
                     f"| {f(r['ratio'], '.3f')} | {f(r['host_ms'], '.2f')} | "
                     f"{'' if r['bitwise_vs_nccl'] is None else ('yes' if r['bitwise_vs_nccl'] else 'no')} | "
                     f"{f(r['max_diff_vs_nccl'], '.3g')} | {f(r['rel_diff_vs_unsharded'], '.3g')} |")
    return "\n".join(lines) + "\n"
