"""A group's defaults (:class:`Options`), some of them read from the environment for new groups.

The environment is read through :mod:`conccl.env` when an :class:`Options` is made (a group's
creation, unless the caller passes its own): ``CONCCL_ONE_SHOT_BELOW`` (a size),
``CONCCL_OWN_CHUNK_VIA_PEER`` (a flag) and ``CONCCL_DISABLE=post_settled``. Each rank reads its
own; ``set_options`` changes them later, per rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as _field
from datetime import timedelta

from .. import env
from ..errors import InvalidArgument
from ..schedule.base import Algorithm, StreamMode

__all__ = ["DEFAULT_TIMEOUT", "Options"]

DEFAULT_TIMEOUT = timedelta(minutes=10)  # torch.distributed's default for NCCL groups


def _one_shot_below() -> int:
    try:
        return env.get("CONCCL_ONE_SHOT_BELOW")
    except env.EnvError as e:
        raise InvalidArgument(str(e)) from None


@dataclass
class Options:
    """Per-group defaults, chosen from measurements (see README)."""

    # None: push when every rank's output is peer-reachable (the fastest path measured on
    # H200 x4), otherwise pull through the staging workspace.
    algorithm: Algorithm | None = None
    # One stream measured fastest on H200 x4 (benchmarks/): its pulls visit peers in a
    # rotation, so each GPU is read by one peer at a time, and the own shard goes last. Its
    # peer copies as one cudaMemcpyBatchAsync took 13 us less GPU time per call than one
    # cudaMemcpyAsync after another, and as much bandwidth or more at large sizes.
    stream_mode: StreamMode = StreamMode.BATCH
    timeout: timedelta = DEFAULT_TIMEOUT
    # False skips the mismatch checks and the watchdog: for measuring what they cost only, as
    # a dead peer then hangs the GPU stream for good.
    checks: bool = True
    # collective name -> output bytes per rank below which an eager call goes to the group's
    # torch.distributed backend (NCCL) instead of the copy engines: where NCCL alone is faster
    # (conccl.set_eager_path("auto") fills it from a hardware profile). Empty: copy engines
    # always. Every rank must hold the same table (the ranks must route a call alike).
    nccl_below: dict = _field(default_factory=dict)
    # Output bytes per rank below which a call of the public functions runs as one small SM
    # kernel instead of copy engines (conccl.collectives.one_shot): 0 never (the default: copy
    # engines only, no SM). A call runs one-shot only where every rank's would (agreed on the
    # board per call). CONCCL_ONE_SHOT_BELOW sets it for new groups (a bad size raises
    # InvalidArgument naming the variable).
    one_shot_below: int = _field(default_factory=_one_shot_below)
    # A call whose rows were alike on every rank for POST_AFTER calls in a row posts its row on
    # the board and goes on without waiting for the peers' (HostBoard.post); the peers' rows
    # are compared at this rank's next call, and a mismatch then breaks the group (the call ran
    # on rows some rank did not have). Only calls that write nothing of a peer's but its
    # workspace, and grow no workspace (conccl.group.agreement). False: every call waits for
    # every peer's row (a mismatch is refused before anything moves, always).
    # CONCCL_DISABLE=post_settled sets False for new groups.
    post_settled: bool = _field(default_factory=lambda: not env.disabled("post_settled"))
    # True: a push all-gather's own chunk is read back from the first peer's output on a copy
    # engine instead of copied on this GPU, where the copy is an SM kernel and so waits behind
    # a running GEMM (~1 ms beside an 8192^3 bf16 GEMM) (Collective.own_chunk_via_peer). Costs
    # the chunk once more over the link from that peer; each rank's own choice.
    # CONCCL_OWN_CHUNK_VIA_PEER=1 sets it for new groups.
    own_chunk_via_peer: bool = _field(default_factory=lambda: env.get("CONCCL_OWN_CHUNK_VIA_PEER"))
