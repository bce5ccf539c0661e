"""``conccl study``: measured on the GPUs here, or predicted from a hardware profile without them."""
from __future__ import annotations

import pathlib
import sys

from ..launch import run_per_gpu, under_torchrun
from ..planner.profile import load_profile
from . import ncu, report
from .measure import StudyConfig, StudyError, required_bytes, study_worker
from .model import predict
from .profile_fit import profile_from_study
from .results import ResultsError, StudyResults, load_results
from .scenarios import Scenario


def check_fits(scenarios: list[Scenario], world: int, memory_bytes: int, quick: bool) -> None:
    """Refuse, before anything runs, a scenario that cannot fit in one GPU's memory."""
    for s in scenarios:
        need = required_bytes([s], world, quick)
        if need > memory_bytes:
            raise StudyError(f"scenario {s.id} needs {need / 2**30:.1f} GiB per GPU (GEMM {s.gemm.mnk} operands, "
                             f"collective buffers, workspace) but a GPU has {memory_bytes / 2**30:.1f} GiB")
    need = required_bytes(scenarios, world, quick)
    if need > memory_bytes:
        raise StudyError(f"the scenarios together need {need / 2**30:.1f} GiB per GPU (the collective buffers are "
                         f"allocated once for the largest), a GPU has {memory_bytes / 2**30:.1f} GiB; "
                         "run them in smaller groups with --only")


def predicted(scenarios, out_dir, world: int | None, quick: bool, profile_path, meta: dict) -> StudyResults:
    prof = load_profile(profile_path)
    world = world or prof.world
    check_fits(scenarios, world, prof.memory_bytes, quick)
    meta = dict(meta, profile=str(profile_path or "embedded: " + prof.device + f" x{prof.world} "
                                  f"({prof.source.get('date')}, commit {prof.source.get('commit')})"), world=world)
    res = predict(prof, scenarios, world, quick, meta)
    report.render(out_dir, res)
    return res


def measured(scenarios, out_dir, world: int, quick: bool, meta: dict, memory_bytes: int, use_ncu: bool = True,
             plan_profile: str | None = None, side_by_side: bool = False) -> tuple[StudyResults | None, bool]:
    """Run on ``world`` GPUs; (results, finished), results None on a non-zero rank under
    torchrun. An interrupted run's report says INCOMPLETE."""
    check_fits(scenarios, world, memory_bytes, quick)
    counters = {}
    if use_ncu and not under_torchrun():
        if ncu.available():
            print("# reading GEMM DRAM/L2 bytes with ncu on GPU 0", file=sys.stderr, flush=True)
        counters = ncu.gemm_counters({s.gemm.tag: s.gemm for s in scenarios}.values())
    cfg = StudyConfig(scenarios=scenarios, quick=quick, out_dir=str(out_dir), meta=meta, ncu=counters,
                      plan_profile=plan_profile, side_by_side=side_by_side)
    print(f"# conccl study: {len(scenarios)} scenarios on {world} GPUs -> {out_dir}", file=sys.stderr, flush=True)
    try:
        res = run_per_gpu(study_worker, cfg, nprocs=None if under_torchrun() else world, timeout_s=24 * 3600)[0]
    except (RuntimeError, StudyError) as e:
        try:
            res = load_results(out_dir)
        except ResultsError:
            raise StudyError(f"the study failed before measuring anything: {e}") from None
        res.complete = False
        res.error = str(e).splitlines()[0][:300]
        report.render(out_dir, res)
        print(f"conccl study: stopped early: {e}", file=sys.stderr)
        return res, False
    if res is None:  # a non-zero rank under torchrun
        return None, True
    report.render(out_dir, res)
    if res.complete:
        prof = profile_from_study(res)
        (pathlib.Path(out_dir) / "profile.json").write_text(prof.to_json())
    return res, res.complete

