"""CPU multi-process tier: FSDP2 without its copies (``conccl.fsdp.copy_free``): the all-gather
filling each parameter's unsharded tensor itself (copy-out skipped) and the reduce-scatter
reading the gradients where they are (copy-in skipped), against stock FSDP2, on gloo.

The wraps of FSDP2's internals are what runs here; the filling and the reducing are done with
torch.distributed from the parts the hooks are handed (the copy-engine versions,
``Group.all_gather_into_parts`` and ``Group.reduce_scatter_from_parts``, are checked against
the flat calls in tests/multiproc/test_group_parts.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from conccl import fsdp
from conccl.fsdp import copy_free as fsdp_direct  # noqa: E402

pytestmark = pytest.mark.skipif(fsdp_direct.supported() is not None, reason=str(fsdp_direct.supported()))


def _gloo_gather(output, input, group, parts):
    """The reference filling: the flat all-gather, then every part's rows (output None: the
    input is the module's home, no flat output was made)."""
    if output is None:
        output = torch.empty(group.size() * input.numel(), dtype=input.dtype)
    dist.all_gather_into_tensor(output, input, group=group)
    if parts is None:
        return
    world, off = group.size(), 0
    flat = output.view(world, -1)
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(tuple(parts)):
        for t in parts:
            n = t.numel() // world
            t.view(world, n).copy_(flat[:, off:off + n])
            off += n


def _gloo_reduce(output, grads, rows, group, op):
    """The reference reducing: the packed input built from the parts (zero padding, as FSDP's
    copy-in pads), then the flat reduce-scatter."""
    world = group.size()
    flat = torch.zeros(world, sum(rows), dtype=output.dtype)
    off = 0
    for g, n in zip(grads, rows):
        assert g.numel() <= world * n, (g.shape, n)
        part = torch.zeros(world * n, dtype=g.dtype)
        part[:g.numel()] = g.reshape(-1)
        flat[:, off:off + n] = part.view(world, n)
        off += n
    dist.reduce_scatter_tensor(output, flat.view(-1), op=op, group=group)


def _gloo_flat(output, input, group, op):
    dist.reduce_scatter_tensor(output, input, op=op, group=group)


def _train(rank, world, direct: bool, param_dtype, reduce_dtype, schedule="default"):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    dims = [(13, 37), (37, 21), (21, 7)]  # sizes no world divides: FSDP pads the shards
    if schedule == "empty":  # a weight of one row: every rank but the first holds an empty shard
        dims = [(13, 1), (1, 21), (21, 7)]
    meta = schedule == "meta" and rank > 0  # rank 0 builds the model; the others load it from rank 0
    with torch.device("meta" if meta else "cpu"):
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.Tanh()) for a, b in dims])
    if schedule == "bf16_params":  # bf16 parameters and gradients reduced in fp32: widened, no cast home
        model = model.to(torch.bfloat16)
    full = {k: v.detach().clone() for k, v in model.state_dict().items()} if rank == 0 else {}
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    calls = []  # forwards of each block's Linear: twice a step where checkpointing recomputes them
    if schedule == "checkpoint":  # activation checkpointing: each block's forward recomputed in backward
        from torch.distributed._composable import checkpoint

        for block in model:
            checkpoint(block)
            block[0].register_forward_hook(lambda *_: calls.append(1))
    for block in model:
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=not schedule.startswith("no_reshard"))
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    if schedule == "compile":  # compiled blocks (FSDP2's hooks stay eager: dynamo skips them)
        from torch import _dynamo
        from torch._dynamo.utils import counters

        _dynamo.reset()  # process-wide caches and counts: this run compiles its own frames
        counters.clear()
        for block in model:
            block.compile(backend="aot_eager")
    if schedule == "hook":  # a user's hook on every reduced gradient: it sees the whole output
        for block in model:
            block.set_all_reduce_hook(lambda t: t.mul_(1.0))
    if schedule == "prefetch":  # explicit prefetching: each block's gather issued one block early
        blocks = list(model)
        for a, b in zip(blocks, blocks[1:]):
            a.set_modules_to_forward_prefetch([b])
            b.set_modules_to_backward_prefetch([a])
    comms = []
    if direct:
        assert fsdp_direct.supported(model) is None  # as conccl.fsdp.enable checks the module
        for m in model.modules():
            if hasattr(m, "set_custom_all_gather") and m._get_fsdp_state()._fsdp_param_group is not None:
                comms.append((m, fsdp_direct.DirectAllGather(gather=_gloo_gather)))
                m.set_custom_all_gather(comms[-1][1])
                m.set_custom_reduce_scatter(fsdp_direct.DirectReduceScatter(reduce=_gloo_reduce, flat=_gloo_flat))
                # as conccl.fsdp.enable does: the shards move home now, before any state is taken
                fsdp_direct.move_home(comms[-1][1], m._get_fsdp_state()._fsdp_param_group.fsdp_params, world)
    made = [c.home is not None for _, c in comms]  # homes made at enable: alike on every rank
    if schedule == "meta":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if meta:
            model.to_empty(device="cpu")
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    # views of the parameters: they must stay the live ones (on a rank that loaded into meta
    # parameters, the shards move home at the first gather: taken after it)
    saved = model.state_dict() if schedule != "meta" else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=schedule.endswith("fused") or None)
    if schedule.endswith("groups"):  # two parameter groups: the weights and the biases, other rates
        params = list(model.parameters())
        opt = torch.optim.AdamW([{"params": params[0::2]}, {"params": params[1::2], "lr": 3e-2}], lr=1e-2)
    others = None  # a second optimizer (fused: its update moves no version counter) over the biases
    if schedule.endswith("two_opts"):
        params = list(model.parameters())
        opt, others = torch.optim.AdamW(params[0::2], lr=1e-2), torch.optim.AdamW(params[1::2], lr=1e-2, fused=True)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    losses = []
    # as conccl.fsdp.enable returns it: its step_and_prefetch installs the hooks at its first call
    stepper = fsdp.FsdpComms(fsdp_modules=list(model.modules())) if schedule.startswith("step_prefetch") and direct \
        else None
    prefetched = []
    for _ in range(3):
        x = torch.randn(8, 13, generator=g)
        if schedule == "bf16_params":
            x = x.to(torch.bfloat16)
        if schedule == "unshard":  # the user gathers every block ahead, asynchronously, then waits
            for handle in [block.unshard(async_op=True) for block in model]:
                handle.wait()
        loss = model(x).float().square().mean()
        if schedule == "poke":  # the last block's weight changed in place between forward and backward
            with torch.no_grad():  # (a change its backward sees: the input's gradient reads it)
                model[-1][0].weight.add_(0.01)
        loss.backward()
        if schedule == "clip":  # the reduced gradients' norm over every rank's shards, then scaled
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)
        for _ in range(2 if schedule.endswith("twice") else 1):
            if stepper is not None:  # the first block's update, its gather for the next forward, the rest
                prefetched.append(stepper.step_and_prefetch(opt))
            else:  # stock's the plain step: the split one must give its bits
                opt.step()
        if others is not None:
            others.step()
        if schedule.endswith("stale"):  # the first block changed after the step: its gather is stale
            with torch.no_grad():
                model[0][0].weight.mul_(0.5)
        opt.zero_grad()
        losses.append(loss.item())
        saved = saved if saved is not None else model.state_dict()
    if schedule == "checkpoint":
        assert len(calls) == 3 * 3 * 2, len(calls)  # 3 blocks, 3 steps, forward and recompute
    if stepper is not None:
        order = stepper.forward_order
        # the first call installs the hooks (a plain step); a second call with no forward since
        # drops the first's gather and finds no module (plain); no gather where another
        # optimizer steps some of the block's parameters
        want = {"step_prefetch_twice": [False, False, True, False, True, False],
                "step_prefetch_two_opts": [False] * 3}.get(schedule, [False, True, True])
        assert prefetched == want, prefetched
        # a stale gather dropped before the forward after it (the last step's has none after it)
        assert order.dropped == {"step_prefetch_stale": 1, "step_prefetch_twice": 2}.get(schedule, 0), order.dropped
    if schedule == "compile":
        assert counters["frames"]["ok"] >= 1, dict(counters["frames"])  # the blocks' forwards compiled
    # where every parameter's shard lives after training: in its module's home (nothing else
    # holding the old storage: FSDP's padded shard a view of the home itself), or not
    homed = [c.home is not None and all(
        c.home.holds(p, off) and p._sharded_param_data._base is c.home.buf
        and p.sharded_param._local_tensor.untyped_storage().data_ptr() == c.home.buf.untyped_storage().data_ptr()
        for p, off in zip(m._get_fsdp_state()._fsdp_param_group.fsdp_params, c.home.offsets)) for m, c in comms]
    current = all(torch.equal(saved[k].to_local(), v.to_local()) for k, v in model.state_dict().items())
    return (losses, [p.to_local().detach().clone() for p in model.parameters()],
            (homed if current else ["stale state dict"]) + made)


def _counts():
    c = fsdp_direct.COUNTS
    return (c.skipped_copy_outs, c.declined_gathers, c.skipped_copy_ins, c.declined_reduces, c.skipped_gather_copy_ins,
            c.cast_gathers, c.reused_casts)


def _worker(rank, world, port, param_dtype, reduce_dtype, schedule, queue):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        assert fsdp_direct.install() is None
        c0 = _counts()
        stock = _train(rank, world, False, param_dtype, reduce_dtype, schedule)
        c1 = _counts()
        direct = _train(rank, world, True, param_dtype, reduce_dtype, schedule)
        c2 = _counts()
        same = [torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(stock[1], direct[1])]
        queue.put((rank, stock[0], direct[0], same, [b - a for a, b in zip(c0, c1)], [b - a for a, b in zip(c1, c2)],
                   direct[2]))
    finally:
        dist.destroy_process_group()


def _run(world, param_dtype, reduce_dtype, schedule="default"):
    from conccl.launch import free_port

    ctx = mp.get_context("fork")  # inherits torch's imports (spawn: ~3 s a rank); the CPU tiers run before CUDA
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, param_dtype, reduce_dtype, schedule, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    for rank, stock_losses, direct_losses, same, stock_counts, counts, homed in results:
        assert direct_losses == stock_losses, (rank, stock_losses, direct_losses)
        assert all(same), (rank, same)
        assert stock_counts == [0] * 7  # stock FSDP's collectives are left alone
        # without a dtype cast before the gather, every module's shards live in its home (after
        # training); with one, each module has a cast home the shards are cast into, made at enable
        # (a param_dtype equal to the parameters' is no cast: FSDP clears it)
        assert homed == [param_dtype in (None, torch.float32)] * 3 + [True] * 3, homed
    counts = [r[-2] for r in results]
    assert all(c == counts[0] for c in counts), counts  # every rank took the same paths
    return counts


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("param_dtype,reduce_dtype", [(None, torch.float32), (torch.bfloat16, torch.float32),
                                                      (torch.bfloat16, torch.bfloat16)])
def test_direct_trains_bit_for_bit_like_stock_and_skips_every_copy(world, param_dtype, reduce_dtype):
    # forward and backward unshard each of the 3 blocks once a step, and backward reduces each
    # once a step (the root has no parameters): 3 steps. No copy of FSDP's runs in any: a bf16
    # gradient reduced in fp32 is summed into fp32 from where it lies; with a dtype cast before
    # the gather, the shards are cast into the module's cast home (no flat buffer), else none
    # is copied at all; and the backward's gathers read the cast their forward made.
    cast = 0 if param_dtype is None else 3 * 3
    for counts in _run(world, param_dtype, reduce_dtype):
        assert counts == [3 * 3 * 2, 0, 3 * 3, 0, 3 * 3 * 2 - 2 * cast, cast, cast], counts


@pytest.mark.parametrize("schedule,gathers,copy_ins", [("no_reshard", 3 * 3, 3 * 3), ("prefetch", 3 * 3 * 2, 3 * 3),
                                                        ("hook", 3 * 3 * 2, 0), ("unshard", 3 * 3 * 2, 3 * 3),
                                                        ("empty", 3 * 3 * 2, 3 * 3), ("meta", 3 * 3 * 2, 3 * 3),
                                                        ("bf16_params", 3 * 3 * 2, 3 * 3)])
def test_direct_under_other_fsdp_schedules(schedule, gathers, copy_ins):
    """reshard_after_forward=False (no backward re-gather: the parameters filled in forward stay),
    explicit forward/backward prefetching (gathers issued a block early), an all-reduce hook
    (it reads the whole reduced output, padding included: FSDP's copy-in is kept), the user's
    own asynchronous unshard of every block before forward, empty shards, a model built on
    meta on every rank but rank 0 and loaded from it after ``enable``, and bf16 parameters whose
    gradients are reduced in fp32 (summed into fp32 where they lie; the shards at home)."""
    for counts in _run(2, None, torch.float32, schedule):
        assert counts == [gathers, 0, copy_ins, 3 * 3 - copy_ins, gathers, 0, 0], counts


@pytest.mark.parametrize("schedule", ["checkpoint", "clip", "compile"])
def test_direct_with_mixed_precision_under_checkpointing_clipping_and_compiled_blocks(schedule):
    """FSDP2's usual policy (fp32 parameters, bf16 compute, fp32 reduce) with activation
    checkpointing, gradient clipping (a norm over the reduced shards) or compiled blocks:
    every forward's gather a cast into the cast home, every backward's reading that cast (a
    checkpointed block's recompute included), every reduction from the gradients where they
    lie, the same bits as stock FSDP2."""
    for counts in _run(2, torch.bfloat16, torch.float32, schedule):
        assert counts == [3 * 3 * 2, 0, 3 * 3, 0, 0, 3 * 3, 3 * 3], counts


@pytest.mark.parametrize("param_dtype,schedule", [(None, "step_prefetch"), (torch.bfloat16, "step_prefetch"),
                                                   (torch.bfloat16, "step_prefetch_fused"),
                                                   (None, "step_prefetch_groups")])
# (3 steps: the first plain, the other two each issue a gather; the last one's never read)
def test_step_and_prefetch_gives_the_plain_steps_bits(param_dtype, schedule):
    """The optimizer's update split in two around the next forward's first gather (the first
    block's parameters, its gather, the rest): the same bits as stock FSDP2 with one plain
    ``opt.step()``, with a fused AdamW (whose update moves no version counter: the next forward
    casts again all the same) and with two parameter groups; each step issues the gather (the
    last one's never read), and the forward finds it done instead of gathering again."""
    # 3 * 3 * 2 + 1 gathers: without a cast all from the homes; with one, the forward's and the
    # prefetched ones cast, the backward's read the forward's cast
    want = [3 * 3 * 2 + 1, 0, 0] if param_dtype is None else [0, 3 * 3 + 1, 3 * 3]
    for counts in _run(2, param_dtype, torch.float32, schedule):
        assert counts == [3 * 3 * 2, 0, 3 * 3, 0] + want, counts


def test_step_and_prefetch_drops_a_gather_the_weights_changed_after():
    """The first block's weight written after the step (as an EMA swap or a load would): its
    prefetched gather is dropped before the forward, which gathers again, and the bits are
    stock's, which gathers after the write."""
    for counts in _run(2, torch.bfloat16, torch.float32, "step_prefetch_stale"):
        # 1 dropped gather (cast, waited for: a copy-out, then resharded) besides the 3 * 3 + 1
        # as above
        assert counts == [3 * 3 * 2 + 1, 0, 3 * 3, 0, 0, 3 * 3 + 1 + 1, 3 * 3], counts


def test_step_and_prefetch_twice_drops_the_first_gather_and_never_splits_anothers_update():
    """Two steps with no forward between (the second drops the first's gather: the weights it
    read are stale) and a second, fused optimizer stepping the biases after (the gather would
    read them before that update and no version counter would tell: no gather is issued); the
    same bits as stock FSDP2 stepping alike."""
    for counts in _run(2, torch.bfloat16, torch.float32, "step_prefetch_twice"):
        assert counts == [3 * 3 * 2 + 2, 0, 3 * 3, 0, 0, 3 * 3 + 2, 3 * 3], counts
    for counts in _run(2, torch.bfloat16, torch.float32, "step_prefetch_two_opts"):
        assert counts == [3 * 3 * 2, 0, 3 * 3, 0, 0, 3 * 3, 3 * 3], counts


def test_direct_casts_at_every_forward_after_a_fused_step():
    """Blocks not resharded after forward (no gather in backward) under a fused AdamW, whose
    update moves no version counter: every forward's gather casts again (a cast is read again
    only inside a backward pass), the same bits as stock FSDP2."""
    for counts in _run(2, torch.bfloat16, torch.float32, "no_reshard_fused"):
        assert counts == [3 * 3, 0, 3 * 3, 0, 0, 3 * 3, 0], counts


def test_direct_casts_again_in_backward_what_changed_since_forward():
    """A shard written in place between its module's forward and backward (here the last
    block's weight, every step): that module's backward gather casts it again, as FSDP's does,
    and the others read their forward's cast: the same bits as stock FSDP2, which gathers the
    changed weight in backward."""
    for counts in _run(2, torch.bfloat16, torch.float32, "poke"):
        assert counts == [3 * 3 * 2, 0, 3 * 3, 0, 0, 3 * 3 + 3, 3 * 3 - 3], counts
