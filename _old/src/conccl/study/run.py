"""``conccl study``: measured on the GPUs here, or predicted from a hardware profile without them."""
from __future__ import annotations

import pathlib
import sys

from ..profile import load_profile, profile_from_study
from . import report
from .measure import StudyConfig, StudyError, required_bytes, study_worker
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


def predicted(scenarios, out_dir, world: int | None, quick: bool, profile_path, meta: dict) -> dict:
    from .model import predict

    prof = load_profile(profile_path)
    world = world or prof.world
    check_fits(scenarios, world, prof.memory_bytes, quick)
    meta = dict(meta, profile=str(profile_path or "embedded: " + prof.device + f" x{prof.world} "
                                  f"({prof.source.get('date')}, commit {prof.source.get('commit')})"), world=world)
    doc = predict(prof, scenarios, world, quick, meta)
    report.render(out_dir, doc)
    return doc


def measured(scenarios, out_dir, world: int, quick: bool, meta: dict, memory_bytes: int,
             use_ncu: bool = True, plan_profile: str | None = None, side_by_side: bool = False) -> tuple[dict, bool]:
    """Run on ``world`` GPUs; (document, finished). An interrupted run's report says INCOMPLETE."""
    from ..launch import run_per_gpu, under_torchrun
    from . import ncu

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
        doc = run_per_gpu(study_worker, cfg, nprocs=None if under_torchrun() else world, timeout_s=24 * 3600)[0]
    except (RuntimeError, StudyError) as e:
        try:
            doc = report.load_results(out_dir)
        except ValueError:
            raise StudyError(f"the study failed before measuring anything: {e}") from None
        doc["complete"] = False
        doc["error"] = str(e).splitlines()[0][:300]
        report.render(out_dir, doc)
        print(f"conccl study: stopped early: {e}", file=sys.stderr)
        return doc, False
    if doc is None:  # a non-zero rank under torchrun
        return {}, True
    report.render(out_dir, doc)
    if doc.get("complete"):
        prof = profile_from_study(doc)
        (pathlib.Path(out_dir) / "profile.json").write_text(prof.to_json())
    return doc, bool(doc.get("complete"))

