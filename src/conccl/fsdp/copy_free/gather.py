"""The all-gather half of FSDP2 without its copies (see :mod:`conccl.fsdp.copy_free`): each
module's shards live in one peer-readable home (:class:`_Home`), and the gather fills each
parameter's unsharded tensor from every rank's home, with no copy-in and no copy-out."""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

from ... import api
from ...collectives.all_gather import ALL_GATHER
from ._state import COUNTS, ShardedState, _fsdp_collectives, shard_versions
from .reuse import allocating, pooled

GATHER_ARGS = ("fsdp_params", "group", "async_op", "all_gather_copy_in_stream", "all_gather_stream", "device",
               "all_gather_comm")
COPY_OUT_ARGS = ("all_gather_result", "fsdp_params", "group")
_DIRECT = "_conccl_direct"  # set on a flat all-gather output whose gather filled the parameters


def _gather(*args, **kwargs):
    comm = kwargs.get("all_gather_comm", args[6] if len(args) > 6 else None)
    if not isinstance(comm, DirectAllGather):
        return _fsdp_collectives.foreach_all_gather(*args, **kwargs)
    call = dict(zip(GATHER_ARGS, args), **kwargs)
    if comm.homes:
        with _fsdp_collectives._get_device_handle(call["device"].type).stream(call["all_gather_copy_in_stream"]):
            home = comm.home_for(call["fsdp_params"], call["group"].size())  # allocated where first written
        if home is not None:
            return _gather_from_home(comm, home, call)
    comm.pending = call["fsdp_params"]
    try:
        return _fsdp_collectives.foreach_all_gather(*args, **kwargs)
    finally:
        comm.pending = None


def _gather_from_home(comm, home, call):
    """FSDP's ``foreach_all_gather`` without its copy-in or flat output: the peers read this
    rank's shards in its home, each parameter's unsharded tensor is filled from every rank's,
    on FSDP's streams in FSDP's order (copy-in stream, then the all-gather stream)."""
    fsdp_params, group, device = call["fsdp_params"], call["group"], call["device"]
    copy_in, gather_stream = call["all_gather_copy_in_stream"], call["all_gather_stream"]
    handle = _fsdp_collectives._get_device_handle(device.type)
    reused = False
    with handle.stream(copy_in):
        if home.cast:  # the shards cast into it, as FSDP's copy-in casts them into its flat buffer
            reused = comm.cast_once and home.holds_forward_cast(fsdp_params)
            if reused:  # once: a second gather in this backward (after an update in it) casts again
                home.forward_cast = None
            else:
                if home.read is not None:  # not before the peers read it for the previous gather (its end)
                    copy_in.wait_event(home.read)
                home.cast_in(fsdp_params)
        else:
            home.take(fsdp_params, copy_in)  # a parameter moved out since (or never in): moved back
    gather_stream.wait_stream(copy_in)
    world = group.size()
    if comm.reuse is not None and comm.parity is None:
        comm.parity = comm.reuse.next_parity()  # by the order of first gathers
    with handle.stream(gather_stream):
        with allocating(comm.reuse, comm.parity, fsdp_params, device, gather_stream):
            parts = _make_parts(fsdp_params, home.sizes, home.buf.dtype, device, world)
        comm.gather(None, home.buf, group, parts)
        event = gather_stream.record_event()  # an unstaged pull ends once every peer read the home
    if home.cast:
        home.read = event
    out = home.stand_in(world, device)
    if reused:
        COUNTS.reused_casts += 1
    elif home.cast:
        COUNTS.cast_gathers += 1
    else:
        COUNTS.skipped_gather_copy_ins += 1
    return _fsdp_collectives.AllGatherResult(out, event, None, [[home.buf.dtype] for _ in fsdp_params],
                                             [[n] for n in home.sizes], list(home.sizes))


def _copy_out(all_gather_result, fsdp_params, group):
    out = all_gather_result.all_gather_output
    if not getattr(out, _DIRECT, False):
        return _fsdp_collectives.foreach_all_gather_copy_out(all_gather_result, fsdp_params, group)
    # What the copy-out does besides its copies: order the current stream after the gather.
    stream = torch.cuda.current_stream(out.device) if out.is_cuda else None
    if all_gather_result.all_gather_event is not None and stream is not None:
        stream.wait_event(all_gather_result.all_gather_event)
    if isinstance(all_gather_result.all_gather_work, dist.distributed_c10d.Work):
        all_gather_result.all_gather_work.wait()
    if stream is not None:  # made on the all-gather stream, used and freed on this one
        for p in fsdp_params:
            if pooled(p):  # reused in stream order instead (fsdp_direct.reuse)
                continue
            for t in p.all_gather_outputs:
                t.record_stream(stream)
    COUNTS.skipped_copy_outs += 1


def _in_backward() -> bool:
    """Whether this thread runs a backward pass now (autograd's engine: FSDP2's pre-backward
    unshard, a checkpointed block's recompute). False where PyTorch cannot tell."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def _gathered_dtype(p, dtype):
    """The dtype FSDP gathers this parameter's shard (of ``dtype``) in: its ``param_dtype`` where
    FSDP casts before the gather (mixed precision; once FSDP's lazy init set it, the policy's
    before, as that init derives it), else ``dtype``."""
    if hasattr(p, "param_dtype"):
        return dtype if p.param_dtype is None else p.param_dtype
    want = getattr(getattr(p, "mp_policy", None), "param_dtype", None)
    return want if want is not None and dtype.is_floating_point else dtype


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _part_sizes(fsdp_params, dtype, numel: int, world: int):
    """Each parameter's shard size where every parameter is a plain dim-0 shard of ``dtype``
    whose sizes add up to ``numel`` and whose unsharded tensor (if any) fits; else None."""
    if fsdp_params is None or dtype == torch.uint8:  # uint8: FSDP's view for mixed dtypes
        return None
    sizes = []
    for p in fsdp_params:
        if (p.fsdp_placement.dim != 0 or p.offload_to_cpu
                or hasattr(p._sharded_local_tensor, "fsdp_pre_all_gather")):
            return None
        shard = p._sharded_param_data if p.sharded_state == ShardedState.SHARDED else p._sharded_post_forward_param_data
        sizes.append(shard.numel())
    if sum(sizes) != numel:
        return None
    for p, n in zip(fsdp_params, sizes):
        have = p.all_gather_outputs
        if have and (len(have) != 1 or have[0].dtype != dtype or have[0].numel() != world * n):
            return None
    return sizes


def _make_parts(fsdp_params, sizes, dtype, device, world: int):
    """Each parameter's unsharded tensor, made (or re-sized) now on the current stream, as
    FSDP's copy-out would."""
    outs = []
    for p, n in zip(fsdp_params, sizes):
        p._conccl_reuse = None  # unpooled unless fsdp_direct.reuse.allocating marks it after
        p.init_all_gather_outputs([n], [dtype], world, device)
        p.alloc_all_gather_outputs()
        outs.append(p.all_gather_outputs[0])
    return outs


def parameter_outputs(fsdp_params, input, world: int):
    """Each parameter's unsharded tensor, made (or re-sized) now on the current stream, as
    FSDP's copy-out would; None where the parameters are not plain dim-0 shards of one dtype
    whose sizes add up to ``input`` (FSDP's own path then runs). Every check comes before
    anything is allocated."""
    sizes = _part_sizes(fsdp_params, input.dtype, input.numel(), world)
    return None if sizes is None else _make_parts(fsdp_params, sizes, input.dtype, input.device, world)


class _Home:
    """One FSDP module's sharded parameters in one buffer the peers can read, laid out as FSDP's
    copy-in lays out its all-gather input (each parameter's padded shard, in order), so that
    no copy-in runs: the peers read the shards where the optimizer updates them.

    A parameter is moved in by copying its padded shard there and re-pointing FSDP's two views of
    it (``_sharded_param_data``, the padded shard; the DTensor's local tensor, its first rows) at
    the home, as FSDP's own ``reset_sharded_param`` re-points them; the parameter objects (the
    optimizer's) stay the same, and the old storage is freed. :func:`enable` moves every
    parameter at once; a gather moves back whatever something moved out since
    (``load_state_dict(assign=True)``, ``Module._apply``). A tensor taken from a parameter
    before it moved (a state dict made before ``enable``) keeps the old storage, and goes stale."""

    def __init__(self, buf, sizes, cast: bool = False):
        self.buf, self.sizes = buf, tuple(sizes)
        self.offsets = tuple(sum(sizes[:i]) for i in range(len(sizes)))
        # A *cast home* (FSDP's param_dtype differs from the parameters'): the shards stay where
        # they are, in their dtype, and every gather first casts them into it (cast_in); no
        # parameter is ever moved in.
        self.cast = cast
        # A cast home is written at every gather: the event after the last gather from it (the
        # peers' reads done), which the next cast waits for. FSDP's own ordering (the copy-in
        # stream waits for each copy-out) implies it, but not for a module gathered twice
        # before its first copy-out (a block called twice): this makes it local.
        self.read = None
        # What the last cast read, made outside a backward pass: each shard (a weak reference)
        # and its version counter; None once a cast ran inside one (holds_forward_cast).
        self.forward_cast = None
        self._stand_in = None

    def stand_in(self, world: int, device):
        """What FSDP gets as this module's flat all-gather output: one element expanded to the
        output's size, marked as a direct gather's, never written or read. Made once (an
        allocation per gather cost ~30 us of host time): FSDP only holds it, and reads its
        dtype, device and size."""
        out = self._stand_in
        if out is None or out.device != device or out.numel() != world * self.buf.numel():
            out = torch.empty(1, dtype=self.buf.dtype, device=device).expand(world * self.buf.numel())
            setattr(out, _DIRECT, True)
            self._stand_in = out
        return out

    def cast_in(self, fsdp_params) -> None:
        """Every padded shard cast into its place here, on the current stream (FSDP's copy-in
        of a mixed-precision gather, without the flat buffer it casts into)."""
        shards = [p._sharded_param_data for p in fsdp_params]
        with torch.no_grad():
            torch._foreach_copy_([self.buf[off:off + n] for off, n in zip(self.offsets, self.sizes)], shards)
        self.forward_cast = None if _in_backward() else [(weakref.ref(t), shard_versions(p)) for p, t in
                                                          zip(fsdp_params, shards)]

    def holds_forward_cast(self, fsdp_params) -> bool:
        """Whether a gather now may read this cast home as it is: inside a backward pass, where
        the last cast was made outside one (its forward's) and no gather read it in a backward
        since, of these same shards, unchanged since by any in-place write autograd counts. A
        module's parameters do not change between its forward and its backward (the optimizer
        steps between iterations), so FSDP2's re-gather in backward would cast the same values
        again; the forward's cast is what the backward then reads. Not seen: a write between the
        two that moves no version counter (through ``.data``, a fused optimizer's kernel); a
        version counter alone would not do between iterations for that reason, so the next
        forward always casts."""
        if self.forward_cast is None or not _in_backward() or len(fsdp_params) != len(self.forward_cast):
            return False
        return all(ref() is p._sharded_param_data and shard_versions(p) == versions
                   for p, (ref, versions) in zip(fsdp_params, self.forward_cast))

    def holds(self, p, off: int) -> bool:
        data = p._sharded_param_data  # by storage and offset: an empty view's data_ptr() is 0
        return (data.untyped_storage().data_ptr() == self.buf.untyped_storage().data_ptr()
                and data.storage_offset() == self.buf.storage_offset() + off)

    def take(self, fsdp_params, stream) -> int:
        """Move every parameter not at home yet into it (the copies on the current stream,
        ``stream``: the old storage is reused only once that stream passes them). How many moved."""
        moved = 0
        for p, off, n in zip(fsdp_params, self.offsets, self.sizes):
            if self.holds(p, off) or p._sharded_param_data.is_meta:  # meta: moved once materialized
                continue
            data, local = p._sharded_param_data, p.sharded_param._local_tensor
            with torch.no_grad():
                padded = self.buf[off:off + n]
                padded.copy_(data)
                if data.is_cuda:
                    data.record_stream(stream)
                p._sharded_param_data = padded
                p.sharded_param._local_tensor = padded.view(p.padded_sharded_param_size).narrow(0, 0, local.size(0))
            moved += 1
        return moved


def move_home(comm, fsdp_params, world: int) -> bool:
    """Move one FSDP module's shards into its home now, on the current stream (``enable``'s
    collective call: every rank makes the same homes in the same order). False where they
    cannot live in one. Shards still on meta stay there; the first gather moves them in."""
    home = comm.home_for(fsdp_params, world)
    if home is None:
        return False
    if not home.cast:  # a cast home is filled at each gather
        home.take(fsdp_params, torch.cuda.current_stream(home.buf.device) if home.buf.is_cuda else None)
    return True


class DirectAllGather:
    """FSDP2's all-gather hook that fills each parameter's unsharded tensor itself.

    ``gather(output, input, group, parts)`` does the filling (default: conccl's copy engines,
    ``Group.all_gather_into_parts``); ``allocate`` takes the flat buffer from ``pool`` (peer-
    mapped: the peers pull from it). Where :func:`parameter_outputs` declines, a plain conccl
    all-gather into the flat buffer runs and FSDP copies out as usual."""

    def __init__(self, pool=None, gather=None, homes=True, reuse=None, parity=None, cast_once=True):
        self.pool = pool
        # which of the two memory pools ``reuse`` (fsdp_direct.reuse.Pools) its unsharded tensors use:
        # given at the first gather unless set here; no pools where ``reuse`` is None
        self.reuse, self.parity = reuse, parity
        self.gather = gather or _copy_engine_gather
        self.pending = None  # the parameters of the all-gather under way (set by the wrap)
        self.homes = homes  # move the shards into one peer-readable buffer: no copy-in (_Home)
        self.home = None
        # a cast home: the backward's gather reads the forward's cast (_Home.holds_forward_cast)
        self.cast_once = cast_once

    def home_for(self, fsdp_params, world: int):
        """This module's :class:`_Home`, made the first time (a collective allocation: every rank
        decides alike, from shapes, dtypes and FSDP's settings only): where FSDP casts the shards
        before the gather (mixed precision), a cast home of the gathered dtype. None where the
        shards cannot live in one (another state than SHARDED, mixed dtypes, a tensor subclass,
        what :func:`_part_sizes` declines): FSDP's copy-in then runs."""
        if not self.homes or not fsdp_params or any(p.sharded_state != ShardedState.SHARDED for p in fsdp_params):
            return None
        datas = [p._sharded_param_data for p in fsdp_params]
        dtype = datas[0].dtype
        if any(type(d) is not torch.Tensor or d.dtype != dtype or d.dim() != 1 for d in datas):
            return None
        gathered = {_gathered_dtype(p, dtype) for p in fsdp_params}
        if len(gathered) != 1 or any(type(p.sharded_param._local_tensor) is not torch.Tensor for p in fsdp_params):
            return None  # parameters gathered in different dtypes; a subclass has its own layout
        target = gathered.pop()
        sizes = _part_sizes(fsdp_params, target, sum(d.numel() for d in datas), world)
        if sizes is None or any(n != _numel(p.padded_sharded_param_size) for p, n in zip(fsdp_params, sizes)):
            return None
        cast = target != dtype
        if (self.home is None or self.home.sizes != tuple(sizes) or self.home.buf.dtype != target
                or self.home.cast != cast):
            # Made on the parameters' device even where they are still on meta (a rank that
            # loads them later): the shapes decide, alike on every rank. A home of another dtype
            # (the model cast since) is replaced, on every rank alike.
            self.home = _Home(self.allocate((sum(sizes),), dtype=target, device=fsdp_params[0].device), sizes, cast)
        return self.home

    def allocate(self, size, *, dtype, device):
        if self.pool is None:
            return torch.empty(*size, dtype=dtype, device=device)
        return self.pool.allocate(size, dtype, device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        parts = parameter_outputs(self.pending, input_tensor, group.size())
        if parts is None:
            COUNTS.declined_gathers += 1
            self.gather(output_tensor, input_tensor, group, None)
            return None
        self.gather(output_tensor, input_tensor, group, parts)
        setattr(output_tensor, _DIRECT, True)
        return None


def _copy_engine_gather(output, input, group, parts) -> None:
    g = api.get_group(group)
    if parts is None:
        g.call(ALL_GATHER, output, input)
    else:
        # from a home (output None): every rank's is made alike once and never moves
        g.all_gather_into_parts(output, input, parts, fixed_input=output is None)
