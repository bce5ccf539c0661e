"""``conccl.tp.all_gather_matmul`` and ``conccl.tp.matmul_reduce_scatter``.

Shaped like PyTorch's async-TP ops (``torch.ops.symm_mem.fused_all_gather_matmul`` /
``fused_matmul_reduce_scatter``) so that a user swaps one call; what moves is the group's
flat all-gather or reduce-scatter, cut into a pipeline with the GEMM (:mod:`conccl.schedule.pipeline`,
:mod:`conccl.group.pipelined`).
"""
from __future__ import annotations

from functools import lru_cache

import torch

from .. import env
from ..collectives.reduce_scatter import DTYPES as RS_DTYPES
from ..errors import InvalidArgument
from ..group import Group
from ..group.pipelined import all_gather_then_compute, compute_then_reduce_scatter
from ..schedule.pipeline import TPSchedule, gemm_steps
from ..planner import shipped
from ..planner import tp as tp_planner

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _group(group) -> Group:
    if isinstance(group, Group):
        return group
    from .. import api  # the CUDA path: a process group resolved to its conccl Group

    return api.get_group(group)


def resolve_schedule(schedule, op: str, M: int, K: int, N: int, world: int, dtype, device=None) -> TPSchedule:
    """``schedule`` as a :class:`TPSchedule`: "auto" asks the planner (the measured losses of
    ``device``'s kind of GPU where conccl ships them, H100 and H200, else the H100's; the
    bandwidths of the hardware profile chosen for it, :mod:`conccl.planner.shipped`), a name
    is parsed, a TPSchedule is taken as it is."""
    if isinstance(schedule, TPSchedule):
        return schedule
    if not isinstance(schedule, str):
        raise InvalidArgument(f"schedule must be 'auto', a schedule name or a conccl.tp.TPSchedule, got {schedule!r}")
    if schedule == "auto":
        return _auto(op, M, K, N, world, str(dtype).removeprefix("torch."), _device_name(device),
                     env.get("CONCCL_PROFILE") or None)
    return _parsed(schedule)


@lru_cache(maxsize=256)
def _parsed(name: str) -> TPSchedule:
    """``TPSchedule.parse(name)``, once per name: it is on every call's path (~5 us of host
    time per call), and a TPSchedule is immutable."""
    return TPSchedule.parse(name)


@lru_cache(maxsize=1024)
def _auto(op: str, M: int, K: int, N: int, world: int, dtype: str, device_name, profile_env) -> TPSchedule:
    """The planner's pick, made once per shape: weighing every candidate costs milliseconds of
    host time, on the path of every call (a pure function of its arguments and the shipped table)."""
    live = device_name and torch.cuda.is_initialized()  # never the first to initialise CUDA
    nvlinks = shipped.local_nvlinks(torch.cuda.current_device()) if live else None
    return tp_planner.choose(op, M, K, N, world, dtype, device_name=device_name, nvlinks=nvlinks).schedule


@lru_cache(maxsize=16)
def _device_name(device) -> str | None:
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda":
        return None
    return torch.cuda.get_device_name(device)


# GEMM step shapes whose kernels this process has launched once (see _load_kernels)
_LOADED: set = set()
_MAX_LOADED = 4096


def _load_kernels(key, run, capturing: bool = False) -> None:
    """Run ``run()`` (each distinct GEMM step of a pipeline, once) unless ``key`` ran before in
    this process. CUDA loads a kernel's module on its first launch (lazy loading, PyTorch's
    default), and loading may wait until nothing on the device is waiting. Inside a pipeline
    the GEMM steps are queued after stream waits on marks that only later work writes (in
    GEMM+reduce-scatter the copies await the GEMMs' marks), so that wait never ends: a hang,
    seen on the shared-GPU rig at world 2. Run first, on the caller's stream before the
    pipeline, the load finds no wait queued. Costs one extra GEMM per step shape, once.
    Not while ``capturing`` a graph: nothing runs then, and the extra GEMMs would be captured
    into every replay (warm a captured shape eagerly first, as graph capture wants anyway)."""
    if capturing:
        return
    if key not in _LOADED:
        run()
        if len(_LOADED) >= _MAX_LOADED:  # serving with ever new row counts: forget, warm again
            _LOADED.clear()
        _LOADED.add(key)


@lru_cache(maxsize=1024)
def _first_of_each_size(world, rank, tp, rows, scatter) -> tuple[tuple[int, int, bool], ...]:
    """The first GEMM step of each row count, as (row_start, row_end, own rows): the slices
    (sizes and alignments, which cuBLAS picks its kernels by) the pipeline will multiply.
    Cached: it is on every call's path, and the key of :func:`_load_kernels` is made of it."""
    seen: dict = {}
    for start, end, pieces in gemm_steps(world, rank, tp, rows, scatter):
        seen.setdefault((end - start, not pieces), (start, end, not pieces))
    return tuple(sorted(seen.values()))


def _check_dim(t, dim: int, what: str) -> int:
    if t.dim() < 2:
        raise InvalidArgument(f"{what} must have at least 2 dimensions (rows x K), got shape {tuple(t.shape)}")
    d = dim % t.dim() if -t.dim() <= dim < t.dim() else None
    if d is None or d == t.dim() - 1:
        raise InvalidArgument(f"{what}: dimension {dim} of a {t.dim()}-d tensor cannot be split (not the last, K)")
    return d


def _check_weights(a, weights) -> None:
    if a.dtype not in DTYPES:
        raise InvalidArgument(f"conccl.tp supports {', '.join(map(str, DTYPES))}, got {a.dtype}")
    for i, w in enumerate(weights):
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            raise InvalidArgument(f"weights[{i}] must be a 2-d tensor K x N")
        if w.shape[0] != a.shape[-1] or w.dtype != a.dtype or w.device != a.device:
            raise InvalidArgument(f"weights[{i}] is {tuple(w.shape)} {w.dtype} on {w.device}; expected "
                                  f"{a.shape[-1]} x N, {a.dtype} on {a.device}")


def _buffers(tensors) -> tuple:
    """What a pipeline's GEMM steps read and write, as a settled call's graph holds it (address,
    shape, strides, dtype of each tensor): the executor replays one graph only while these are
    the same (conccl.executors.cuda.executor, ``compute.buffers``)."""
    return tuple((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) for t in tensors)


def _recorder(async_op: bool, tensors):
    """For an async call: mark the tensors as in use on the stream each GEMM step runs on, so
    the caching allocator does not hand their memory out before that stream has passed."""
    if not async_op or not tensors or tensors[0].device.type != "cuda":
        return lambda: None

    def record():
        stream = torch.cuda.current_stream(tensors[0].device)
        for t in tensors:
            t.record_stream(stream)
    return record


def all_gather_matmul(a_shard, weights, gather_dim: int = 0, group=None, *, schedule="auto",
                      return_gathered: bool = False, async_op: bool = False, timeout=None):
    """All-gather ``a_shard`` along ``gather_dim`` and multiply the result by every weight,
    the copies pipelined with the GEMMs.

    Args:
        a_shard: this rank's shard, ``[*, K]`` (bf16, fp16 or fp32), the same shape on every rank.
        weights: a tensor ``[K, N]`` or a list of them (gate and up projections share one
            gather); same dtype and device as ``a_shard``.
        gather_dim: the dimension of ``a_shard`` the ranks' shards are concatenated along (not
            the last). Another than 0 is moved to the front first (a copy of ``a_shard``, on
            SMs, when that leaves it non-contiguous); the results are views with it moved back.
        group: a ``torch.distributed`` process group (default: the world) or a conccl Group.
        schedule: "auto", a name or a :class:`~conccl.schedule.pipeline.TPSchedule` (see ``conccl.tp``).
        return_gathered: also return the gathered ``A`` (a fresh tensor the caller owns).
        async_op: return a :class:`~conccl.Work` with the results (wait on it before use).

    Returns:
        ``(A or None, [A @ W for W in weights])``, as ``fused_all_gather_matmul``; with
        ``async_op``, ``(work, A or None, outputs)``.

    Stream semantics: ordered after the current stream's work; the current stream waits for
    the results (blocking) or ``work.wait()`` makes it. Every byte between GPUs moves on copy
    engines (pull; ``push`` schedules: pushed from ``a_shard`` into the peers' workspace);
    each GEMM step waits for its rows with a stream memory operation (captured in a CUDA
    graph: a graph edge, :func:`conccl.schedule.captured.mark_edges`). A blocking call made again with
    the same tensors runs, from the third such call, as one graph launch, GEMMs included (a
    settled pipeline, :mod:`conccl.executors.cuda.settled_pipeline`: about half the host
    time), where every copy is between GPUs: ``push``, or pull from a ``conccl.empty`` shard.
    SMs used: the GEMMs' alone, and a pull schedule's staging of a plain ``a_shard`` (a
    same-GPU copy); ``return_gathered`` adds same-GPU copies into ``A``. Workspace: pull:
    none with ``a_shard`` from ``conccl.empty``, else ``a_shard``'s bytes of symmetric memory
    (it is staged there for the peers to read); push: ``world x`` ``a_shard``'s bytes (each
    peer's shard lands in a slot of its own), twice that up to 64 MiB (double-buffered).
    """
    single = isinstance(weights, torch.Tensor)
    weights = [weights] if single else list(weights)
    if not isinstance(a_shard, torch.Tensor):
        raise InvalidArgument("a_shard must be a tensor")
    d = _check_dim(a_shard, gather_dim, "all_gather_matmul: a_shard")
    _check_weights(a_shard, weights)
    g = _group(group)
    world = g.world
    a = a_shard if d == 0 else a_shard.movedim(d, 0)
    a = a.contiguous()
    K = a.shape[-1]
    rows = a.numel() // K
    a2 = a.view(rows, K)
    gathered = torch.empty((world * rows, K), dtype=a.dtype, device=a.device)
    outs = [torch.empty((world * rows, w.shape[1]), dtype=a.dtype, device=a.device) for w in weights]
    tp = resolve_schedule(schedule, "ag_gemm", world * rows, K, max(w.shape[1] for w in weights), world, a.dtype,
                          a.device)
    record = _recorder(async_op, [a2, gathered, *weights, *outs])
    steps = _first_of_each_size(world, g.rank, tp, rows, scatter=False)
    def warm_rows(s, e, own):  # as compute reads them: a push step from an aligned workspace slot
        return a2 if own else torch.empty_like(gathered[s:e]) if tp.push else gathered[s:e]

    _load_kernels(("ag", steps, K, a.dtype, a.device, tp.push, tuple((w.shape, w.stride()) for w in weights)),
                  lambda: [torch.mm(warm_rows(s, e, own), w, out=o[s:e])
                           for s, e, own in steps for w, o in zip(weights, outs)], g.executor.capturing())

    row_bytes = K * a.element_size()

    def compute(op, workspace=None):
        record()
        if op.own:
            src = a2
        elif op.ws_offset is not None:  # a push pipeline: the peer's rows where it pushed them
            if workspace is None:
                raise RuntimeError("a push pipeline's GEMM step was handed no workspace")
            src = workspace[op.ws_offset:op.ws_offset + (op.row_end - op.row_start) * row_bytes].view(a.dtype).view(-1, K)
        else:
            src = gathered[op.row_start:op.row_end]
        for w, out in zip(weights, outs):
            torch.mm(src, w, out=out[op.row_start:op.row_end])

    compute.buffers = _buffers([a2, gathered, *weights, *outs])
    # Not returned, the gathered rows' own chunk is never read (the own GEMM step reads a2):
    # no copy of it.
    work = all_gather_then_compute(g, gathered, a2, tp, rows, row_bytes, compute, async_op, timeout,
                                   keep_own=return_gathered)

    def shaped(t):
        t = t.view(world * a.shape[0], *a.shape[1:-1], t.shape[-1])
        return t if d == 0 else t.movedim(0, d)  # a view: valid once the call is (async_op too)

    results = [shaped(o) for o in outs]
    A = shaped(gathered) if return_gathered else None
    if async_op:
        return work, A, results
    return A, results


def matmul_reduce_scatter(a, weight, scatter_dim: int = 0, op=None, group=None, *, schedule="auto",
                          async_op: bool = False, timeout=None):
    """``a @ weight``, reduced over the ranks and scattered along ``scatter_dim``: each piece of
    the GEMM leaves for its rank as soon as it is computed.

    Args:
        a: ``[*, K]`` (bf16, fp16 or fp32), the same shape on every rank; its ``scatter_dim``
            divisible by the world size.
        weight: ``[K, N]``, same dtype and device.
        scatter_dim: the dimension of the result the ranks split (not the last).
        op: ``torch.distributed.ReduceOp.SUM`` (default), ``AVG`` or ``PREMUL_SUM(factor)``.
        group, schedule, async_op, timeout: as :func:`all_gather_matmul` (``push`` runs here as
            ``direct``: each piece always leaves by a push from where it was computed).

    Returns:
        ``[*, N]`` with ``scatter_dim`` divided by the world size: rank r's part of the sum over
        ranks of ``a @ weight`` (``(work, result)`` with ``async_op``).

    Order of summation: as :func:`conccl.reduce_scatter_tensor` (rank order, fp32, one rounding):
    the serial GEMM-then-reduce-scatter's bits. SMs used: the GEMMs and the bounded reduction
    kernel. Workspace: ``world x`` the result's bytes of symmetric memory (peers push there).
    A blocking call made again with the same tensors runs, from the third such call, as one
    graph launch, GEMMs included (a settled pipeline, as in :func:`all_gather_matmul`).
    """
    if not isinstance(a, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise InvalidArgument("a and weight must be tensors")
    d = _check_dim(a, scatter_dim, "matmul_reduce_scatter: a")
    _check_weights(a, [weight])
    if str(a.dtype).removeprefix("torch.") not in RS_DTYPES:
        raise InvalidArgument(f"matmul_reduce_scatter supports {', '.join(RS_DTYPES)}, got {a.dtype}")
    g = _group(group)
    world = g.world
    if a.shape[d] % world:
        raise InvalidArgument(f"matmul_reduce_scatter: dimension {scatter_dim} of a ({a.shape[d]}) is not divisible "
                              f"by the world size ({world})")
    x = a if d == 0 else a.movedim(d, 0)
    x = x.contiguous()
    K, N = x.shape[-1], weight.shape[1]
    M = x.numel() // K
    x2 = x.view(M, K)
    full = torch.empty((M, N), dtype=a.dtype, device=a.device)
    out = torch.empty((M // world, N), dtype=a.dtype, device=a.device)
    tp = resolve_schedule(schedule, "gemm_rs", M, K, N, world, a.dtype, a.device)
    if tp.push:  # every piece already leaves by a push from where it was computed: the direct schedule
        tp = TPSchedule(gemm_streams=tp.gemm_streams)
    record = _recorder(async_op, [x2, weight, full, out])
    steps = _first_of_each_size(world, g.rank, tp, M // world, scatter=True)
    _load_kernels(("rs", steps, K, N, a.dtype, a.device, weight.stride()),
                  lambda: [torch.mm(x2[s:e], weight, out=full[s:e]) for s, e, _ in steps], g.executor.capturing())

    def compute(step):
        record()
        torch.mm(x2[step.row_start:step.row_end], weight, out=full[step.row_start:step.row_end])

    compute.buffers = _buffers([x2, weight, full])
    work = compute_then_reduce_scatter(g, out, full, op, tp, M // world, N * a.element_size(), compute, async_op,
                                       timeout)
    result = out.view(x.shape[0] // world, *x.shape[1:-1], N)
    result = result if d == 0 else result.movedim(0, d)  # a view, as above
    return (work, result) if async_op else result
