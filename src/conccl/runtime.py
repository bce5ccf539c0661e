"""Run a computation and a collective together under a plan.

    with conccl.overlap(plan="auto") as c3:
        y = c3.matmul(x, w)                      # the computation (a GEMM: its shape is known)
        c3.all_gather_into_tensor(out, shard)    # the collective
    # here the caller's stream has both results, as if they had run one after the other

On leaving the block, the plan for (GEMM shape, collective, size, world) is looked up (computed
once by the planner from the hardware profile, then cached) and applied: the collective's
implementation (NCCL's SM kernels or conccl's copy engines), the launch order, the collective
stream's priority, a green-context SM partition for the GEMM and a CTA cap for NCCL.

Stream semantics as in ``torch.distributed`` with ``async_op=False``: both start after the work
already queued on the caller's current stream, and later work on that stream sees both
results. The host does not block. One computation and one collective per block.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from . import api, env
from .collectives import REGISTRY, Collective
from .errors import InvalidArgument
from .device.partitions import Partitions
from .group.persistent import PersistentCollective
from .planner import Plan, PlanError, plan_strategy, workload
from .planner import eager as planner_eager
from .planner import shipped
from .planner import tp as tp_planner
from .planner.profile import HardwareProfile, ProfileError


# Plans and profiles are immutable values of their arguments: memoised, not state. What a
# plan needs at run time (streams, green contexts, NCCL groups) belongs to the conccl group
# (partitions()), and goes when it is destroyed.
def _nvlinks() -> int | None:
    """This process's GPU's active NVLinks, where CUDA is already in use here (never the first
    to initialise it: the CPU tiers and the CLI on a GPU machine must not)."""
    if not torch.cuda.is_initialized():
        return None
    return shipped.local_nvlinks(torch.cuda.current_device())


def _given(path: str | None) -> str | None:
    """The profile named by path, else by $CONCCL_PROFILE: resolved before any memo is keyed."""
    return path or env.get("CONCCL_PROFILE") or None


def profile_choice(path: str | None, device_name: str | None = None, world: int | None = None) -> shipped.Choice:
    """Which hardware profile plans for this GPU (:mod:`conccl.planner.shipped`): ``path`` (or
    ``$CONCCL_PROFILE``) if given, refused (ProfileError, OSError) if measured on another GPU
    model; else the shipped profile of this GPU (``device_name``), NVLink count and ``world``;
    else a fallback with one warning. Never an exception for want of a study."""
    return shipped.choose(device_name, world, _given(path), _nvlinks() if device_name else None)


def profile_for(path: str | None, device_name: str | None = None, world: int | None = None) -> HardwareProfile:
    """The profile of :func:`profile_choice`."""
    return profile_choice(path, device_name, world).profile


def agreed_profile(path: str | None = None) -> shipped.Choice:
    """:func:`profile_choice` for the world group, agreed by its ranks once (a collective call
    the first time: ranks that chose differently, e.g. GPUs of two models, raise
    InvalidArgument rather than run different plans), then a lookup."""
    g = api.get_group()
    path = _given(path)

    def agree():
        try:
            choice, error = profile_choice(path, torch.cuda.get_device_name(torch.cuda.current_device()), g.world), None
            identity = choice.identity()
        except (ProfileError, OSError) as e:  # still take part: the peers must not wait for this rank
            choice, error, identity = None, e, f"refused: {e}"
        g.agree(identity, "hardware profile", "every rank must plan from the same profile (GPUs of one model, "
                "the same profile= or CONCCL_PROFILE)")
        if error is not None:
            raise error
        return choice
    return g.resource(f"runtime.profile.{path}", agree)


@functools.lru_cache(maxsize=4096)
def _plan(gemm: tuple, collective: str, size: int, world: int, plan: str, profile: str | None, dtype_bytes: int,
          device_name: str | None) -> Plan:
    prof = profile_for(profile, device_name, world)
    return plan_strategy(prof, workload(gemm, collective, size, world, dtype_bytes), plan)


def get_plan(gemm, collective: str, size: int, world: int, plan: str = "auto", profile: str | None = None,
             dtype_bytes: int = 2, device_name: str | None = None) -> Plan:
    """The plan for a GEMM (M, N, K) beside ``collective`` of ``size`` output bytes per rank,
    computed once per distinct arguments and cached (a dictionary lookup afterwards)."""
    return _plan(tuple(int(x) for x in gemm), collective, int(size), int(world), plan, _given(profile), dtype_bytes,
                 device_name)


def plan_cache_info() -> dict:
    """{"hits", "misses", "size"} of the plan cache."""
    info = _plan.cache_info()
    return {"hits": info.hits, "misses": info.misses, "size": info.currsize}


def clear_plan_cache() -> None:
    _plan.cache_clear()
    shipped.forget()
    tp_planner.forget()


EAGER_PATHS = ("auto", "copy_engines")


def eager_paths(mode: str, world: int, profile: str | None = None, device_name: str | None = None) -> dict:
    """What :func:`set_eager_path` installs, without a group: {"mode", "nccl_below", "note",
    "profile"} (see :mod:`conccl.planner.eager`)."""
    if mode not in EAGER_PATHS:
        raise InvalidArgument(f"eager path must be one of {', '.join(EAGER_PATHS)}, got {mode!r}")
    if mode == "copy_engines":
        return {"mode": mode, "nccl_below": {}, "note": None, "profile": None}
    choice = profile_choice(profile, device_name, world)
    prof = choice.profile
    table = planner_eager.eager_table(prof, REGISTRY, world)
    source = {k: prof.source[k] for k in ("machine_kind", "commit", "date", "borrowed_from", "eager_sweep")
              if k in prof.source}  # eager_sweep: where the sweep the table comes from was measured
    return {"mode": mode, **table, "profile": {"device": prof.device, "world": prof.world, "chosen": choice.how,
                                               "file": choice.path, **source}}


def set_eager_path(mode: str = "auto", group=None, profile: str | None = None) -> dict:
    """Choose the engine of this rank's eager conccl calls on ``group`` (default: the world).

    ``"auto"``: a call whose output bytes per rank are below its collective's crossover goes
    to the process group's own backend (NCCL), where NCCL was faster in the hardware
    profile's eager sweep (the public functions called eagerly on ordinary tensors, host time
    included; its verdict at its largest size holds above it; a profile without one: the size
    sweep of persistent ops, :mod:`conccl.planner.eager`). ``profile``: a path, refused if
    measured on another GPU model; None: the shipped profile of this GPU, else a fallback with
    one warning (:func:`profile_choice`). Larger calls, calls captured into a CUDA graph, persistent ops, calls
    with explicit split sizes, algorithm or stream mode, and the calls ``overlap`` and the
    FSDP hooks make stay on the copy engines. A routed call skips conccl's agreement (its
    arguments are NCCL's to check) and is ordered in the group as any other. A collective
    call: every rank must choose alike (the tables are compared). ``"copy_engines"``: every call
    on the copy engines (the default). Each returned ``Work`` says where its call ran
    (``Work.path``: "copy_engines", "nccl", or "one_shot" where ``CONCCL_ONE_SHOT_BELOW`` made
    it one SM kernel); the ``conccl`` logger says so at DEBUG level.

    Fastest *alone*: beside a computation NCCL's kernels slow it, which this choice does not
    weigh; :func:`overlap` plans for that. Every rank must make the same choice. Returns
    {"mode", "nccl_below", "note", "profile"} (``note``: why the table may not hold here).
    """
    g = api.get_group(group)
    device_name = torch.cuda.get_device_name(g.executor.device) if mode == "auto" else None
    chosen = eager_paths(mode, g.world, profile, device_name)
    api.set_options(group, nccl_below=chosen["nccl_below"])
    return chosen


def partitions(device) -> Partitions:
    """The streams, green contexts and NCCL groups plans run on: the world group's, kept on
    its conccl :class:`~conccl.group.Group` (closed by :func:`conccl.destroy`)."""
    return api.get_group().resource(f"runtime.partitions.{device.index}", lambda: Partitions(device))


def launch(plan: Plan, compute_fn, comm_fn, parts=None, tensors=()) -> None:
    """Queue ``compute_fn()`` and ``comm_fn(impl, nccl_group)`` as ``plan`` says, both after the
    current stream's work; the current stream then waits for both. ``parts``: the
    :class:`~conccl.device.partitions.Partitions` to take streams and groups from.

    Host cost matters here: in a decode step the pair runs in ~0.2 ms, and every microsecond
    spent before the second launch delays it. So the events are the partition's, recorded
    again on every call (a wait already queued keeps the state it was queued with), and the
    streams are switched with ``set_stream`` rather than a new context manager per kernel.
    """
    cur = torch.cuda.current_stream()
    parts = parts or partitions(cur.device)
    gemm_stream, _ = parts.green_stream(plan.gemm_sms_taken)
    comm_stream = parts.comm_stream
    group = parts.nccl_group(plan.nccl_ctas, plan.comm_high_priority) if plan.impl == "nccl" else None
    ready, gemm_done, comm_done = parts.events()
    ready.record(cur)
    try:
        for name in plan.launch_order:
            stream = gemm_stream if name == "gemm" else comm_stream
            stream.wait_event(ready)
            torch.cuda.set_stream(stream)
            if name == "gemm":
                compute_fn()
            else:
                comm_fn(plan.impl, group)
    finally:
        torch.cuda.set_stream(cur)
    for t in tensors:  # the caching allocator must not hand these out while the side streams use them
        t.record_stream(gemm_stream)
        t.record_stream(comm_stream)
    gemm_done.record(gemm_stream)
    comm_done.record(comm_stream)
    cur.wait_event(gemm_done)
    cur.wait_event(comm_done)


class Overlap:
    """The context of :func:`overlap`: record one computation and one collective, run both on exit."""

    def __init__(self, plan: str = "auto", profile: str | None = None):
        if not isinstance(plan, str):
            raise InvalidArgument(f"plan must be 'auto' or a strategy name, got {plan!r}")
        self.plan_name, self.profile = plan, profile
        self.plan: Plan | None = None
        self._compute = None
        self._comm = None
        self._op = None  # a persistent op recorded with start()

    def __enter__(self) -> "Overlap":
        return self

    def matmul(self, a, b, out=None):
        """Record ``out = a @ b`` (2-D CUDA tensors, bf16 or fp16); returns ``out`` (allocated
        here if not given), which holds the product after the block."""
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
            raise InvalidArgument(f"matmul needs [M, K] @ [K, N] matrices, got {tuple(a.shape)} @ {tuple(b.shape)}")
        if not (a.is_cuda and b.is_cuda) or a.dtype != b.dtype:
            raise InvalidArgument("matmul operands must be CUDA tensors of one dtype")
        m, k = a.shape
        n = b.shape[1]
        if out is None:
            out = torch.empty(m, n, dtype=a.dtype, device=a.device)
        self._set_compute(lambda: torch.mm(a, b, out=out), (m, n, k), a.element_size(), (a, b, out))
        return out

    def compute(self, fn, gemm):
        """Record any computation ``fn()``, planned as a GEMM of shape ``gemm`` = (M, N, K)."""
        if not callable(fn):
            raise InvalidArgument("compute needs a callable")
        self._set_compute(fn, tuple(gemm), 2, ())

    def collective(self, coll: Collective | str, output, input, *args, group=None):
        """Record any registered collective: ``coll`` (or its name) on (output, input, *args),
        the arguments of its torch.distributed function (``coll.api_name``)."""
        coll = REGISTRY.get(coll, coll) if isinstance(coll, str) else coll
        if not isinstance(coll, Collective):
            raise InvalidArgument(f"unknown collective {coll!r}; known: {', '.join(REGISTRY)}")
        self._set_comm(coll, output, input, group, tuple(args))

    def all_gather_into_tensor(self, output, input, group=None):
        """Record ``torch.distributed.all_gather_into_tensor(output, input)`` (see conccl's)."""
        self.collective("all_gather", output, input, group=group)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None):
        """Record ``torch.distributed.all_to_all_single(output, input, ...)``."""
        self.collective("all_to_all", output, input, output_split_sizes, input_split_sizes, group=group)

    def start(self, op):
        """Record a :class:`conccl.PersistentCollective` (agreed once, see
        :func:`conccl.persistent_all_gather_into_tensor`): where the plan picks conccl it is
        started, skipping the per-call handshake; where it picks NCCL, NCCL runs the same
        collective on the op's tensors."""
        if not isinstance(op, PersistentCollective) or op.closed:
            raise InvalidArgument(f"start needs an open conccl.PersistentCollective, got {op!r}")
        self._set_comm(op.coll, op.output, op.input, None, op.args)
        self._op = op

    def _set_compute(self, fn, gemm, esize, tensors):
        if self._compute is not None:
            raise InvalidArgument("one computation per overlap block")
        self._compute = (fn, gemm, esize, tensors)

    def _set_comm(self, coll: Collective, output, input, group, args: tuple):
        if self._comm is not None:
            raise InvalidArgument("one collective per overlap block")
        if group is not None and group != dist.group.WORLD:
            raise InvalidArgument("conccl.overlap runs collectives on the default (world) group")
        self._comm = (coll, output, input, args)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            return False
        if self._compute is None or self._comm is None:
            raise InvalidArgument("an overlap block needs one computation (matmul/compute) and one collective")
        fn, gemm, esize, tensors = self._compute
        coll, output, input, args = self._comm
        world = dist.get_world_size() if dist.is_initialized() else 0
        if self.plan_name == "auto" and world:
            agreed_profile(self.profile)  # once per group: every rank plans from the same profile
        try:
            self.plan = get_plan(gemm, coll.name, output.numel() * output.element_size(), world, self.plan_name,
                                 self.profile, esize, torch.cuda.get_device_name(output.device))
        except PlanError as e:
            raise InvalidArgument(str(e)) from None

        op = self._op

        def comm(impl, group):
            if op is not None and impl == "conccl":
                op.start()
            elif impl == "conccl":  # the group's call: never routed to NCCL (the plan chose copy engines)
                api.get_group().call(coll, output, input, args)
            else:
                coll.call_with(dist, output, input, args, group=group)

        launch(self.plan, fn, comm, tensors=(*tensors, output, input))
        return False


def overlap(plan: str = "auto", profile: str | None = None) -> Overlap:
    """A block whose one computation and one collective run concurrently under ``plan``:
    ``"auto"`` (the planner's choice from the hardware profile: ``profile``, a path, else the
    shipped profile of this GPU and group size, else a fallback with one warning, see
    :mod:`conccl.planner.shipped`; a profile named by path that was measured on another GPU
    model is refused) or a study strategy name."""
    return Overlap(plan, profile)


def run_concurrently(compute_fn, gemm, collective: str, output, input, plan: str = "auto",
                     output_split_sizes=None, input_split_sizes=None, profile: str | None = None) -> Plan:
    """``compute_fn()`` (planned as a GEMM of shape ``gemm`` = (M, N, K)) and the collective
    (a registry name, e.g. ``"all_gather"``, on ``output``/``input``) together; returns the plan.
    ``output_split_sizes``/``input_split_sizes`` are passed where the collective takes them."""
    if collective not in REGISTRY:
        raise InvalidArgument(f"unknown collective {collective!r}; known: {', '.join(REGISTRY)}")
    coll = REGISTRY[collective]
    given = {"output_split_sizes": output_split_sizes, "input_split_sizes": input_split_sizes}
    with overlap(plan, profile) as c3:
        c3.compute(compute_fn, gemm)
        c3.collective(coll, output, input, *(given.get(n) for n in coll.arg_names))
    return c3.plan
