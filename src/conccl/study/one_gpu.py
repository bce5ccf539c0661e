"""``conccl study`` with one GPU: what one GPU can measure, measured; the rest predicted.

Measured here, each part labelled so in the report (``StudyResults.parts``): the peak HBM
bandwidth, every GEMM of the suite losing SMs to a green context (its time on every SM is the
bf16 peak), and every GEMM beside copy-engine copies (:meth:`_MeasuredStudy.copy_beside_gemm`).
Predicted: the collectives alone and every scenario's strategies, by the planner's model
(:mod:`conccl.study.model`) from the hardware profile the runtime would choose for this GPU
(:mod:`conccl.planner.shipped`; ``--profile`` to name one), with this GPU's measured
numbers folded in where the profile had its own: SMs, memory, bf16 and HBM peaks, GEMM
efficiencies and SM-loss tables. No collective runs, so none is checked; no profile.json is
written (half of it would be the profile's own numbers). The tensor-parallel decomposition,
which one GPU measures whole, is ``conccl study tp``.
"""
from __future__ import annotations

import dataclasses
import pathlib
import statistics
import sys

import torch

from .. import runtime
from ..launch import run_per_gpu
from ..planner.profile import HardwareProfile
from . import analysis, report
from .config import StudyConfig, StudyError
from .measure import _MeasuredStudy
from .model import gemm_ms, predict
from .results import StudyResults, save_results
from .rig import Rig
from .run import describe_profile, fitting
from .scenarios import parse_gemm

MEASURED = ("hbm", "gemm_sm_loss", "copy_beside_gemm")
PREDICTED = ("collectives", "scenarios")


def one_gpu_worker(rank: int, world: int, cfg: StudyConfig) -> StudyResults:
    """The GPU's own measurements (one process, a process group of one)."""
    rig = Rig(rank, world, cfg)
    gemms = len({s.gemm.tag for s in cfg.scenarios})
    study = _MeasuredStudy(rig, cfg, steps=1 + 2 * gemms)
    study.save = lambda: None  # the document written is the whole one-GPU study, made afterwards
    study.hbm_bandwidth()
    study.gemm_sm_sweeps()
    analysis.set_gemm_peaks(study.res)
    study.copy_beside_gemm()
    study.progress.close()
    return study.res


def fold_in(prof: HardwareProfile, own: StudyResults) -> HardwareProfile:
    """``prof`` with this GPU's measurements in place of its own: the GPU, its peaks, and the
    GEMM efficiency and SM-loss tables of each GEMM class (the class by the profile's roofline)."""
    m, peaks = own.machine, own.peaks
    local = dataclasses.replace(prof, device=m.device, sm_count=m.sm_count, memory_bytes=m.memory_bytes,
                                nvlinks=m.nvlinks, bf16_flops=peaks.bf16_flops, hbm_bytes_per_s=peaks.hbm_bytes_per_s)
    base = {r.gemm: r for r in own.gemm_sm_loss if r.sms_taken == 0}
    eff: dict = {}
    loss: dict = {}
    for tag, r in base.items():
        _, cls = gemm_ms(local, parse_gemm(r.mnk, tag))
        peak = r.flops / peaks.bf16_flops if cls == "compute-bound" else r.bytes / peaks.hbm_bytes_per_s
        eff.setdefault(cls, []).append(peak / (r.time_ms.median / 1e3))  # fraction of the peak reached
        for row in own.gemm_sm_loss:
            if row.gemm == tag:
                loss.setdefault(cls, {}).setdefault(row.sms_taken, []).append(row.time_ms.median / r.time_ms.median)
    return dataclasses.replace(
        local, gemm_efficiency={**prof.gemm_efficiency, **{c: statistics.median(v) for c, v in eff.items()}},
        gemm_sm_loss={**prof.gemm_sm_loss, **{c: {k: statistics.median(v) for k, v in sorted(t.items())}
                                              for c, t in loss.items()}})


def one_gpu(scenarios, out_dir, quick: bool, meta: dict, memory_bytes: int, profile_path: str | None,
            world: int | None, own: bool = False) -> StudyResults:
    """Measure this GPU's part, predict the rest for a node of ``world`` such GPUs (default:
    the profile's world), write the report; returns the results."""
    device = torch.cuda.get_device_name(0)
    choice = runtime.profile_choice(profile_path, device, world)
    world = world or choice.profile.world
    scenarios, skipped = fitting(scenarios, world, memory_bytes, own)
    print(f"# conccl study: ONE GPU ({device}): measuring HBM, {len({s.gemm.tag for s in scenarios})} GEMMs' SM "
          f"loss and copy-engine copies beside them; predicting {len(scenarios)} scenarios at {world} GPUs from "
          f"{choice.note}", file=sys.stderr, flush=True)
    cfg = StudyConfig(scenarios=scenarios, quick=quick, out_dir=str(out_dir), meta=meta, memory_bytes=memory_bytes,
                      plan_profile=profile_path)
    try:
        own_res = run_per_gpu(one_gpu_worker, cfg, nprocs=1, timeout_s=6 * 3600)[0]
    except RuntimeError as e:  # the worker's traceback: one line here, the rest with --debug
        raise StudyError(f"the one-GPU study failed: {str(e).splitlines()[0][:300]}") from e
    local = fold_in(choice.profile, own_res)
    source = describe_profile(choice.profile, choice.path)
    res = predict(local, scenarios, world, quick, dict(meta, world=world, profile=f"{source}, with this "
                                                                                 f"{device}'s measurements folded in"))
    res.skipped = skipped
    res.machine = dataclasses.replace(own_res.machine, world=world)
    res.peaks.bf16_flops, res.peaks.hbm_bytes_per_s = own_res.peaks.bf16_flops, own_res.peaks.hbm_bytes_per_s
    res.gemm_sm_loss, res.copy_beside_gemm = own_res.gemm_sm_loss, own_res.copy_beside_gemm
    res.parts = {**{p: "measured on this GPU" for p in MEASURED},
                 **{p: f"predicted from {choice.profile.device} x{choice.profile.world} ({choice.path})"
                    for p in PREDICTED}}
    out = pathlib.Path(out_dir)
    save_results(out, res)
    report.render(out, res)
    return res
