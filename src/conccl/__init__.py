"""conccl: Concurrent Communication Collectives.

Collectives that move data with the GPUs' copy engines instead of SM kernels, shaped like
``torch.distributed``, so that computation running beside them keeps every SM. The command
line: ``conccl study`` (the C3 characterization), ``conccl bench``, ``conccl plan``
(``conccl --help``; ``python -m conccl`` is the same command).

Collectives (stream-ordered on the current stream; copy engines, no SM; ``async_op=True``
returns a :class:`Work`):

- ``all_gather_into_tensor(output, input, group=None, async_op=False)``: every rank's input, concatenated.
- ``all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, ...)``: chunk i to rank i.
- ``reduce_scatter_tensor(output, input, op=None, ...)``: copies on the copy engines, the sum one small kernel.
- ``persistent_all_gather_into_tensor(output, input)``: agree with the peers once; ``.start()`` only queues copies.
- ``all_reduce(tensor, op=None, ...)``: in place; small: every rank's tensor pushed to every peer and summed there
  (one pass); large: a reduce-scatter into the workspace, then every chunk pulled back.
- ``persistent_all_to_all_single(output, input, ...)``: the same for all-to-all.
- ``persistent_reduce_scatter_tensor(output, input, op=None)``: a reduce-scatter agreed once, started many times.
- ``persistent_all_reduce(tensor, op=None)``: an all-reduce agreed once, started many times.
- ``PersistentCollective``: what the persistent functions return (``start()``, ``close()``; a context manager).
- ``reserve_graph_workspace(nbytes, group=None)``: memory for calls captured into CUDA graphs later.

Memory and groups:

- ``empty(*size, dtype, device, group)``: a tensor every peer can read and write (enables push).
- ``release(tensor, group=None)``: give such a tensor back (its memory returns once dropped).
- ``set_options(group, algorithm=, stream_mode=, timeout=, checks=, nccl_below=)``: a group's defaults on this rank.
- ``set_eager_path("auto" | "copy_engines", group=None, profile=None)``: small eager calls to NCCL where it is faster alone.
- ``get_group(group=None)``: the ``Group`` conccl keeps for a process group (made on first use).
- ``get_communicator(group=None)``: its old name (deprecated).
- ``destroy(group=None)``: close a group's conccl state (persistent ops, workspace, watchdog).

Computation beside communication:

- ``tp``: tensor parallelism, the collective pipelined with the GEMM it feeds or is fed by
  (``conccl.tp.all_gather_matmul``, ``matmul_reduce_scatter``, ``ColumnParallelLinear``,
  ``RowParallelLinear``).
- ``fsdp``: FSDP2 on copy engines (``conccl.fsdp.enable(model)``).
- ``ep``: expert parallelism, a MoE layer's dispatch and combine (``conccl.ep.dispatch``,
  ``combine``).

``tp``, ``fsdp`` and ``ep`` load on first use, as attributes (``conccl.tp.X``) or as modules
(``import conccl.tp``, ``from conccl.fsdp import enable``).

- ``overlap(plan="auto", profile=None)``: a block whose GEMM and collective run concurrently.
- ``run_concurrently(compute_fn, gemm, collective, output, input, plan="auto")``: the same as a call.
- ``get_plan(gemm, collective, size, world, plan="auto")``: the planner's strategy and SM split.

Types and errors:

- ``Work``: handle of an ``async_op=True`` call (``wait``, ``is_completed``).
- ``Algorithm``: ``PULL`` or ``PUSH``, the direction of peer copies (the all-gather and the all-reduce also ``STAGED_PUSH``).
- ``StreamMode``: how copies map to CUDA streams (and so to copy engines).
- ``CollectiveError``: a collective could not complete; the base of the three below.
- ``CollectiveTimeout``: peers did not arrive within the timeout (names them).
- ``GroupBroken``: an earlier collective on the group failed; ``cause`` says how.
- ``InvalidArgument``: a tensor or argument a collective cannot take (a ``ValueError``).
- ``UnsupportedGroup``: the group's GPUs cannot all reach each other by peer access.

``__version__``: this conccl's version (one source: ``conccl/_version.py``).
"""
from __future__ import annotations

import importlib

from . import _version
from .errors import InvalidArgument
from .group.persistent import PersistentCollective
from .schedule.base import Algorithm, StreamMode

__version__ = _version.__version__


def __getattr__(name):
    # What needs torch loads on first use (the API module and the CUDA executor behind it, the
    # collective errors, whose base is torch's, and Work, which raises them), keeping
    # `import conccl` free of torch and numpy for the CLI and the pure parts (plans, reference executor).
    if name in {"all_gather_into_tensor", "all_to_all_single", "reduce_scatter_tensor", "all_reduce",
                "persistent_all_gather_into_tensor", "persistent_all_to_all_single",
                "persistent_reduce_scatter_tensor", "persistent_all_reduce", "reserve_graph_workspace", "empty", "release", "set_options", "destroy", "get_communicator",
                "get_group"}:
        from . import api

        # Kept as this module's attribute: the next lookup skips this hook (~1 us on every
        # eager call made as conccl.all_gather_into_tensor(...)).
        value = globals()[name] = getattr(api, name)
        return value
    if name in {"CollectiveError", "CollectiveTimeout", "GroupBroken", "UnsupportedGroup"}:
        from . import errors

        value = globals()[name] = getattr(errors, name)
        return value
    if name == "Work":
        from .group.work import Work

        globals()[name] = Work
        return Work
    if name in {"tp", "fsdp", "ep"}:  # the submodule loads (and becomes this attribute) on first use
        return importlib.import_module(f"{__name__}.{name}")
    if name in {"overlap", "run_concurrently", "get_plan", "plan_cache_info", "set_eager_path"}:
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'conccl' has no attribute {name!r}")


__all__ = [
    "all_gather_into_tensor",
    "all_to_all_single",
    "reduce_scatter_tensor",
    "all_reduce",
    "persistent_all_gather_into_tensor",
    "persistent_all_to_all_single",
    "persistent_reduce_scatter_tensor",
    "persistent_all_reduce",
    "reserve_graph_workspace",
    "PersistentCollective",
    "empty",
    "release",
    "set_options",
    "destroy",
    "get_group",
    "get_communicator",
    "overlap",
    "run_concurrently",
    "get_plan",
    "set_eager_path",
    "Work",
    "Algorithm",
    "StreamMode",
    "CollectiveError",
    "CollectiveTimeout",
    "GroupBroken",
    "InvalidArgument",
    "UnsupportedGroup",
]
