"""CPU tier: the planner's heuristics, time model, profile reader and writer, fit, evaluation,
plan cache and CLI."""
from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

import conccl
from conccl import runtime
from conccl.cli import main
from conccl.errors import InvalidArgument
from conccl.planner import (Kernel, PlanError, candidates, copy_engine_sms, launch_order, plan, plan_auto,
                            plan_strategy, resource_partition, workload)
from conccl.planner import timing
from conccl.planner.fit import Observation, fit_interference
from conccl.planner.profile import EMBEDDED, FORMAT, HardwareProfile, ProfileError, load_profile
from conccl.study import analysis
from conccl.study.evaluate import evaluate, markdown
from conccl.study.results import AutoInTurns, Run, RunConfig, StudyResults, Timing, load_results

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
STUDY = FIXTURES / "study-v1"  # a measured H200 x4 study, 7 of its scenarios
GiB, MiB = 1 << 30, 1 << 20


def study() -> StudyResults:
    return analysis.derive(load_results(STUDY))


def ms(t: float) -> Timing:
    return Timing(t, t, t, 9)


def mi300x_profile() -> HardwareProfile:
    """The paper's MI300X, from its own figures: 304 CUs; 70% of peak everywhere (V-C); RCCL and
    ConCCL on par above 32 MB, ConCCL up to 4x slower below (Fig. 9); memory-bound GEMMs speed
    up losing 8 CUs, compute-bound ones lose 17-27% at 32-64 CUs (Fig. 5a); all-gather needs
    32 CUs and all-to-all 64 (Fig. 5b/c). Interference residuals: RCCL beside a GEMM interferes
    more than DMA copies do (c3_sp reached 42% of ideal, ConCCL 66%), GEMM-first RCCL waits for
    the GEMM (c3_base: 21%)."""
    bus = 0.7 * 448e9  # 7 x 64 GB/s Infinity Fabric links per GPU
    return HardwareProfile(
        device="AMD Instinct MI300X", world=8, sm_count=304, memory_bytes=192 << 30,
        bf16_flops=1307e12, hbm_bytes_per_s=5.3e12, nvlink_bytes_per_s=bus,
        gemm_efficiency={"compute-bound": 0.7, "memory-bound": 0.7},
        collectives={"nccl": {c: {"latency_s": 30e-6, "bus_bytes_per_s": bus} for c in ("all_gather", "all_to_all")},
                     "conccl": {c: {"latency_s": 120e-6, "bus_bytes_per_s": bus} for c in ("all_gather", "all_to_all")}},
        gemm_sm_loss={"compute-bound": {8: 1.02, 16: 1.05, 32: 1.17, 64: 1.27},
                      "memory-bound": {8: 0.95, 16: 0.97, 32: 0.99, 64: 1.0}},
        coll_cta_loss={"all_gather": {b: {8: 2.2, 16: 1.5, 32: 1.0, 64: 1.0} for b in ("latency-bound", "bandwidth-bound")},
                       "all_to_all": {b: {8: 3.5, 16: 2.1, 32: 1.35, 64: 1.0}
                                      for b in ("latency-bound", "bandwidth-bound")}},
        interference={"sm": {"any": {"gemm": 1.3, "comm": 1.3}}, "rp": {"any": {"gemm": 1.3, "comm": 1.3}},
                      "rp_first": {"any": {"gemm": 1.3, "comm": 1.3}}, "ce": {"any": {"gemm": 1.1, "comm": 1.1}},
                      "base": {"any": {"gemm": 1.0, "comm": 10.0}}},
    )


@pytest.fixture(scope="module")
def h200():
    return load_profile()


# --------------------------------------------------------------------------- heuristics

def test_launch_order_fewest_blocks_first_any_number_of_kernels():
    ks = [Kernel("gemm", 4096), Kernel("all_to_all", 64), Kernel("copies", None), Kernel("all_gather", 32),
          Kernel("small_gemm", 64)]
    assert launch_order(ks) == ("all_gather", "all_to_all", "small_gemm", "gemm", "copies")
    assert launch_order([Kernel("a", 5), Kernel("b", 5)]) == ("a", "b")  # ties keep the given order
    with pytest.raises(PlanError, match="distinct"):
        launch_order([Kernel("a", 1), Kernel("a", 2)])


def test_two_phase_by_hand():
    # B (4 s) ends first at 4 s; A did 4/15 of its 10 s, the rest (7.33 s) runs alone.
    assert timing.two_phase(10, 4, 1.5, 1.0) == pytest.approx(4 + 10 * (1 - 4 / 15))
    assert timing.two_phase(4, 10, 1.0, 1.5) == pytest.approx(4 + 10 * (1 - 4 / 15))  # symmetric
    # A starts 2 s late: B runs alone 2 s (of 4), then both.
    assert timing.two_phase(10, 4, 1.0, 1.0, delay_a=2) == pytest.approx(12)
    # a partitioned kernel stays slow once alone
    assert timing.two_phase(10, 4, 1.2, 1.0, a_alone=1.2) == pytest.approx(12)


def test_resource_partition_is_the_argmin_of_max(h200):
    for gemm, coll, size in [((8192, 8192, 8192), "all_gather", 2 * GiB), ((64, 8192, 28672), "all_to_all", 64 * MiB),
                             ((16384, 8192, 16384), "all_to_all", 256 * MiB)]:
        w = workload(gemm, coll, size, 4)
        k, table = resource_partition(h200, w)
        tg, cls = timing.gemm_time(h200, w)
        tn = timing.comm_time(h200, "nccl", coll, size, 4)
        for c, (g, n) in table.items():
            assert g == pytest.approx(tg * timing.gemm_sm_loss(h200, cls, c))
            assert n == pytest.approx(tn * timing.comm_cta_loss(h200, coll, size, c))
        assert max(table[k]) == min(max(v) for v in table.values())


def test_paper_mi300x_profile_leads_to_the_papers_choices():
    p = mi300x_profile()
    big = workload((16384, 8192, 16384), "all_to_all", GiB, 8)  # compute-bound, bandwidth-bound collective
    mem = workload((128, 57344, 45056), "all_gather", 512 * MiB, 8)  # memory-bound GEMM, as long as the collective
    small = workload((2048, 2048, 4096), "all_gather", 4 * MiB, 8)  # both ~40 us
    # schedule prioritization: the collective (32-64 workgroups) before the GEMM (thousands)
    sm_plan = plan_strategy(p, big, "c3_sp")
    assert sm_plan.launch_order == ("collective", "gemm")
    assert [c for c in candidates(p, big) if c.strategy == "c3_sp_rp"][0].launch_order == ("collective", "gemm")
    # resource partitioning: all-to-all needs 64 CUs; an all-to-all as long as the GEMM gets them
    long_a2a = workload((8192, 8192, 8192), "all_to_all", 4 * GiB, 8)
    assert resource_partition(p, long_a2a)[0] == 64
    # ConCCL_rp: a memory-bound GEMM gives up 8 CUs beside DMA collectives, a compute-bound one none
    assert copy_engine_sms(p, mem) == 8
    assert copy_engine_sms(p, big) == 0
    # DMA collectives at the paper's sizes (>= 128 MB, on par with RCCL); ConCCL_rp for memory-bound
    assert plan_auto(p, big).strategy == "conccl"
    pm = plan_auto(p, mem)
    assert (pm.strategy, pm.gemm_sms_taken) == ("conccl_rp", 8)
    # below 32 MB ConCCL is up to 4x slower than RCCL: the SM collective, prioritized
    ps = plan_auto(p, small)
    assert ps.impl == "nccl" and ps.launch_order[0] == "collective"


def test_h200_profile_prefers_copy_engines_except_latency_bound(h200):
    assert plan(h200, (8192, 57344, 8192), "all_to_all", 2 * GiB).strategy == "conccl"
    # A small decode GEMM beside 16 MiB: conccl's fixed cost (~35 us of host time) dominates here
    p = plan(h200, (64, 8192, 8192), "all_gather", 16 * MiB)
    assert p.impl == "nccl"
    assert p.predicted["pct_ideal"] == pytest.approx(
        100 * (p.predicted["speedup"] - 1) / (p.predicted["ideal"] - 1))


@pytest.mark.parametrize("args, match", [
    (((0, 8, 8), "all_gather", MiB, 4), "three positive integers"),
    ((("a", 8, 8), "all_gather", MiB, 4), "three positive integers"),
    (((8, 8), "all_gather", MiB, 4), "three positive integers"),
    (((8, 8, 8), "broadcast", MiB, 4), "unknown collective"),
    (((8, 8, 8), "all_gather", 0, 4), "positive number of bytes"),
    (((8, 8, 8), "all_gather", MiB, 1), "2 to 8 ranks"),
    (((8, 8, 8), "all_gather", MiB, 1000), "2 to 8 ranks"),
])
def test_bad_planner_input(h200, args, match):
    with pytest.raises(PlanError, match=match):
        plan(h200, *args)


def test_unknown_strategy(h200):
    with pytest.raises(PlanError, match="unknown strategy 'fast'"):
        plan(h200, (8, 8, 8), "all_gather", MiB, strategy="fast")
    with pytest.raises(PlanError, match="unknown strategy 'torch_lc'"):
        plan(h200, (8, 8, 8), "all_gather", MiB, strategy="torch_lc")


# --------------------------------------------------------------------------- profile, fit

def test_profile_of_another_format_or_gpu_is_refused(tmp_path, h200):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": "conccl-profile/0", "device": "NVIDIA H200"}))
    with pytest.raises(ProfileError, match="conccl-profile/1"):
        load_profile(old)
    with pytest.raises(ProfileError, match="measured on 'NVIDIA H200'"):
        h200.check_device("NVIDIA H100 80GB HBM3")
    h200.check_device("NVIDIA H200")


def test_fit_recovers_a_known_residual(h200):
    p = dataclasses.replace(h200, interference={})
    truth = (1.3, 1.3, 0.0)
    observations = []
    for tg, tc, sz in [(10e-3, 3e-3, GiB), (5e-3, 9e-3, 2 * GiB), (2e-3, 2.5e-3, 512 * MiB)]:
        t = timing.concurrent_time(p, "ce", "compute-bound", tg, tc, 2 * GiB, sz, resid=truth)
        observations.append(Observation(gemm_class="compute-bound", collective="all_gather", size=sz,
                                        gemm_bytes=2 * GiB, comm_bytes=sz, t_gemm=tg, t_comm={"conccl": tc},
                                        runs={"conccl": ((0, 132, t),)}))
    fit = fit_interference(p, observations)
    assert fit["ce"]["compute-bound"]["gemm"] == pytest.approx(1.3)
    assert fit["ce"]["compute-bound"]["rms_log_error"] < 1e-6


def test_profile_round_trips_through_the_writer_and_reader(h200, tmp_path):
    back = HardwareProfile.from_dict(json.loads(h200.to_json()))
    assert back == h200
    assert all(isinstance(k, int) for t in back.gemm_sm_loss.values() for k in t)  # integer keys come back
    with pytest.raises(dataclasses.FrozenInstanceError):
        h200.world = 8
    f = tmp_path / "p.json"
    f.write_text(h200.to_json())
    assert load_profile(f) == h200 and load_profile(EMBEDDED) == h200


def test_profile_reader_names_the_format_found_and_expected(tmp_path):
    data = json.loads(EMBEDDED.read_text())
    for fmt in ("conccl-profile/4", None):  # a newer one, or none
        bad = dict(data, format=fmt) if fmt else {k: v for k, v in data.items() if k != "format"}
        with pytest.raises(ProfileError, match=f"format {fmt!r} found, {FORMAT!r} expected"):
            HardwareProfile.from_dict(bad)
    old = HardwareProfile.from_dict(dict(data, format="conccl-profile/1"))  # an older one is read
    assert old.format == FORMAT and old.nvlinks == 0
    two = {k: v for k, v in data.items() if k != "eager_sweep"}
    assert HardwareProfile.from_dict(dict(two, format="conccl-profile/2")).eager_sweep == {}  # before the eager sweep
    with pytest.raises(ProfileError, match=r"eager_sweep\.nccl\.all_gather\[0\] must be a \[bytes, seconds\] pair"):
        HardwareProfile.from_dict(dict(data, eager_sweep={"nccl": {"all_gather": [[1]]}}))
    with pytest.raises(ProfileError, match="missing field.*memory_bytes"):
        HardwareProfile.from_dict({k: v for k, v in data.items() if k != "memory_bytes"})
    with pytest.raises(ProfileError, match="unknown field.*colour"):
        HardwareProfile.from_dict(dict(data, colour="red"))


def test_an_early_profile_without_sweeps_or_fit_still_plans():
    early = load_profile(FIXTURES / "profile-early.json")  # from before comm_sweep and interference
    assert early.comm_sweep == {} and early.interference == {}
    assert plan(early, (8192, 8192, 8192), "all_gather", GiB).strategy in {"conccl", "conccl_rp", "c3_sp", "c3_base",
                                                                            "c3_rp", "c3_sp_rp"}


def test_embedded_profile_lists_what_it_was_fitted_on(h200):
    assert h200.source["reference_gemms"] == ["mb1", "dec1"]
    assert all(s.split("_")[0] in ("mb1", "dec1") for s in h200.source["fit_scenarios"])
    assert set(h200.interference) >= {"ce", "sm", "base", "rp", "rp_first"}
    assert h200.comm_sweep["conccl"]["all_gather"][0][0] == MiB


# --------------------------------------------------------------------------- evaluation

def test_evaluate_judges_each_pick_against_the_measured_runs(h200):
    doc = study()
    ev = evaluate(doc, h200)
    assert len(ev["rows"]) == len(doc.scenarios)
    for r in ev["rows"]:
        s = next(s for s in doc.scenarios if s.id == r["id"])
        runs = [(n, x.sms, x.time_ms.median / 1e3) for n, rs in s.runs.items() if n not in ("torch_lc", "auto")
                for x in rs]
        assert r["best_s"] == min(t for _, _, t in runs)
        mine = [t for n, k, t in runs if n == r["plan"] and k == r["plan_sms"]]
        assert r["plan_s"] == mine[0]
        assert r["is_best"] == (mine[0] <= 1.02 * r["best_s"])
        assert r["fitted"] == (s.gemm.tag in ("mb1", "dec1"))
    assert ev["held_out"]["judged"] + ev["fitted"]["judged"] == len(doc.scenarios)
    assert ev["held_out"]["judged"] > 0 and ev["fitted"]["judged"] > 0
    assert "held out (judged)" in markdown(ev)


def test_evaluate_judges_auto_on_the_head_to_head_run_in_turns(h200):
    doc = study()
    tg_tn = {}
    for s in doc.scenarios:  # auto as fast as the best in turns, but for one scenario 10% slower
        t = min(x.time_ms.median for n, rs in s.runs.items() if n not in ("torch_lc", "auto") for x in rs)
        slow = 1.10 if s.id == "cb4_2.5G/all_gather" else 1.0
        s.auto_in_turns = AutoInTurns("conccl", 0, ms(t), ms(t * slow), True)
        tg_tn[s.id] = (s.t_gemm.median + s.t_comm["nccl"].median, t * slow, s.ideal)
    ev = evaluate(doc, h200)
    a = ev["all"]["auto_in_turns"]
    assert a["n"] == len(doc.scenarios)
    assert a["min_pct_of_best"] == pytest.approx(100 / 1.10)
    assert not a["goal_met"]  # 90.9% of the best in one scenario
    row = next(r for r in ev["rows"] if r["id"] == "dec2_1G/all_gather")
    serial, t, ideal = tg_tn[row["id"]]
    assert row["turns_pct_ideal"] == pytest.approx(100 * (serial / t - 1) / (ideal - 1))
    assert row["turns_pct_of_best"] == pytest.approx(100.0)
    md = markdown(ev)
    assert "timed again in turns" in md and "NOT met" in md
    for s in doc.scenarios:
        s.auto_in_turns.auto_ms = s.auto_in_turns.best_ms
    a = evaluate(doc, h200)["all"]["auto_in_turns"]
    assert a["min_pct_of_best"] == pytest.approx(100.0)
    assert a["goal_met"] == (a["mean_pct_ideal"] >= 90.0)


def test_evaluate_refuses_a_prediction(h200):
    with pytest.raises(ValueError, match="measured"):
        evaluate(StudyResults(kind="prediction", meta={}, config=RunConfig(False, 0, 0, 4)), h200)


# --------------------------------------------------------------------------- runtime cache

def test_plan_cache_computes_once_per_distinct_workload():
    runtime.clear_plan_cache()
    a = runtime.get_plan((8192, 8192, 8192), "all_gather", GiB, 4)
    b = runtime.get_plan((8192, 8192, 8192), "all_gather", GiB, 4)
    c = runtime.get_plan((8192, 8192, 8192), "all_gather", 2 * GiB, 4)
    assert a is b and c is not a
    assert runtime.plan_cache_info() == {"hits": 1, "misses": 2, "size": 2}
    with pytest.raises(ProfileError, match="this GPU is"):  # a profile given by path, of another GPU
        runtime.get_plan((8192, 8192, 8192), "all_gather", GiB, 4, profile=str(EMBEDDED),
                         device_name="NVIDIA A100-SXM4-80GB")


def test_profile_for_checks_the_gpu_the_study_plans_auto_on():
    # the study asks this before it times `auto` (study/rig.py Rig); a wrong call there
    # once dropped `auto` from a whole GPU study without a word
    runtime.clear_plan_cache()
    prof = runtime.profile_for(None, None)
    assert runtime.profile_for(None, prof.device, prof.world) is prof
    with pytest.raises(ProfileError, match="this GPU is"):
        runtime.profile_for(str(EMBEDDED), "NVIDIA A100-SXM4-80GB")
    with pytest.warns(UserWarning, match="no shipped hardware profile matches 'NVIDIA A100-SXM4-80GB'"):
        borrowed = runtime.profile_for(None, "NVIDIA A100-SXM4-80GB", 4)  # no study needed: a fallback
    assert borrowed.device == "NVIDIA A100-SXM4-80GB" and borrowed.source["borrowed_from"]


def test_overlap_rejects_a_non_string_plan():
    with pytest.raises(InvalidArgument, match="plan must be"):
        conccl.overlap(plan=3)


# --------------------------------------------------------------------------- CLI

def test_cli_plan_table_and_json(capsys, tmp_path):
    assert main(["plan", "--gemm", "8192x57344x8192", "--collective", "all_to_all", "--size", "2G"]) == 0
    out = capsys.readouterr().out
    assert "strategy" in out and "predicted % of ideal" in out
    assert main(["plan", "--gemm", "64x8192x8192", "--size", "16M", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["impl"] == "nccl" and doc["plan"]["workload"]["size"] == 16 * MiB
    assert {c["strategy"] for c in doc["candidates"]} >= {"c3_sp", "conccl"}
    f = tmp_path / "plan.json"
    assert main(["plan", "--gemm", "8192x8192x8192", "--size", "1G", "--strategy", "c3_rp", "--json", str(f)]) == 0
    assert json.loads(f.read_text())["plan"]["strategy"] == "c3_rp"


@pytest.mark.parametrize("argv, match", [
    (["plan", "--gemm", "8x8"], "--gemm MxNxK and --size"),
    (["plan", "--gemm", "8x0x8", "--size", "1M"], "zero"),
    (["plan", "--gemm", "8x8x8", "--size", "lots"], "size"),
    (["plan", "--gemm", "8x8x8", "--size", "1M", "--strategy", "fast"], "unknown strategy"),
    (["plan", "--gemm", "8x8x8", "--size", "1M", "--world", "1"], "from 2 to 8"),
    (["plan", "--evaluate", "/nonexistent-dir"], ""),
])
def test_cli_plan_bad_input_exits_2(capsys, argv, match):
    try:
        assert main(argv) == 2
    except SystemExit as e:  # argparse's own checks (--world's range)
        assert e.code == 2
    assert match in capsys.readouterr().err


def test_cli_plan_refuses_an_old_profile(capsys, tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"format": "conccl-profile/0"}))
    assert main(["plan", "--gemm", "8x8x8", "--size", "1M", "--profile", str(f)]) == 2
    assert "conccl-profile/1" in capsys.readouterr().err


def test_cli_plan_evaluate_writes_markdown(capsys, tmp_path):
    md = tmp_path / "eval.md"
    assert main(["plan", "--evaluate", str(STUDY), "--markdown", str(md), "--json", str(tmp_path / "e.json")]) == 0
    assert "# Planner accuracy" in md.read_text()
    assert json.loads((tmp_path / "e.json").read_text())["held_out"]["judged"] > 0


def test_evaluate_judges_picks_in_turns_only_where_auto_ran_the_same_pick(h200):
    doc = study()
    rows = {r["id"]: r for r in evaluate(doc, h200)["rows"]}
    for i, s in enumerate(doc.scenarios):
        r = rows[s.id]
        t = 1e3 * r["best_s"]
        other = i == 0  # the study's auto planned something else here: not judged in turns
        s.runs["auto"] = [Run(sms=0 if other else r["plan_sms"], gemm_sms=None, time_ms=ms(t),
                              plan="c3_base" if other else r["plan"])]
        slow = 1.05 if s.id == "cb4_2.5G/all_gather" else 1.0
        s.auto_in_turns = AutoInTurns("conccl", 0, ms(t), ms(t * slow), True)
    ev = evaluate(doc, h200)
    first = next(r for r in ev["rows"] if r["id"] == doc.scenarios[0].id)
    assert "turns_loss_pct" not in first or first["plan"] == "c3_base"
    picks = ev["all"]["picks_in_turns"]
    assert picks["max_loss_pct"] == pytest.approx(5.0)
    assert picks["n_best"] == picks["n"] - 1 and not picks["goal_met"]
    assert "Judged in turns instead" in markdown(ev)
    turns = doc.scenarios[1].auto_in_turns
    turns.auto_ms = ms(turns.auto_ms.median * 0.5)  # faster than the best: no loss
    for s in doc.scenarios:
        if s.id == "cb4_2.5G/all_gather":
            s.auto_in_turns.auto_ms = ms(s.auto_in_turns.best_ms.median * 1.01)
    picks = evaluate(doc, h200)["all"]["picks_in_turns"]
    assert picks["max_loss_pct"] == pytest.approx(1.0) and picks["goal_met"]
