"""Which engine an eager call with nothing beside it should run on: NCCL or the copy engines.

Where no computation competes, the faster call alone wins: a pure function of the profile's
measured sweeps. The evidence is the eager sweep where the profile has one (``eager_sweep``:
the public functions called eagerly on ordinary tensors, back to back, seconds per call with
the host's part and conccl's staging copy in it: what an eager call costs), else the size
sweep of persistent ops on peer-mapped buffers (``comm_sweep``), which leaves conccl's host
time and staging copy out and so flatters it: its crossovers came out 4-16x too small on
2 x H100 (docs/results.md, the planner). Above the eager sweep's largest
size (256 MiB) its verdict there holds: the size sweep's larger sizes still leave the staging
copy out, which grows with the size (an all-to-all on plain tensors lost by 1.3x at 256 MiB
eagerly and tied as a persistent op at 1 GiB).

:func:`nccl_below` gives, per collective, the output bytes per rank below which NCCL alone was
faster: the smallest measured size from which conccl was within :data:`TOLERANCE` of NCCL at
that size and at every larger one (within it the copy engines keep the SMs free for whatever
else runs, at a cost inside the run-to-run spread of a single size: 0.4% decided all-gather at
64 MiB on the shipped profile). Between two measured sizes the larger one's verdict holds, so a call takes NCCL
unless conccl won at the next size up; below the smallest measured size NCCL is assumed faster
(every measurement so far, and the paper: copy-engine collectives lose where latency rules).
A collective the profile did not sweep for both (the shipped profile has no reduce-scatter or
all-reduce) borrows the largest crossover of those it did sweep, and the table's note says so:
erring towards NCCL at small sizes, where every copy-engine collective measured so far lost
(a reducing one has more signal rounds per call, not fewer). A profile with no sweep at all
gives an empty table: every call stays on the copy engines.

Beside a computation the answer differs (NCCL's kernels take SMs from it): that is the
planner's job (:func:`conccl.overlap`), not this table's.
"""
from __future__ import annotations

import sys

from .profile import HardwareProfile

ALWAYS = sys.maxsize  # conccl lost at every measured size: every call goes to NCCL
TOLERANCE = 1.05  # conccl's time within 5% of NCCL's counts as a win (the bound for eager auto)


def has_eager_sweep(p: HardwareProfile, collective: str) -> bool:
    """Whether ``p``'s eager sweep timed ``collective`` with both implementations."""
    return all(p.eager_sweep.get(impl, {}).get(collective) for impl in ("conccl", "nccl"))


def _points(p: HardwareProfile, impl: str, collective: str, eager: bool) -> dict:
    """{size: seconds per call} of ``impl``: the eager sweep's (``eager``) or the size sweep's."""
    sweep = p.eager_sweep if eager else p.comm_sweep
    return dict(map(tuple, sweep.get(impl, {}).get(collective, ())))


def nccl_below(p: HardwareProfile, collective: str) -> int | None:
    """Output bytes per rank below which NCCL beat conccl in ``p``'s sweeps (:data:`ALWAYS`
    where conccl lost even at the largest size); None where they lack either implementation
    for ``collective``. The eager sweep counts where it has both implementations."""
    eager = has_eager_sweep(p, collective)
    ce, sm = _points(p, "conccl", collective, eager), _points(p, "nccl", collective, eager)
    sizes = sorted(set(ce) & set(sm))
    if not sizes:
        return None
    threshold = ALWAYS
    for size in reversed(sizes):  # walk down while conccl keeps winning
        if ce[size] > TOLERANCE * sm[size]:
            break
        threshold = size
    return threshold


def eager_table(p: HardwareProfile, collectives, world: int) -> dict:
    """{"nccl_below": {collective: bytes}, "note": str | None}: the table for ``collectives``
    from ``p``, and why it may not hold (``world`` differs from the profile's)."""
    measured = {name: nccl_below(p, name) for name in collectives}
    table = {name: limit for name, limit in measured.items() if limit is not None}
    notes = []
    borrowed = [name for name, limit in measured.items() if limit is None]
    if table and borrowed:
        limit = max(table.values())
        table.update({name: limit for name in borrowed})
        said = "NCCL at every size" if limit == ALWAYS else f"{limit} bytes"
        notes.append(f"{', '.join(borrowed)} in neither of the profile's sweeps: the largest measured crossover "
                     f"({said}) borrowed")
    alone = [name for name in table if name not in borrowed and not has_eager_sweep(p, name)]
    if alone:
        notes.append(f"{', '.join(alone)} from the size sweep of persistent ops (no eager sweep in the profile): "
                     "an eager call's host time and staging copy are left out, which favours the copy engines; "
                     "a measured `conccl study` adds the eager sweep (`--resume` adds it to a finished one)")
    if world != p.world:
        notes.append(f"crossover sizes measured on {p.world} GPUs, applied to {world}: per-rank sizes at which copy "
                     "engines overtake NCCL move with the world size; measure this machine (`conccl study`) for its own")
    return {"nccl_below": table, "note": "; ".join(notes) or None}
