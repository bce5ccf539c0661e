"""``conccl study``: measured on the GPUs here, or predicted from a hardware profile without them."""
from __future__ import annotations

import os
import pathlib
import sys

from ..jsonfile import write_text
from ..launch import run_per_gpu, under_torchrun
from ..planner import timing
from ..planner.profile import EMBEDDED, load_profile
from . import ncu, report
from .config import StudyConfig, StudyError, scenario_bytes
from .measure import study_worker
from .model import new_prediction, predict
from .profile_fit import profile_from_study
from .results import ResultsError, Skipped, StudyResults, load_results, save_results
from .scenarios import Scenario


def fitting(scenarios: list[Scenario], world: int, memory_bytes: int, own: bool = False) -> tuple[list, list]:
    """(the scenarios that fit in one GPU's ``memory_bytes``, a :class:`Skipped` for each that
    does not), each scenario judged alone (its arenas are allocated for it, config.arena_plan).
    A suite scenario that cannot fit is skipped, said on the console; the user's own (``own``)
    is refused with a StudyError, as is a selection of which nothing fits."""
    run, skipped = [], []
    for s in scenarios:
        need = scenario_bytes(s, world)
        if need <= memory_bytes:
            run.append(s)
            continue
        why = (f"needs {need / 2**30:.1f} GiB per GPU at {world} ranks (GEMM {s.gemm.mnk} operands, collective "
               f"buffers, workspace), a GPU has {memory_bytes / 2**30:.1f} GiB")
        if own:
            raise StudyError(f"scenario {s.id} {why}; give a smaller --gemm or --size")
        skipped.append(Skipped(id=s.id, reason=why))
    if not run:
        least = min(scenario_bytes(s, world) for s in scenarios)
        raise StudyError(f"no selected scenario fits in a GPU of {memory_bytes / 2**30:.1f} GiB (the smallest needs "
                         f"{least / 2**30:.1f} GiB at {world} ranks); select smaller ones with --only")
    if os.environ.get("RANK", "0") == "0":  # under torchrun, once
        for sk in skipped:
            print(f"conccl study: skipping {sk.id}: it {sk.reason}", file=sys.stderr)
    return run, skipped


def describe_profile(prof, path) -> str:
    """Where a prediction's numbers came from: the file, the machine, the date and the commit."""
    src = prof.source
    return (f"{path or 'embedded (conccl/data/' + EMBEDDED.name + ')'}: {prof.device} x{prof.world}, measured on "
            f"{src.get('machine_kind', 'an unnamed machine')} {src.get('date', 'at an unrecorded date')}, "
            f"commit {src.get('commit', 'unrecorded')}")


def predicted(scenarios, out_dir, world: int | None, quick: bool, profile_path, meta: dict,
              resume: StudyResults | None = None, notice: str | None = None, profile=None,
              own: bool = False) -> StudyResults:
    """Predict the report from a hardware profile (``profile``, else read from ``profile_path``),
    saving after every scenario; on Ctrl-C the report is drawn from what was predicted, labelled
    partial, and the interrupt goes on up. ``notice`` is printed once the input is checked."""
    prof = profile or load_profile(profile_path)
    world = world or prof.world
    scenarios, skipped = fitting(scenarios, world, prof.memory_bytes, own)
    unmeasured = sorted({s.collective for s in scenarios for impl in ("nccl", "conccl")
                         if timing.comm_time(prof, impl, s.collective, s.size_for(world), world) is None})
    if unmeasured:
        raise StudyError(f"the profile has no measurements of {', '.join(unmeasured)}, so it cannot predict them; "
                         "a measured study that runs them (on GPUs) writes a profile that can")
    meta = dict(meta, profile=describe_profile(prof, profile_path), world=world,
                extrapolated=timing.extrapolation(prof, world))
    if resume is not None:
        check_resumable(resume, "prediction", world, quick)
        resume.meta = resumed_meta(resume, meta)
    if notice:
        print(notice, file=sys.stderr)
    out = pathlib.Path(out_dir)
    res = resume or new_prediction(prof, scenarios, world, quick, meta)
    res.complete, res.error, res.skipped = False, None, skipped
    try:
        predict(prof, scenarios, world, quick, meta, res, save=lambda: save_results(out, res))
    except BaseException as e:  # Ctrl-C or a crash: keep what was predicted, then let it go on up
        stopped(out, res, "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt)
                else f"stopped by an error: {type(e).__name__}: {str(e)[:200]}")
        raise
    report.render(out, res)
    return res


def check_resumable(res: StudyResults, kind: str, world: int, quick: bool) -> None:
    """Refuse to continue a study under other settings than it started with. A finished
    measured study from before the eager sweep (no ``eager_sizes``) may be continued: the run
    adds the sweep and a profile that plans ``set_eager_path("auto")`` from it."""
    if res.complete and not (res.kind == kind == "measured" and not res.eager_sizes):
        raise StudyError("--resume: that study is complete; nothing to continue (`conccl study --report DIR` draws "
                         "its report again; --force starts it over)")
    if res.kind != kind:
        raise StudyError(f"--resume: that study is a {res.kind}, this run would be a {kind} "
                         f"({'drop' if kind == 'prediction' else 'add'} --predict to continue it)")
    if res.world != world or res.config.quick != quick:
        raise StudyError(f"--resume: that study ran on {res.world} GPUs{' with --quick' if res.config.quick else ''}; "
                         f"continue it with the same --gpus and {'--quick' if res.config.quick else 'no --quick'}")


def resumed_meta(res: StudyResults, meta: dict) -> dict:
    """This run's environment, and where the part it continues came from (a commit may differ)."""
    return dict(meta, resumed_from=f"{res.meta.get('date', '?')}, commit {res.meta.get('commit', '?')}, "
                                   f"{len(res.scenarios)} scenario(s) done")


def stopped(out, res: StudyResults, why: str) -> None:
    """Mark ``res`` partial, then save it and draw its report (both written whole or not at all)."""
    res.complete, res.error = False, why
    report.render(out, res, quiet=True)
    print(f"conccl study: {why}: {len(res.scenarios)} scenario(s) done, report labelled PARTIAL in {out}; "
          f"continue with: conccl study --out {out} --resume (and the same options)", file=sys.stderr)


def measured(scenarios, out_dir, world: int, quick: bool, meta: dict, memory_bytes: int, use_ncu: bool = True,
             plan_profile: str | None = None, side_by_side: bool = False,
             resume: StudyResults | None = None, own: bool = False) -> tuple[StudyResults | None, bool]:
    """Run on ``world`` GPUs; (results, finished), results None on a non-zero rank under
    torchrun. A run that stops (a crash, Ctrl-C) keeps what it measured, marked incomplete,
    with a report labelled PARTIAL; ``resume`` (that run's results) continues it."""
    scenarios, skipped = fitting(scenarios, world, memory_bytes, own)
    if resume is not None:
        check_resumable(resume, "measured", world, quick)
        resume.meta = resumed_meta(resume, meta)
    counters = {}
    if use_ncu and not under_torchrun():
        if ncu.available():
            print("# reading GEMM DRAM/L2 bytes with ncu on GPU 0", file=sys.stderr, flush=True)
        counters = ncu.gemm_counters({s.gemm.tag: s.gemm for s in scenarios}.values())
    cfg = StudyConfig(scenarios=scenarios, quick=quick, out_dir=str(out_dir), meta=meta, ncu=counters,
                      memory_bytes=memory_bytes, skipped=skipped,
                      plan_profile=plan_profile, side_by_side=side_by_side, resume=resume)
    print(f"# conccl study: {len(scenarios)} scenarios on {world} GPUs -> {out_dir}", file=sys.stderr, flush=True)
    try:
        res = run_per_gpu(study_worker, cfg, nprocs=None if under_torchrun() else world, timeout_s=24 * 3600)[0]
    except (RuntimeError, StudyError, KeyboardInterrupt) as e:
        try:
            res = load_results(out_dir)  # rank 0 saved it after every step
        except ResultsError:
            if isinstance(e, KeyboardInterrupt):
                raise
            raise StudyError(f"the study failed before measuring anything: {e}") from None
        stopped(out_dir, res, "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt)
                else "stopped early: " + str(e).splitlines()[0][:300])
        if isinstance(e, KeyboardInterrupt):
            raise
        return res, False
    if res is None:  # a non-zero rank under torchrun
        return None, True
    report.render(out_dir, res)
    if res.complete:
        write_text(pathlib.Path(out_dir) / "profile.json", profile_from_study(res).to_json())
    return res, res.complete
