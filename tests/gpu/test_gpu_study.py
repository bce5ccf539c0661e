"""GPU tier: a two-scenario quick study, measured, end to end through the CLI.

Skipped without 2 GPUs (conftest.py)."""
from __future__ import annotations

import pytest

from conccl.cli import main
from conccl.planner.profile import load_profile
from conccl.study.results import SCHEMA, load_results

torch = pytest.importorskip("torch")


def test_quick_study_measures_every_strategy_correctly(tmp_path):
    out = tmp_path / "study"
    rc = main(["study", "--quick", "--only", "cb1_896M/all_gather,dec1_64M/all_to_all", "--out", str(out)])
    assert rc == 0
    doc = load_results(out)
    assert doc.schema == SCHEMA and doc.kind == "measured" and doc.complete
    ids = [s.id for s in doc.scenarios]
    assert ids == ["cb1_896M/all_gather", "dec1_64M/all_to_all"]
    sm = doc.machine.sm_count
    for s in doc.scenarios:
        assert s.t_gemm.n >= 9 and s.t_comm["nccl"].n >= 9
        if s.id.startswith("dec1"):  # a 0.14 ms GEMM gets more timed runs than 9 (20 ms of them)
            assert s.t_gemm.n > 9 and s.t_comm["nccl"].n > 9
        # auto and the fastest strategy were timed again in turns, both correct
        turns = s.auto_in_turns
        assert turns.correct is True and turns.auto_ms.n >= 9, turns
        for name, st in s.strategies.items():
            assert st.correct is True, (s.id, name)
        # the partitioned strategies really ran the GEMM on fewer SMs (a green context)
        assert all(r.gemm_sms is None or r.gemm_sms < sm for r in s.runs["c3_rp"])
        assert set(s.strategies) >= {"c3_base", "c3_sp", "c3_rp", "c3_sp_rp", "conccl", "conccl_rp"}
    # the eager sweep: both public functions of every collective at every quick size up to
    # 256 MiB, outputs equal, and the profile's eager table planned from it (no note that it
    # fell back to persistent ops)
    eager = {(r.collective, r.size, r.impl): r for r in doc.eager_sizes}
    assert set(eager) == {(c, size, impl) for c in ("all_gather", "all_to_all", "reduce_scatter", "all_reduce")
                          for size in (1 << 20, 16 << 20, 256 << 20)
                          for impl in ("conccl", "nccl")}
    assert all(r.correct is True and r.time_ms.n >= 9 and r.time_ms.median > 0 for r in eager.values())
    report = (out / "report.md").read_text()
    assert report.startswith("# conccl study") and "eager calls on ordinary tensors" in report
    prof = load_profile(out / "profile.json")
    assert prof.world == doc.machine.world and set(prof.eager_sweep) == {"conccl", "nccl"}
    from conccl.planner.eager import eager_table
    assert eager_table(prof, ("all_gather", "all_to_all", "reduce_scatter", "all_reduce"), prof.world)["note"] is None
    assert len(list((out / "figures").glob("*.png"))) >= 5
