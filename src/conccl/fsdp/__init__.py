"""FSDP2 on copy engines: ``conccl.fsdp.enable(model)``.

    model = ...                      # every block wrapped with fully_shard, then the root
    comms = conccl.fsdp.enable(model)
    ...                              # train as before: forward, backward, optimizer step
    print(comms.memory())            # bytes conccl holds for FSDP's collectives

``enable`` installs conccl's all-gather and reduce-scatter on every FSDP module through
FSDP2's public hooks (``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``,
PyTorch >= 2.10). FSDP keeps its own copy-in and copy-out around the collectives; on one host
the collectives themselves move every byte on copy engines (no SM), and the reduce-scatter's
reduction is one kernel (at most half the SMs' worth of CTAs).

Buffers. FSDP asks the hook to allocate each collective's buffers. They come from PyTorch's
symmetric-memory pool (``torch.distributed._symmetric_memory.get_mem_pool``): the caching
allocator's stream-ordered reuse, with every block mapped by the peers. FSDP allocates the
same sizes in the same order on every rank, so after the first step every buffer is a block
already mapped: no rendezvous per step, and the pool holds at most what FSDP has in flight
at once. Peers push straight into an all-gather output held there (no staging copy); every
call checks that the ranks name the same block (a pool that handed blocks out in another
order on one rank makes that call stage instead of writing into the wrong buffer). Where
the pool is not available, buffers come from the caching allocator and conccl stages
through its workspace (correct, one local copy slower).

HSDP (``fully_shard(..., mesh=mesh_2d)``, replicate across hosts, shard within a host): FSDP
all-gathers and reduce-scatters over the shard dimension's process group, one host's ranks,
and conccl serves that group as any other; FSDP's all-reduce of the reduced shards over the
replicate dimension is its own ``torch.distributed.all_reduce`` (NCCL), which ``enable`` leaves
alone.

Full sharding across hosts (one FSDP group over the ranks of several hosts): the group is
conccl's :class:`~conccl.group.hierarchical.HierarchicalGroup` and the hooks call its blocking
collectives: copy engines within each host, the group's backend (NCCL) between hosts (see
:mod:`conccl.group.hierarchical` for what moves where and the order of summation). Buffers
there are plain caching-allocator blocks (:class:`SpanningBuffers`); ``direct=True`` serves
groups of one host only: such a group's modules keep FSDP's copies, with one warning.

What conccl cannot serve (a layout of hosts it refuses, GPUs without peer access, no CUDA)
keeps its process group's collectives (NCCL), with one warning.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed import _symmetric_memory as symm_mem

from .. import api
from . import copy_free, prefetch
from ..collectives.all_gather import ALL_GATHER
from ..collectives.reduce_scatter import REDUCE_SCATTER
from ..errors import InvalidArgument, UnsupportedGroup
from ..group.hierarchical import HierarchicalGroup

try:  # FSDP2's hook interfaces (PyTorch >= 2.10)
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
except ImportError:  # pragma: no cover - older PyTorch: enable() says so
    FSDPModule, AllGather, ReduceScatter = None, object, object


class SymmetricPool:
    """Peer-mapped buffers for one group's FSDP collectives, reused across steps.

    ``allocate`` is a collective call in the sense FSDP already guarantees: every rank asks
    for the same sizes in the same order. A block the pool hands out for the first time is
    mapped by the peers (one symmetric-memory rendezvous); a block it hands out again is
    already mapped (PyTorch caches the rendezvous per block, and so does the group)."""

    def __init__(self, group, device: torch.device):
        self.group = group  # conccl's Group
        self.device = device
        self.mapped: dict[int, int] = {}  # block address -> bytes, every block the peers map
        try:
            self._pool = symm_mem.get_mem_pool(device)
        except (AttributeError, RuntimeError, NotImplementedError) as e:
            self._pool, self.unavailable = None, f"{type(e).__name__}: {e}"
        else:
            self.unavailable = None

    def allocate(self, size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if self._pool is None:
            return torch.empty(*size, dtype=dtype, device=device)
        with torch.cuda.use_mem_pool(self._pool):
            t = torch.empty(*size, dtype=dtype, device=device)
        storage = t.untyped_storage()
        # rendezvous returns PyTorch's cached handle for a block it has mapped (no exchange).
        handle = symm_mem.rendezvous(t, self.group.name)
        if self.mapped.get(storage.data_ptr()) != storage.nbytes() or self.group.executor.peer_view(t) is None:
            self.group.executor.symmetric.add(t, handle)
            self.mapped[storage.data_ptr()] = storage.nbytes()
        return t

    def bytes(self) -> int:
        """Bytes of pool blocks the peers have mapped (an upper bound of what the pool holds)."""
        return sum(self.mapped.values())

    def workspace_bytes(self) -> int:
        return self.group.executor.workspace_bytes


class SpanningBuffers:
    """The buffers of a group over several hosts (a :class:`HierarchicalGroup`): plain blocks
    of the caching allocator. Its all-gather writes each host's block of the output through
    the node-local group's staged parts path and its reduce-scatter reduces through a
    temporary, so no buffer gains from being peer-mapped; nothing is held beyond the
    node-local group's workspace."""

    unavailable = "the group spans hosts: plain buffers"

    def __init__(self, group):
        self.group = group  # conccl's HierarchicalGroup

    def allocate(self, size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def bytes(self) -> int:
        return 0

    def workspace_bytes(self) -> int:
        return self.group.node.executor.workspace_bytes


def _buffers_for(g):
    """The pool serving conccl group ``g``'s FSDP collectives."""
    if isinstance(g, HierarchicalGroup):
        return SpanningBuffers(g)
    ex = g.executor  # the copy-engine executor has its device; the CPU reference executor a type
    return SymmetricPool(g, getattr(ex, "device", None) or torch.device(ex.device_type))


class CopyEngineAllGather(AllGather):
    """FSDP2's all-gather hook: ``conccl.all_gather_into_tensor`` into a pool buffer (on a
    group over several hosts, the hierarchical all-gather into a plain one)."""

    def __init__(self, pool: SymmetricPool):
        self.pool = pool

    def allocate(self, size, *, dtype, device):
        return self.pool.allocate(size, dtype, device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        # Always ordered on FSDP's all-gather stream, returning None: FSDP waits only on a
        # torch.distributed Work and treats any other return as an async call (it would then
        # free the output at once and skip overlapping its copy-out with the next gather).
        # The group's call, not the public function: never routed to NCCL by the eager path.
        api.get_group(group).call(ALL_GATHER, output_tensor, input_tensor)
        return None


class CopyEngineReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter hook: ``conccl.reduce_scatter_tensor`` (SUM, AVG, PREMUL_SUM;
    hierarchical on a group over several hosts)."""

    def __init__(self, pool: SymmetricPool):
        self.pool = pool

    def allocate(self, size, *, dtype, device):
        # The input is pushed to peers from where it is; only the all-gather output gains from
        # being peer-mapped. Plain blocks keep the pool to what peers must reach.
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        # Ordered on FSDP's reduce-scatter stream (see CopyEngineAllGather.__call__).
        api.get_group(group).call(REDUCE_SCATTER, output_tensor, input_tensor, (op,))
        return None


@dataclass
class FsdpComms:
    """What :func:`enable` installed: the FSDP modules served, the pools, the fallbacks."""

    modules: list = field(default_factory=list)  # FSDP modules on conccl
    fallback: list = field(default_factory=list)  # (module name, why) left on NCCL
    pools: dict = field(default_factory=dict)  # process-group name -> SymmetricPool
    fsdp_modules: list = field(default_factory=list, repr=False)  # every FSDP module enable found
    # which module's forward begins first, and the gather issued for it: made at the first
    # step_and_prefetch (a model never stepped so runs no hook of it)
    forward_order: prefetch.ForwardOrder | None = None

    def step_and_prefetch(self, optimizer: torch.optim.Optimizer) -> bool:
        """``optimizer.step()`` with the next forward's first all-gather beside it: the update
        of the module whose forward began first (the root where it holds parameters, else the
        first block), then that module's gather on FSDP's all-gather stream (copy engines), then
        the update of every other parameter on the SMs meanwhile. Call it where
        ``optimizer.step()`` was, after any gradient clipping; FSDP's pre-forward of that module
        waits for the gather. The first call is one plain step (it installs the forward
        pre-hooks that find the first module; :mod:`conccl.fsdp.prefetch`).

        Same bits as ``optimizer.step()`` for an optimizer that updates each parameter alone
        (SGD, Adam, AdamW): it runs twice, each time over a part of every parameter group, so
        step hooks run twice and see part of the parameters; not for an optimizer that reads
        every parameter at once, a closure, a ``torch.compile``'d step or a GradScaler's step.
        Where the first module's parameters change before the next forward (another step,
        ``load_state_dict``, in place through autograd's view of them; alike on every rank) the
        gather is dropped and the forward gathers again; a write through ``.data`` is not seen.
        Where another optimizer steps some of that module's parameters, one plain step. Returns
        whether the gather was issued. Stream semantics: the update runs on the current stream; the gather
        on FSDP's all-gather stream, after the first part only. Memory: that module's
        unsharded parameters are held from the step on instead of from the forward on."""
        if self.forward_order is None:
            self.forward_order = prefetch.ForwardOrder(self.fsdp_modules)
        return prefetch.step_and_prefetch(optimizer, self.forward_order)

    def memory(self) -> dict:
        """Bytes conccl holds for FSDP beyond PyTorch's caching allocator's own statistics:
        each group's workspace and the peer-mapped pool blocks."""
        out = {}
        for name, pool in self.pools.items():
            out[name] = {"pool_bytes": pool.bytes(), "workspace_bytes": pool.workspace_bytes(),
                         "pool": "symmetric" if pool.unavailable is None else f"unavailable ({pool.unavailable})"}
        return out


def _shard_group(module):
    """The process group FSDP shards ``module``'s parameters over (None: no parameters)."""
    state = module._get_fsdp_state()
    pg = state._fsdp_param_group
    return None if pg is None else pg.mesh_info.shard_process_group


def enable(module: torch.nn.Module, *, all_gather: bool = True, reduce_scatter: bool = True,
           direct: bool = False, shard_home: bool = True, cast_once: bool = True) -> FsdpComms:
    """Run the all-gathers and reduce-scatters of every FSDP2 module in ``module`` on copy engines.

    Args:
        module: a module tree already wrapped by ``torch.distributed.fsdp.fully_shard`` (the
            root or any FSDP module; every FSDP module below it is served).
        all_gather, reduce_scatter: which of the two to move (default both).
        direct: FSDP's copies around the collectives are skipped: each module's shards live
            in one peer-readable buffer the peers gather from (no copy-in), the all-gather
            fills each parameter's unsharded tensor straight from the peers (no copy-out), the
            reduce-scatter reads each gradient where autograd left it (no copy-in). See
            :mod:`conccl.fsdp.copy_free`: it wraps four FSDP2 internals where this PyTorch has
            the versions it was written against and ``module``'s FSDP2 objects every field
            it touches; elsewhere one warning, and the plain hooks. Under FSDP2's mixed
            precision (``param_dtype=torch.bfloat16, reduce_dtype=torch.float32``) each gather
            in forward first casts the shards into a per-module *cast home* (the one copy
            left: FSDP's cast; the backward's gather reads it, ``cast_once``) and the bf16
            gradients are summed into fp32 where they lie. Same bits as
            stock FSDP2 at world 2 (2 x H200; tests/gpu/test_gpu_fsdp.py); with more
            ranks the sum runs in rank order, within fp32 rounding of NCCL's. Memory: the homes
            (or cast homes: half an fp32 shard each) are peer-mapped; unsharded parameters
            live in two stream-ordered pools per call of ``enable``. SMs: the reduce-scatter's
            sum kernel (at most half the SMs); the gather uses none, the cast one copy kernel.
        shard_home: with ``direct``, each module's sharded parameters move now into one
            peer-readable buffer (FSDP's all-gather input, so no copy-in runs). Tensors taken
            from the parameters before (a state dict) keep the old memory and go stale; a
            ``torch.compile``'d optimizer step fails on parameters that share one buffer
            (PyTorch 2.13): pass False to keep FSDP's all-gather copy-in instead.
        cast_once: with ``direct`` under mixed precision, a module's gather in backward reads
            the cast its forward's gather made (the parameters do not change in between) instead
            of casting the shards again as FSDP does: one cast kernel a module a step instead of
            two, same bits. A cast is read once, only inside a backward pass, of the same shard
            tensors at the same versions (a write through ``.data`` between a module's forward
            and its backward is not seen); pass False to cast at every gather.

    Returns an :class:`FsdpComms` naming the modules served and those left on NCCL.
    A collective call: every rank of the FSDP groups calls it, on the same modules.

    Raises :class:`conccl.InvalidArgument` where no module in ``module`` was wrapped by
    ``fully_shard`` (or PyTorch has no FSDP2 hooks). A group conccl cannot serve (unequal
    ranks per host, no peer access, no CUDA) keeps NCCL, with one warning naming why. A group
    over several hosts runs the hierarchical collectives (``direct`` not: one warning); HSDP's
    replicate all-reduce stays FSDP's own.

    SMs used: none for the copies; the reduce-scatter's reduction one kernel of at most half
    the GPU's SMs' worth of CTAs. Memory: the group's workspace (the largest reduce-scatter input, staged all-gather
    inputs) plus the pool's blocks (:meth:`FsdpComms.memory`).
    """
    if FSDPModule is None:
        raise InvalidArgument(f"conccl.fsdp needs FSDP2's custom collective hooks (PyTorch >= 2.10); "
                              f"this is PyTorch {torch.__version__}")
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgument(f"conccl.fsdp.enable expects a torch.nn.Module, got {type(module).__name__}")
    fsdp = [(n, m) for n, m in module.named_modules() if isinstance(m, FSDPModule)]
    if not fsdp:
        raise InvalidArgument(
            f"{type(module).__name__} has no module wrapped by torch.distributed.fsdp.fully_shard; call "
            "fully_shard on its blocks and on the root first, then conccl.fsdp.enable")
    comms, refused, shared, spanning = FsdpComms(), {}, {}, set()
    reuse = copy_free.reuse.Pools()  # the unsharded parameters' two pools (direct=True), freed with the model
    if direct and (all_gather or reduce_scatter):
        why = copy_free.install(module)
        if why is not None:
            warnings.warn(f"conccl.fsdp: direct=True unavailable ({why}); FSDP keeps its copies", stacklevel=2)
            direct = False
    for name, m in fsdp:
        pg = _shard_group(m)
        if pg is None:
            continue  # no parameters of its own: nothing to gather or reduce
        key = pg.group_name
        if key in refused:
            comms.fallback.append((name or "<root>", refused[key]))
            continue
        pool = comms.pools.get(key)
        if pool is None:
            try:
                g = api.get_group(pg)
            except (UnsupportedGroup, InvalidArgument) as e:
                refused[key] = str(e)
                comms.fallback.append((name or "<root>", str(e)))
                backend = dist.get_backend(pg)
                warnings.warn(f"conccl.fsdp: FSDP group {key!r} keeps its {backend} collectives: {e}", stacklevel=2)
                continue
            if isinstance(g, HierarchicalGroup) and direct:
                spanning.add(key)
                warnings.warn(f"conccl.fsdp: FSDP group {key!r} spans {g.layout}: direct=True serves groups of one host "
                              "only; its modules run the hierarchical collectives with FSDP's copies", stacklevel=2)
            pool = comms.pools[key] = _buffers_for(g)
        plain = not direct or key in spanning  # a group over several hosts: the hooks only
        if all_gather and not plain:
            # fully_shard([a, b]) gives a and b one parameter group: one hook, one home for it
            param_group = m._get_fsdp_state()._fsdp_param_group
            gather = shared.get(id(param_group))
            if gather is None:
                # modules alternate between two memory pools in the order of their first gathers
                gather = copy_free.DirectAllGather(pool, homes=shard_home, reuse=reuse, cast_once=cast_once)
                shared[id(param_group)] = gather
                copy_free.move_home(gather, param_group.fsdp_params, pg.size())
            m.set_custom_all_gather(gather)
        elif all_gather:
            m.set_custom_all_gather(CopyEngineAllGather(pool))
        if reduce_scatter:
            m.set_custom_reduce_scatter(CopyEngineReduceScatter(pool) if plain else copy_free.DirectReduceScatter(pool))
        comms.modules.append(name or "<root>")
    comms.fsdp_modules = [m for _, m in fsdp]
    return comms

