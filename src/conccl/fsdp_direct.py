"""FSDP2's collectives without its copies: ``conccl.fsdp.enable(model, direct=True)``.

FSDP packs every parameter of a module into one flat buffer around each collective, with an
SM kernel each time:

- before the all-gather, on the copy-in stream, it copies every shard into the gathered
  buffer's own chunk (``_foreach_copy_``);
- after the all-gather, on the compute stream, it copies each parameter's rows out of the
  gathered buffer into that parameter's unsharded tensor (``split_with_sizes_copy``);
- before the reduce-scatter, on the compute stream, it copies every gradient, padded, into
  the reduce-scatter's input (``chunk_cat``).

Here none of them runs. Each module's sharded parameters live in one peer-readable *home*
(:class:`_Home`) laid out as FSDP's all-gather input; the all-gather pulls each peer's shards
from its home straight into this rank's per-parameter tensors
(:meth:`conccl.group.Group.all_gather_into_parts`, no flat output at all); the reduce-scatter
pushes each gradient's rows straight from where autograd left them into the peers' workspaces
(:meth:`conccl.group.Group.reduce_scatter_from_parts`). FSDP2's public hooks do not reach the
shards or the per-parameter tensors (FSDP copies in before the hook, makes the tensors in the
copy-out after it, and passes the reduce-scatter hook only the packed input), so four FSDP2
functions are wrapped:

- ``foreach_all_gather``: for a :class:`DirectAllGather` hook whose module's shards can live in
  a home, the wrap itself gathers on FSDP's streams (:func:`_gather_from_home`): it moves any
  shard not at home yet into it, makes the unsharded tensors on the all-gather stream (as FSDP
  would in the copy-out) and fills them. Elsewhere (a dtype cast before the gather, a resharded
  post-forward state) it tells the hook which parameters it gathers and FSDP's own function
  runs, copy-in included; the hook still fills the tensors from the flat buffer;
- ``foreach_all_gather_copy_out``, for a gather so done, only orders the current stream after
  it and tells the caching allocator the tensors are used there (``record_stream``: FSDP frees
  them on that stream);
- ``foreach_reduce`` tells a :class:`DirectReduceScatter` hook that its next allocation is
  the packed input; the hook hands FSDP a placeholder of that shape that owns no memory;
- ``foreach_reduce_scatter_copy_in``, given that placeholder, keeps the gradients instead of
  copying them; the hook reduces from them and marks them used on the reduce-scatter stream
  (FSDP drops its references right after the copy-in). An all-reduce after the reduce-scatter
  (HSDP) or a user's all-reduce hook keeps FSDP's copy-in: they read the output's padding,
  which the direct path leaves unspecified.

Anything else takes FSDP's own path: another hook, a parameter sharded on another dim, an
all-gather extension, mixed all-gather dtypes; gradients of another dtype than the reduction's
(a ``reduce_dtype`` cast), non-contiguous gradients, a reduction dtype FSDP divides before
reducing (fp16). The wraps are installed only where this PyTorch's functions have the
signatures and behaviour they were written against (:func:`supported`); elsewhere
``enable(direct=True)`` warns once and keeps the hook-only path.
"""
from __future__ import annotations

import functools
import inspect

import torch
import torch.distributed as dist

from . import api
from .collectives.all_gather import ALL_GATHER
from .collectives.reduce_scatter import REDUCE_SCATTER

try:  # FSDP2's internals this wraps (PyTorch 2.10 - 2.13)
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState
except ImportError:  # pragma: no cover - older PyTorch: supported() says so
    _fsdp_collectives = _fsdp_param_group = ShardedState = None

_GATHER_ARGS = ("fsdp_params", "group", "async_op", "all_gather_copy_in_stream", "all_gather_stream", "device",
                "all_gather_comm")
_COPY_OUT_ARGS = ("all_gather_result", "fsdp_params", "group")
_REDUCE_ARGS = ("fsdp_params", "unsharded_grads", "reduce_scatter_group", "reduce_scatter_stream",
                "reduce_scatter_comm")  # the first five of foreach_reduce's; more follow, among them
# all_reduce_group and all_reduce_hook, which the wrap reads by name (they keep FSDP's copy-in)
_COPY_IN_ARGS = ("unsharded_grads", "reduce_scatter_input", "world_size")
_RESULT_FIELDS = ("all_gather_output", "all_gather_event", "all_gather_work", "param_all_gather_input_dtypes",
                  "param_all_gather_input_numels", "all_gather_input_split_sizes")
_DIRECT = "_conccl_direct"  # set on a flat all-gather output whose gather filled the parameters
_PARTS = "_conccl_parts"  # set on a reduce-scatter input placeholder: its _Parts
# Reduction dtypes FSDP2 divides no reduce-scatter input of (it passes AVG or PREMUL_SUM)
_UNDIVIDED = (torch.float32, torch.bfloat16)

# Since import, for tests and benchmarks: copy-outs and copy-ins skipped, and collectives a
# direct hook left to FSDP's own path (tensors it cannot use where they are).
skipped_copy_outs = 0
declined_gathers = 0
skipped_copy_ins = 0
declined_reduces = 0
skipped_gather_copy_ins = 0  # all-gathers that read the shards in their home (no copy-in)


def supported() -> str | None:
    """None where the wraps can be installed; otherwise why not."""
    if _fsdp_param_group is None:
        return f"PyTorch {torch.__version__} has no FSDP2 internals to wrap"
    for mod, name, args in ((_fsdp_collectives, "foreach_all_gather", _GATHER_ARGS),
                            (_fsdp_collectives, "foreach_all_gather_copy_out", _COPY_OUT_ARGS),
                            (_fsdp_collectives, "foreach_reduce", None),
                            (_fsdp_collectives, "foreach_reduce_scatter_copy_in", _COPY_IN_ARGS)):
        fn = _ORIGINAL.get(name) or getattr(mod, name, None)
        have = () if fn is None else tuple(inspect.signature(fn).parameters)
        if fn is None or (have != args if args else have[:len(_REDUCE_ARGS)] != _REDUCE_ARGS
                                                     or not {"all_reduce_group", "all_reduce_hook"} <= set(have)):
            return f"PyTorch {torch.__version__}'s FSDP2 {name} is not the one conccl's direct path wraps"
    for name in ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce"):
        if getattr(_fsdp_param_group, name, None) not in (_ORIGINAL.get(name, getattr(_fsdp_collectives, name)),
                                                           _WRAPS[name]):
            return f"PyTorch {torch.__version__}'s FSDP2 param group does not call {name} as expected"
    result = getattr(_fsdp_collectives, "AllGatherResult", None)
    if getattr(result, "_fields", None) != _RESULT_FIELDS or not hasattr(_fsdp_collectives, "_get_device_handle"):
        return f"PyTorch {torch.__version__}'s FSDP2 all-gather result is not the one conccl's direct gather makes"
    reduce = inspect.unwrap(_ORIGINAL.get("foreach_reduce", _fsdp_collectives.foreach_reduce))
    if ("foreach_reduce_scatter_copy_in" not in reduce.__code__.co_names
            or reduce.__globals__ is not vars(_fsdp_collectives)):
        return f"PyTorch {torch.__version__}'s FSDP2 foreach_reduce does not call foreach_reduce_scatter_copy_in"
    return _divides_input()


def _divides_input() -> str | None:
    """None where FSDP2 divides no reduce-scatter input of an fp32 or bf16 reduction (the
    placeholder has no memory to divide); otherwise why not."""

    class _Group:
        def __init__(self, n):
            self.n = n

        def size(self):
            return self.n

    try:
        for dtype in _UNDIVIDED:
            for factor in (None, 2.0, 3.0):
                pre = _fsdp_collectives._get_gradient_divide_factors(_Group(2), None, dtype, "cuda", factor)[0]
                if pre not in (None, 1):
                    return f"PyTorch {torch.__version__}'s FSDP2 divides {dtype} gradients before reducing them"
    except (AttributeError, TypeError, ValueError) as e:
        return f"PyTorch {torch.__version__}'s FSDP2 gradient divide factors are not the ones conccl knows ({e})"
    return None


def _gather(*args, **kwargs):
    comm = kwargs.get("all_gather_comm", args[6] if len(args) > 6 else None)
    if not isinstance(comm, DirectAllGather):
        return _fsdp_collectives.foreach_all_gather(*args, **kwargs)
    call = dict(zip(_GATHER_ARGS, args), **kwargs)
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
    global skipped_gather_copy_ins
    fsdp_params, group, device = call["fsdp_params"], call["group"], call["device"]
    copy_in, gather_stream = call["all_gather_copy_in_stream"], call["all_gather_stream"]
    handle = _fsdp_collectives._get_device_handle(device.type)
    with handle.stream(copy_in):
        home.take(fsdp_params, copy_in)  # a parameter moved out since (or never in): moved back
    gather_stream.wait_stream(copy_in)
    world = group.size()
    with handle.stream(gather_stream):
        parts = _make_parts(fsdp_params, home.sizes, home.buf.dtype, device, world)
        comm.gather(None, home.buf, group, parts)
        event = gather_stream.record_event()
    out = torch.empty(1, dtype=home.buf.dtype, device=device).expand(world * home.buf.numel())
    setattr(out, _DIRECT, True)
    skipped_gather_copy_ins += 1
    return _fsdp_collectives.AllGatherResult(out, event, None, [[home.buf.dtype] for _ in fsdp_params],
                                             [[n] for n in home.sizes], list(home.sizes))


def _copy_out(all_gather_result, fsdp_params, group):
    global skipped_copy_outs
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
            for t in p.all_gather_outputs:
                t.record_stream(stream)
    skipped_copy_outs += 1


class _Parts:
    """What a reduce-scatter input placeholder stands for: the gradients and their rows (the
    direct path), or, where the copy-in had to run, the real packed input."""

    def __init__(self):
        self.grads = self.rows = self.flat = None


def _reduce_arg(name: str, args, kwargs):
    """One argument of a ``foreach_reduce`` call, by name, positional or keyword (FSDP passes
    them positionally); its default where not passed. No signature binding: once per layer."""
    if name in kwargs:
        return kwargs[name]
    at, default = _REDUCE_PARAMETERS()[name]
    return args[at] if at < len(args) else default


def _reduce(*args, **kwargs):
    global declined_reduces
    comm = _reduce_arg("reduce_scatter_comm", args, kwargs)
    if not isinstance(comm, DirectReduceScatter):
        return _ORIGINAL["foreach_reduce"](*args, **kwargs)
    call = {name: _reduce_arg(name, args, kwargs) for name in ("reduce_scatter_group", "all_reduce_group",
                                                                 "all_reduce_hook")}
    group = call["reduce_scatter_group"]
    # The padding rows of a direct reduction's output are not zeros (FSDP's copy-in zero-pads):
    # only FSDP's own views of it are used, except by an all-reduce (HSDP) or a user's hook,
    # which get the whole buffer. Those keep FSDP's copy-in.
    if group is None or group.size() < 2:  # FSDP reduces nothing
        return _ORIGINAL["foreach_reduce"](*args, **kwargs)
    if call["all_reduce_group"] is not None or call["all_reduce_hook"] is not None:
        declined_reduces += 1
        return _ORIGINAL["foreach_reduce"](*args, **kwargs)
    comm.expect_input = True  # foreach_reduce's first allocation is the packed input
    try:
        return _ORIGINAL["foreach_reduce"](*args, **kwargs)
    finally:
        comm.expect_input = False


def _padded_rows(shape, world: int) -> int:
    """Elements per rank of a gradient FSDP pads on dim 0 (its ``_get_dim0_padded_size``)."""
    return -(-shape[0] // world) * _numel(shape[1:]) if len(shape) else 1


def _copy_in(unsharded_grads, reduce_scatter_input, world_size):
    global skipped_copy_ins, declined_reduces
    parts = getattr(reduce_scatter_input, _PARTS, None)
    if parts is None:
        return _ORIGINAL["foreach_reduce_scatter_copy_in"](unsharded_grads, reduce_scatter_input, world_size)
    x = reduce_scatter_input
    if world_size > 1 and all(g.dtype == x.dtype and g.device == x.device and g.is_contiguous() and g.dim() >= 1
                              for g in unsharded_grads):
        parts.grads = list(unsharded_grads)  # FSDP clears its list next: these keep them
        parts.rows = [_padded_rows(g.shape, world_size) for g in unsharded_grads]
        skipped_copy_ins += 1
        return None
    # FSDP's own copy-in into a real packed input, as FSDP would allocate it (current stream)
    parts.flat = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    declined_reduces += 1
    return _ORIGINAL["foreach_reduce_scatter_copy_in"](unsharded_grads, parts.flat, world_size)


@functools.lru_cache(maxsize=1)
def _REDUCE_PARAMETERS():  # noqa: N802 - a constant, made once FSDP2's function is known
    """name -> (position, default) of ``foreach_reduce``'s parameters."""
    return {name: (i, None if p.default is inspect.Parameter.empty else p.default)
            for i, (name, p) in enumerate(inspect.signature(_ORIGINAL["foreach_reduce"]).parameters.items())}


_WRAPS = {"foreach_all_gather": _gather, "foreach_all_gather_copy_out": _copy_out, "foreach_reduce": _reduce,
          "foreach_reduce_scatter_copy_in": _copy_in}
_ORIGINAL: dict = {}  # FSDP2's own functions, once wrapped


def install() -> str | None:
    """Wrap FSDP2's four functions (once; idempotent). None if installed, else why not."""
    why = supported()
    if why is None and not _ORIGINAL:
        for name in _WRAPS:
            _ORIGINAL[name] = getattr(_fsdp_collectives, name)
        for name in ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce"):
            setattr(_fsdp_param_group, name, _WRAPS[name])
        # foreach_reduce calls it by its module's global name
        _fsdp_collectives.foreach_reduce_scatter_copy_in = _copy_in
    return why


def _cast_before_gather(p, dtype) -> bool:
    """Whether FSDP casts this parameter's shard before gathering it (mixed precision): its
    ``param_dtype`` once FSDP's lazy init set it, the policy's before (as that init derives it)."""
    if hasattr(p, "param_dtype"):
        return p.param_dtype not in (None, dtype)
    want = getattr(getattr(p, "mp_policy", None), "param_dtype", None)
    return want is not None and want != dtype and dtype.is_floating_point


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

    def __init__(self, buf, sizes):
        self.buf, self.sizes = buf, tuple(sizes)
        self.offsets = tuple(sum(sizes[:i]) for i in range(len(sizes)))

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
    home.take(fsdp_params, torch.cuda.current_stream(home.buf.device) if home.buf.is_cuda else None)
    return True


class DirectAllGather:
    """FSDP2's all-gather hook that fills each parameter's unsharded tensor itself.

    ``gather(output, input, group, parts)`` does the filling (default: conccl's copy engines,
    ``Group.all_gather_into_parts``); ``allocate`` takes the flat buffer from ``pool`` (peer-
    mapped: the peers pull from it). Where :func:`parameter_outputs` declines, a plain conccl
    all-gather into the flat buffer runs and FSDP copies out as usual."""

    def __init__(self, pool=None, gather=None, homes=True):
        self.pool = pool
        self.gather = gather or _copy_engine_gather
        self.pending = None  # the parameters of the all-gather under way (set by the wrap)
        self.homes = homes  # move the shards into one peer-readable buffer: no copy-in (_Home)
        self.home = None

    def home_for(self, fsdp_params, world: int):
        """This module's :class:`_Home`, made the first time (a collective allocation: every rank
        decides alike, from shapes, dtypes and FSDP's settings only); None where the shards
        cannot live in one (another state than SHARDED, mixed dtypes, a dtype cast before the
        gather, a tensor subclass, what :func:`_part_sizes` declines): FSDP's copy-in then runs."""
        if not self.homes or not fsdp_params or any(p.sharded_state != ShardedState.SHARDED for p in fsdp_params):
            return None
        datas = [p._sharded_param_data for p in fsdp_params]
        dtype = datas[0].dtype
        if any(type(d) is not torch.Tensor or d.dtype != dtype or d.dim() != 1 for d in datas):
            return None
        if any(_cast_before_gather(p, dtype) or type(p.sharded_param._local_tensor) is not torch.Tensor
               for p in fsdp_params):  # FSDP's copy-in casts; a subclass has its own layout
            return None
        sizes = _part_sizes(fsdp_params, dtype, sum(d.numel() for d in datas), world)
        if sizes is None or any(n != _numel(p.padded_sharded_param_size) for p, n in zip(fsdp_params, sizes)):
            return None
        if self.home is None or self.home.sizes != tuple(sizes) or self.home.buf.dtype != dtype:
            # Made on the parameters' device even where they are still on meta (a rank that
            # loads them later): the shapes decide, alike on every rank. A home of another dtype
            # (the model cast since) is replaced, on every rank alike.
            self.home = _Home(self.allocate((sum(sizes),), dtype=dtype, device=fsdp_params[0].device), sizes)
        return self.home

    def allocate(self, size, *, dtype, device):
        if self.pool is None:
            return torch.empty(*size, dtype=dtype, device=device)
        return self.pool.allocate(size, dtype, device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        global declined_gathers
        parts = parameter_outputs(self.pending, input_tensor, group.size())
        if parts is None:
            declined_gathers += 1
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
        g.all_gather_into_parts(output, input, parts)


class DirectReduceScatter:
    """FSDP2's reduce-scatter hook that reduces the gradients where autograd left them.

    ``reduce(output, grads, rows, group, op)`` does the reducing (default: conccl's copy
    engines, ``Group.reduce_scatter_from_parts``); ``flat(output, input, group, op)`` the plain
    reduce-scatter where FSDP's copy-in ran (default: conccl's). The packed input FSDP asks
    for is a placeholder owning no memory (its one element repeated: ``expand``) wherever the
    direct path can run: the gradients stand in for it. They are kept until the reduction is
    queued and reused only once the reduce-scatter stream passes it (``record_stream``), where
    FSDP frees them right after its copy-in: whether peak memory rises is for the benchmark."""

    def __init__(self, pool=None, reduce=None, flat=None):
        self.pool = pool  # unused: nothing here needs to be peer-mapped (the reduce-scatter pushes)
        self.reduce = reduce or _copy_engine_reduce
        self.flat = flat or _copy_engine_flat
        self.expect_input = False  # set by the foreach_reduce wrap: the next allocation is the input

    def allocate(self, size, *, dtype, device):
        global declined_reduces
        if self.expect_input:
            self.expect_input = False
            if dtype in _UNDIVIDED:
                t = torch.empty(1, dtype=dtype, device=device).expand(*size)
                setattr(t, _PARTS, _Parts())
                return t
            declined_reduces += 1  # FSDP divides this dtype's packed input before reducing it
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        # Ordered on FSDP's reduce-scatter stream, returning None (see conccl.fsdp's hooks).
        parts = getattr(input_tensor, _PARTS, None)
        if parts is None:
            self.flat(output_tensor, input_tensor, group, op)
        elif parts.grads is None:
            self.flat(output_tensor, parts.flat, group, op)
        else:
            grads, parts.grads = parts.grads, None
            if output_tensor.is_cuda:
                # Read there until this stream passes the call, and FSDP dropped them: marked
                # before the call is queued, so that a call that raises midway leaves them marked.
                stream = torch.cuda.current_stream(output_tensor.device)
                for g in grads:
                    g.record_stream(stream)
            self.reduce(output_tensor, grads, parts.rows, group, op)
        return None


def _copy_engine_reduce(output, grads, rows, group, op) -> None:
    api.get_group(group).reduce_scatter_from_parts(output, grads, rows, op)


def _copy_engine_flat(output, input, group, op) -> None:
    api.get_group(group).call(REDUCE_SCATTER, output, input, (op,))
