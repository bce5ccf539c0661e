"""The one-GPU study without a GPU: this GPU's measurements folded into the chosen profile,
the rest predicted from it, every part labelled in the report."""
from __future__ import annotations

import dataclasses

from conccl.planner.profile import EMBEDDED, load_profile
from conccl.study import report
from conccl.study.model import gemm_ms, predict
from conccl.study.one_gpu import MEASURED, PREDICTED, fold_in
from conccl.study.results import (CopyBesideGemm, GemmSmLoss, Machine, Peaks, RunConfig, StudyResults, Timing,
                                  load_results, save_results)
from conccl.study.scenarios import load_suite, select


def _own(prof, gemms, slower: float):
    """A pretend GPU ``slower`` times the profile's at every GEMM, losing SMs as it says."""
    res = StudyResults(kind="measured", meta={}, config=RunConfig(quick=True, warmup=1, iters=1, world=1),
                       machine=Machine(device="NVIDIA H100 80GB HBM3", sm_count=132, memory_bytes=80 << 30, world=1,
                                       nvlinks=18),
                       peaks=Peaks(hbm_bytes_per_s=3.0e12))
    for g in gemms:
        t0 = gemm_ms(prof, g)[0] * slower
        for k, slow in ((0, 1.0), (16, 1.2), (64, 1.9)):
            res.gemm_sm_loss.append(GemmSmLoss(gemm=g.tag, mnk=g.mnk, flops=g.flops, bytes=g.bytes(), sms_taken=k,
                                               sms_granted=132 - k, time_ms=Timing.point(t0 * slow)))
        res.copy_beside_gemm.append(CopyBesideGemm(gemm=g.tag, mnk=g.mnk, kind="d2d", copy_bytes=1 << 30,
                                                   gemm_ms=Timing.point(t0), copy_ms=Timing.point(0.5),
                                                   together_ms=Timing.point(t0 * 1.1)))
    res.peaks.bf16_flops = max(r.flops / (r.time_ms.median / 1e3) for r in res.gemm_sm_loss if r.sms_taken == 0)
    return res


def test_measured_numbers_replace_the_profiles_and_the_report_labels_each_part(tmp_path):
    prof = load_profile(EMBEDDED)
    scenarios = select(load_suite(), quick=True)
    gemms = list({s.gemm.tag: s.gemm for s in scenarios}.values())
    own = _own(prof, gemms, slower=1.25)
    local = fold_in(prof, own)
    assert local.device == "NVIDIA H100 80GB HBM3" and local.nvlinks == 18
    assert local.hbm_bytes_per_s == 3.0e12 and local.bf16_flops == own.peaks.bf16_flops
    for cls, table in local.gemm_sm_loss.items():
        if cls in {gemm_ms(local, g)[1] for g in gemms}:
            assert table[16] == 1.2 and table[64] == 1.9  # this GPU's SM loss, not the profile's
    # the folded profile predicts this GPU's GEMM times (within the roofline's class choice)
    for r in own.gemm_sm_loss:
        if r.sms_taken == 0:
            g = next(g for g in gemms if g.tag == r.gemm)
            assert abs(gemm_ms(local, g)[0] / r.time_ms.median - 1) < 0.35
    res = predict(local, scenarios, 2, True, {"profile": "test"})
    res.copy_beside_gemm = own.copy_beside_gemm
    res.parts = {**{p: "measured on this GPU" for p in MEASURED}, **{p: "predicted from X" for p in PREDICTED}}
    save_results(tmp_path, res)
    report.render(tmp_path, res, quiet=True)
    md = (tmp_path / "report.md").read_text()
    assert "ONE GPU: part measured, part PREDICTED" in md and "No GPU ran" not in md
    assert "GEMMs beside copy-engine copies" in md and "| d2d 1024 MiB |" in md
    back = load_results(tmp_path)
    assert back.parts == res.parts and len(back.copy_beside_gemm) == len(gemms)
    assert all(abs(r.efficiency - 100 * max(r.gemm_ms.median, 0.5) / r.together_ms.median) < 1e-9
               for r in back.copy_beside_gemm)


def test_one_gpu_predicts_a_node_of_the_profile_chosen_for_this_gpu(tmp_path, monkeypatch):
    """one_gpu() whole, with the GPU's worker pretended: the shipped H100 profile is chosen for an
    H100, the node predicted at its world, the measured rows kept, the report written."""
    import torch

    from conccl.study import one_gpu as mod

    monkeypatch.delenv("CONCCL_PROFILE", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    scenarios = select(load_suite(), quick=True)
    gemms = list({s.gemm.tag: s.gemm for s in scenarios}.values())
    own = _own(load_profile(EMBEDDED), gemms, slower=1.1)
    monkeypatch.setattr(mod, "run_per_gpu", lambda fn, cfg, nprocs, timeout_s: [own] if nprocs == 1 else None)
    res = mod.one_gpu(scenarios, tmp_path, True, {"date": "d", "commit": "c"}, 80 << 30, None, None)
    assert res.kind == "prediction" and res.world == 2 and res.machine.device == "NVIDIA H100 80GB HBM3"
    assert set(res.parts) == {*MEASURED, *PREDICTED} and "h100x2_profile.json" in res.parts["scenarios"]
    assert res.gemm_sm_loss is own.gemm_sm_loss and len(res.scenarios) == len(scenarios)
    assert res.peaks.hbm_bytes_per_s == 3.0e12
    back = load_results(tmp_path)
    assert back.parts == res.parts and (tmp_path / "report.md").exists()


def test_a_broken_copy_row_is_refused_where_it_is_read(tmp_path):
    import json

    import pytest

    from conccl.study.results import ResultsError

    prof = load_profile(EMBEDDED)
    scenarios = select(load_suite(), quick=True)
    res = predict(prof, scenarios, 2, True, {})
    res.copy_beside_gemm = _own(prof, [scenarios[0].gemm], 1.0).copy_beside_gemm
    save_results(tmp_path, res)
    doc = json.loads((tmp_path / "results.json").read_text())
    doc["copy_beside_gemm"][0]["together_ms"]["median"] = 0
    (tmp_path / "results.json").write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=r"copy_beside_gemm\[0\]\.together_ms"):
        load_results(tmp_path)
