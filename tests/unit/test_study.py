"""No-device tier for `conccl study`: scenarios, formulas, taxonomy, the results' reader and
writer, the report writer on a trimmed H200 run (tests/fixtures), the collective cases' layout,
the prediction path end to end, and bad input."""
from __future__ import annotations

import copy
import dataclasses
import json
import types
import pathlib
import re
import shutil
import statistics

import pytest
import torch

from conccl.cli import main
from conccl.collectives import STUDIED as REGISTRY  # the study measures these
from conccl.planner.profile import load_profile
from conccl.study import analysis, metrics, report
from conccl.study.cases import CollectiveCase
from conccl.study.measure import _auto_in_turns
from conccl.study.ncu import parse
from conccl.study.profile_fit import profile_from_study
from conccl.study.rig import timed_iterations
from conccl.study.results import (SCHEMA, AutoInTurns, ResultsError, StudyResults, Timing, from_dict, load_results,
                                  save_results, to_dict)
from conccl.study.scenarios import SuiteError, load_suite, parse_gemm, parse_suite, scenario_from_args, select

# A measured H200 x4 study in the version-1 layout, trimmed to 7 of its 38 scenarios
# (tests/fixtures/README.md says how it was made).
RUN = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "study-v1"


@pytest.fixture
def run() -> StudyResults:
    return analysis.derive(load_results(RUN))


# ------------------------------------------------------------------ scenarios

def test_default_suite_holds_the_papers_30_scenarios_and_the_added_ones():
    s = load_suite()
    paper = [x for x in s if x.paper_taxonomy]
    assert len(paper) == 30
    assert {x.collective for x in paper} == {"all_gather", "all_to_all"}
    tags = {x.tag for x in paper}
    assert {"mb1_896M", "cb5_20G", "mb2_26.5G", "cb5_1.63G"} <= tags
    added = [x for x in s if not x.paper_taxonomy]
    assert added and all("added" in x.source or "added" in x.gemm.source for x in added)
    mb1 = next(x for x in s if x.tag == "mb1_896M")
    assert (mb1.gemm.m, mb1.gemm.n, mb1.gemm.k) == (8192, 57344, 8192)
    assert mb1.size == 896 << 20


def test_size_means_output_bytes_per_rank_rounded_to_the_world():
    s = scenario_from_args("8x8x8", "all_gather", "1.63G")[0]
    assert s.size == int(1.63 * 2**30)
    for world in (2, 3, 4, 8):
        used = s.size_for(world)
        assert used % (world * 4096) == 0 and 0 <= s.size - used < world * 4096
    ag = scenario_from_args("8x8x8", "all_gather", "1G")[0]
    a2a = scenario_from_args("8x8x8", "all_to_all", "1G")[0]
    assert a2a.memory_bytes(4) - ag.memory_bytes(4) == 1 << 30  # all-gather runs in place


def test_gemm_shapes():
    g = parse_gemm("64x8192x28672")
    assert (g.m, g.n, g.k) == (64, 8192, 28672)
    assert g.flops == 2 * 64 * 8192 * 28672
    assert g.bytes() == 2 * (64 * 28672 + 28672 * 8192 + 64 * 8192)
    for bad in ("8192x8192", "axbxc", "0x1x1", "-1x2x3"):
        with pytest.raises(SuiteError):
            parse_gemm(bad)


@pytest.mark.parametrize("doc,match", [
    ({"format": "other"}, "not a conccl suite"),
    ({"format": "conccl-suite/1", "scenarios": []}, "non-empty"),
    ({"format": "conccl-suite/1", "scenarios": [{"gemm": "nope", "size": "1G"}]}, "unknown GEMM"),
    ({"format": "conccl-suite/1", "scenarios": [{"gemm": "8x8x8", "size": "lots"}]}, "malformed size"),
    ({"format": "conccl-suite/1", "scenarios": [{"gemm": "8x8x8", "size": "1G", "collectives": ["broadcast"]}]},
     "unknown collective"),
    ({"format": "conccl-suite/1", "scenarios": [{"size": "1G"}]}, "missing field 'gemm'"),
    ({"format": "conccl-suite/1", "dtype": "float32", "scenarios": [{"gemm": "8x8x8", "size": "1G"}]}, "dtype"),
    ({"format": "conccl-suite/1", "scenarios": [{"gemm": "8x8x8", "size": "1G"}, {"gemm": "8x8x8", "size": "1G"}]},
     "appears twice"),
])
def test_malformed_suites_are_refused_with_the_reason(doc, match):
    with pytest.raises(SuiteError, match=match):
        parse_suite(doc)


def test_suite_file_errors(tmp_path):
    bad = tmp_path / "s.json"
    bad.write_text("{ not json")
    with pytest.raises(SuiteError, match="not valid JSON.*line 1"):
        load_suite(bad)
    with pytest.raises(SuiteError, match="cannot read"):
        load_suite(tmp_path / "missing.json")


def test_selection():
    s = load_suite()
    quick = select(s, quick=True)
    assert 0 < len(quick) < len(s) and all(x.quick for x in quick)
    assert [x.id for x in select(s, only="cb1_896M/all_gather")] == ["cb1_896M/all_gather"]
    assert len(select(s, only="cb1_896M")) == 2
    with pytest.raises(SuiteError, match="unknown scenario"):
        select(s, only="cb9_1G")


# ------------------------------------------------------------------ formulas

def test_formulas_match_the_definitions():
    assert metrics.ideal_speedup(10, 5) == pytest.approx(1.5)
    assert metrics.speedup(10, 5, 12) == pytest.approx(1.25)
    assert metrics.percent_of_ideal(1.25, 1.5) == pytest.approx(50)
    assert metrics.percent_of_ideal(0.9, 1.5) < 0  # slower than serial
    with pytest.raises(ValueError):
        metrics.ideal_speedup(0, 1)
    with pytest.raises(ValueError):
        metrics.percent_of_ideal(1.2, 1.0)


@pytest.mark.parametrize("tg,tc,cls", [(1.16, 1.0, "G-long"), (1.15, 1.0, "GC-equal"), (1.0, 1.15, "GC-equal"),
                                       (1.0, 1.16, "C-long"), (1, 1, "GC-equal")])
def test_taxonomy_band_is_15_percent(tg, tc, cls):
    assert metrics.taxonomy(tg, tc) == cls


def test_gemm_and_collective_classes():
    # 8192^3 at 700 TFLOP/s on a 760 TFLOP/s, 4.2 TB/s machine: compute-bound
    g = parse_gemm("8192x8192x8192")
    t = g.flops / 700e12
    assert metrics.gemm_class(g.flops, g.bytes(), t, 760e12, 4.2e12) == "compute-bound"
    d = parse_gemm("64x8192x28672")
    t = d.bytes() / 3.6e12
    assert metrics.gemm_class(d.flops, d.bytes(), t, 760e12, 4.2e12) == "memory-bound"
    lat, bw = metrics.fit_latency_bandwidth([1 << 20, 1 << 30], [40e-6 + (1 << 20) / 4e11, 40e-6 + (1 << 30) / 4e11])
    assert lat == pytest.approx(40e-6) and bw == pytest.approx(4e11)
    assert metrics.comm_class(1 << 20, lat, bw) == "latency-bound"
    assert metrics.comm_class(1 << 30, lat, bw) == "bandwidth-bound"


# ------------------------------------------------------------------ report on recorded numbers

def test_short_configurations_get_more_timed_runs():
    assert timed_iterations(10.0, 9, 20.0, 100) == 9  # long: the paper's 9
    assert timed_iterations(0.5, 9, 20.0, 100) == 40  # 20 ms of 0.5 ms runs
    assert timed_iterations(0.05, 9, 20.0, 100) == 100  # capped
    assert timed_iterations(0.0, 9, 20.0, 100) == 9  # no estimate (no warm-ups)
    assert timed_iterations(0.5, 9, 0.0, 100) == 9  # switched off
    assert timed_iterations(0.5, 200, 20.0, 100) == 200  # never fewer than asked


def test_auto_is_timed_again_in_turns_with_the_fastest_applicable_strategy():
    class Rig:
        asked = None

        def timed_side_by_side(self, configs):
            Rig.asked = configs
            return [([1.0, 1.1, 1.2], True), ([1.3, 1.2, 1.25], True)]

    labels = [("gemm",), ("comm", "nccl"), ("run", "c3_base", 0, 132), ("run", "conccl", 0, 132),
              ("run", "conccl_rp", 8, 124), ("auto", {"plan": "conccl"}), ("run", "torch_lc", 0, 132)]
    configs = [f"config {i}" for i in range(len(labels))]
    medians = [5.0, 0.1, 3.0, 2.0, 2.5, 2.1, 1.0]
    out = _auto_in_turns(Rig(), labels, configs, [([m], True) for m in medians])
    # torch_lc (1.0 ms) is no strategy the runtime applies; a collective alone is no strategy
    assert Rig.asked == ["config 3", "config 5"]
    assert out == AutoInTurns("conccl", 0, Timing(1.1, 1.0, 1.2, 3), Timing(1.25, 1.2, 1.3, 3), True)
    assert _auto_in_turns(Rig(), labels[:5], configs[:5], [([m], True) for m in medians[:5]]) is None


def test_report_rebuilds_from_a_measured_h200_run(tmp_path):
    out = tmp_path / "run"
    shutil.copytree(RUN, out)
    assert main(["study", "--report", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["schema"] == SCHEMA  # rewritten in this schema
    doc = load_results(out)
    assert doc.kind == "measured" and doc.complete
    md = (out / "report.md").read_text()
    first_table = md.split("## Efficiency per strategy")[1].split("##")[0]
    for name in ("c3_base", "c3_sp", "c3_rp", "c3_sp_rp", "conccl", "conccl_rp"):
        assert f"| {name} |" in first_table
    assert "PREDICTION" not in md
    assert "The paper's claims" in md and "| 21% |" in md
    # the derived numbers follow from the raw times
    s = next(x for x in doc.scenarios if x.id == "cb1_896M/all_gather")
    tg, tc = s.t_gemm.median, s.t_comm["nccl"].median
    assert s.ideal == pytest.approx((tg + tc) / max(tg, tc))
    base = s.strategies["c3_base"]
    assert base.speedup == pytest.approx((tg + tc) / base.time_ms.median)
    assert doc.summary.n_scenarios == len(doc.scenarios) == 7
    assert [c.claim for c in doc.claims][0].startswith("c3_base")
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) > len(doc.scenarios) * 6
    assert len(list((out / "figures").glob("*.png"))) == 6


def test_report_of_a_run_from_before_persistent_ops_says_how_conccl_was_called(tmp_path):
    # The first version-1 files (up to 63e8d54) record none of the later run settings, conccl_call
    # among them: conccl was then called once per execution, and the redrawn report must not call
    # it a persistent op, while a run that recorded "persistent" still says so.
    data = json.loads((RUN / "results.json").read_text())
    for key in ("side_by_side", "min_timed_ms", "max_iters", "auto_in_turns", "conccl_call"):
        del data["config"][key]
    for sc in data["scenarios"]:
        sc.pop("auto_in_turns", None)
    (tmp_path / "results.json").write_text(json.dumps(data))
    assert main(["study", "--report", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| conccl |"))
    assert "a persistent op" not in md.split("## The paper's claims")[0]
    assert "one call per execution, before persistent ops" in row
    out = tmp_path / "persistent"
    shutil.copytree(RUN, out)
    assert main(["study", "--report", str(out)]) == 0
    row = next(line for line in (out / "report.md").read_text().splitlines() if line.startswith("| conccl |"))
    assert "a persistent op" in row


def test_incomplete_runs_say_so(tmp_path, run):
    run.scenarios = run.scenarios[:3]
    run.complete = False
    run.error = "rank 2: killed"
    report.render(tmp_path, run, quiet=True)
    md = (tmp_path / "report.md").read_text()
    assert "PARTIAL" in md and "rank 2: killed" in md and "--resume" in md
    assert "profile.json is not written: the run is partial" in md


# ------------------------------------------------------------------ the no-GPU path

def test_prediction_end_to_end_is_labelled_on_every_page(tmp_path, capsys):
    out = tmp_path / "pred"
    assert main(["study", "--predict", "--out", str(out)]) == 0
    doc = load_results(out)
    assert doc.kind == "prediction" and doc.complete
    assert len(doc.scenarios) == len(load_suite())
    md = (out / "report.md").read_text()
    assert md.splitlines()[0].endswith("(PREDICTION from a hardware profile, no GPU ran)")
    prof = load_profile()
    assert f"measured on {prof.source['machine_kind']} {prof.source['date']}, commit {prof.source['commit']}" in md
    # Every section holding a table, and every table's header, says it is a prediction.
    sections = md.split("\n## ")[1:]
    for sec in sections:
        lines = sec.splitlines()
        headers = [lines[i] for i in range(len(lines) - 1) if lines[i].startswith("| ")
                   and lines[i + 1].startswith("| ---")]
        if headers:
            assert "redict" in lines[0], lines[0]
        for h in headers:
            assert "predicted" in h, h
    # No sentence of a measurement in a prediction.
    for phrase in ("warm-up", "CUDA event", "timed execution", "equalled", "barrier before", "slowest rank"):
        assert phrase not in md, phrase
    assert "profile.json is not written" in md and not (out / "profile.json").exists()
    term = capsys.readouterr().out
    assert "PREDICTION" in term and "profile.json: not written" in term and "predicted efficiency" in term
    # the model reproduces the profile's measured mean overlap of conccl within a few points
    overlap = load_profile().overlap["conccl"]
    measured = sum(overlap[s.collective]["all"] for s in doc.scenarios) / len(doc.scenarios)
    assert abs(doc.summary.strategies["conccl"].mean_pct_ideal - measured) < 10
    # the planner's choice is a row, with the plan it picked
    for s in doc.scenarios:
        (auto,) = s.runs["auto"]
        assert auto.plan in s.runs and auto.plan != "auto"


def test_prediction_of_measured_scenarios_is_near_the_measurement(tmp_path, run):
    out = tmp_path / "p"
    assert main(["study", "--predict", "--only", ",".join(s.id for s in run.scenarios), "--out", str(out)]) == 0
    pred = load_results(out)
    assert [s.id for s in pred.scenarios] == [s.id for s in run.scenarios]
    for name in ("conccl", "c3_sp"):
        assert abs(pred.summary.strategies[name].mean_pct_ideal - run.summary.strategies[name].mean_pct_ideal) < 15


def test_prediction_of_a_custom_scenario(tmp_path):
    out = tmp_path / "c"
    assert main(["study", "--predict", "--gemm", "4096x4096x4096", "--collective", "all_to_all", "--size", "256M",
                 "--out", str(out)]) == 0
    assert [s.id for s in load_results(out).scenarios] == ["gemm_4096x4096x4096_256M/all_to_all"]


@pytest.mark.parametrize("argv,match", [
    (["--gemm", "8x8x8"], "both --gemm"),
    (["--gemm", "8x8", "--size", "1G"], "malformed GEMM"),
    (["--gemm", "8x8x8", "--size", "1Q"], "malformed size"),
    (["--gemm", "8x8x8", "--size", "1G", "--collective", "allreduce"], "unknown collective"),
    (["--gemm", "8x8x8", "--size", "1G", "--collective", "all_reduce"], "no measurements of all_reduce"),
    (["--only", "nope"], "unknown scenario"),
    (["--gemm", "1000000x1000000x8", "--size", "1G"], "needs .* GiB per GPU"),
    (["--gemm", "8x8x8", "--size", "400G"], "needs .* GiB per GPU"),
    (["--profile", "/nonexistent.json"], "cannot read profile"),
])
def test_bad_input_exits_nonzero_with_a_message(tmp_path, capsys, argv, match):
    out = tmp_path / "o"
    assert main(["study", "--predict", "--out", str(out), *argv]) == 2
    assert re.search(match, capsys.readouterr().err)
    assert not (out / "report.md").exists()


def test_profile_from_another_format_is_refused(tmp_path, capsys):
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"format": "conccl-profile/0", "device": "x"}))
    assert main(["study", "--predict", "--profile", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "not a conccl-profile/3" in capsys.readouterr().err


def test_existing_report_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["study", "--predict", "--quick", "--out", str(out)]) == 0
    assert main(["study", "--predict", "--quick", "--out", str(out)]) == 2
    assert "already holds" in capsys.readouterr().err


def test_one_gpu_runs_the_one_gpu_study(tmp_path, capsys, monkeypatch):
    """One GPU: not refused but the one-GPU study: its own part measured, the rest predicted."""
    from conccl.cli import study as cli_study

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=80 << 30))
    monkeypatch.setattr(cli_study, "environment", lambda kind, world: {"world": world})
    calls = []
    monkeypatch.setattr(cli_study, "one_gpu", lambda *a, **k: calls.append((a, k)))
    assert main(["study", "--quick", "--out", str(tmp_path / "o")]) == 0
    (scenarios, out, quick, meta, memory, profile, world), kw = calls[0]
    assert quick and memory == 80 << 30 and profile is None and world is None and kw == {"own": False}
    assert main(["study", "--quick", "--side-by-side", "--out", str(tmp_path / "p")]) == 2
    assert "one-GPU study" in capsys.readouterr().err


def test_ncu_csv_groups_kernels_by_gemm():
    def rows(i, name, dr, dw, l2):
        return [f'"{i}","1","python3","h","{name}","1","7","(1,1,1)","(1,1,1)","0","9.0","Command line profiler metrics",'
                f'"{m}","byte","{v}"' for m, v in (("dram__bytes_read.sum", dr), ("dram__bytes_write.sum", dw),
                                                   ("lts__t_bytes.sum", l2))]
    header = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",' \
             '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
    text = "\n".join(["==PROF== Connected", header,
                      *rows(0, "distribution_elementwise_grid_stride_kernel", 5, 5, 5),
                      *rows(1, "vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::BFloat16>>", 1, 2, 3),
                      *rows(2, "nvjet_hsh_256x128", "1,000", 500, 4000),
                      *rows(3, "splitKreduce_kernel", 10, 20, 30),
                      *rows(4, "distribution_elementwise_grid_stride_kernel", 7, 7, 7),
                      *rows(5, "vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::BFloat16>>", 1, 1, 1),
                      *rows(6, "sm90_xmma_gemm", 100, 50, 700)])
    a, b = parse(text, 2)
    assert a == {"dram_bytes": 1530.0, "l2_bytes": 4030.0, "kernels": 2}
    assert b == {"dram_bytes": 150.0, "l2_bytes": 700.0, "kernels": 1}
    with pytest.raises(ValueError, match="expected 3 GEMMs"):
        parse(text, 3)


# ------------------------------------------------------------------ results: reader and writer

def test_version_1_results_are_upgraded_on_reading():
    data = json.loads((RUN / "results.json").read_text())
    assert data["format"] == "conccl-study/1" and "schema" not in data
    res = from_dict(data)
    assert res.schema == SCHEMA and res.kind == "measured" and len(res.scenarios) == 7
    s = res.scenarios[0]
    assert isinstance(s.t_gemm, Timing) and s.t_gemm.n >= 9
    assert all(isinstance(r.time_ms, Timing) for runs in s.runs.values() for r in runs)
    assert res.config.world == 4 and res.machine.sm_count == 132
    # fields version 1 never had take their defaults
    v1 = copy.deepcopy(data)
    del v1["config"]["conccl_call"], v1["scenarios"][0]["auto_in_turns"]
    v1.pop("format")  # a version-1 document may lack the format field too
    old = from_dict(v1)
    assert old.config.conccl_call is None and old.scenarios[0].auto_in_turns is None


def test_results_of_an_unknown_schema_name_the_version_found_and_expected(tmp_path):
    data = json.loads((RUN / "results.json").read_text())
    data.pop("format")
    data["schema"] = "conccl-study-results/9"
    with pytest.raises(ResultsError, match=r"'conccl-study-results/9' found.*'conccl-study-results/5'"):
        from_dict(data)
    for older in ("conccl-study-results/2", "conccl-study-results/3", "conccl-study-results/4"):  # still read
        res = from_dict(dict(data, schema=older))
        assert res.schema == SCHEMA and res.skipped == [] and res.parts == {} and res.eager_sizes == []
    with pytest.raises(ResultsError, match=r"format 'conccl-suite/1' found.*conccl-study-results/5"):
        from_dict({"format": "conccl-suite/1"})
    (tmp_path / "results.json").write_text("{ nope")
    with pytest.raises(ResultsError, match="not valid JSON"):
        load_results(tmp_path)
    with pytest.raises(ResultsError, match="cannot read"):
        load_results(tmp_path / "missing")
    data = json.loads((RUN / "results.json").read_text())
    data["scenarios"][0]["runs"]["conccl"][0]["colour"] = "red"
    with pytest.raises(ResultsError, match=r"scenarios\[0\]\.runs\.conccl\[0\]: unknown field\(s\) colour"):
        from_dict(data)


def test_results_round_trip_through_the_writer_and_reader(tmp_path, run):
    save_results(tmp_path, run)
    back = load_results(tmp_path / "results.json")
    assert back == run
    assert to_dict(back) == json.loads((tmp_path / "results.json").read_text())
    # a prediction (other optional fields set) round-trips too
    assert main(["study", "--predict", "--quick", "--out", str(tmp_path / "p")]) == 0
    pred = load_results(tmp_path / "p")
    assert from_dict(json.loads(json.dumps(to_dict(pred)))) == pred


def test_a_profile_condensed_from_the_study(run):
    prof = profile_from_study(run)
    assert prof.device == "NVIDIA H200" and prof.world == 4
    assert prof.source["reference_gemms"] == ["mb1", "dec1"]
    assert set(prof.source["fit_scenarios"]) == {"mb1_896M/all_gather", "dec1_64M/all_to_all"}
    assert prof.comm_sweep["conccl"]["all_gather"][0][0] == 1 << 20
    assert set(prof.interference) >= {"ce", "sm"}
    assert prof.overlap["conccl"]["all_gather"]["all"] == pytest.approx(statistics.fmean(
        [s.strategies["conccl"].pct_ideal for s in run.scenarios if s.collective == "all_gather"]))
    with pytest.raises(ValueError, match="measured study"):
        profile_from_study(dataclasses.replace(run, kind="prediction"))
    assert prof.eager_sweep == {}  # the fixture predates the eager sweep


def test_the_eager_sweep_reaches_the_profile_and_the_eager_table(run):
    from conccl.planner.eager import eager_table
    from conccl.study.results import CollSize

    def row(impl, size, us):
        return CollSize(collective="all_gather", size=size, impl=impl, time_ms=Timing.of([us / 1e3] * 3), correct=True)
    # conccl's host time loses it the small sizes eagerly; the size sweep alone would give 1 MiB
    rows = [row("nccl", 1 << 20, 40), row("conccl", 1 << 20, 90), row("nccl", 16 << 20, 60), row("conccl", 16 << 20, 100),
            row("nccl", 256 << 20, 800), row("conccl", 256 << 20, 600)]
    prof = profile_from_study(dataclasses.replace(run, eager_sizes=rows[::-1]))
    points = prof.eager_sweep["conccl"]["all_gather"]
    assert [p[0] for p in points] == [1 << 20, 16 << 20, 256 << 20]
    assert [p[1] for p in points] == pytest.approx([90e-6, 100e-6, 600e-6])
    assert eager_table(prof, ("all_gather",), prof.world)["nccl_below"]["all_gather"] == 256 << 20
    assert eager_table(profile_from_study(run), ("all_gather",), prof.world)["nccl_below"]["all_gather"] < 256 << 20
    # the report's table, and a wrong eager output counted with the wrong results
    bad = dataclasses.replace(rows[3], correct=False)
    res = analysis.derive(copy.deepcopy(dataclasses.replace(run, eager_sizes=rows[:3] + [bad] + rows[4:])))
    text = report.markdown(res, [], None)
    assert "| all_gather | 1M | 40.0 | 90.0 | 2.25 | yes |" in text and "| all_gather | 16M | 60.0 | 100.0 | 1.67 | **no** |" in text
    assert res.summary.wrong == [f"eager:all_gather:{16 << 20}"]


# ------------------------------------------------------------------ buffers from the layout

class _Rig:
    def __init__(self, world, rank):
        self.world, self.rank = world, rank

    def all_true(self, ok):
        return ok


@pytest.mark.parametrize("name", list(REGISTRY))
@pytest.mark.parametrize("world", [2, 4])
def test_collective_case_fills_checks_and_poisons_by_the_layout(name, world):
    size = world * 4096
    coll = REGISTRY[name]
    cases = []
    for r in range(world):
        arenas = (torch.zeros(size, dtype=torch.uint8), torch.zeros(size, dtype=torch.uint8))
        cases.append(CollectiveCase(_Rig(world, r), name, size, arenas))
    assert all(c.in_place == coll.in_place(world) for c in cases)
    if coll.in_place(world):  # the input is the output's own chunk
        assert all(c.inp.data_ptr() == c.out.view(world, -1)[c.layout.in_place_chunk].data_ptr() for c in cases)
    # run the collective by hand: every output chunk gets its source's input chunk
    ins = [c.inp.view(torch.int16).view(c.layout.input_chunks, -1).clone() for c in cases]
    for c in cases:
        for k, srcs in enumerate(c.layout.sources):
            (src, chunk), = srcs
            c.out16.view(c.layout.output_chunks, -1)[k].copy_(ins[src][chunk])
    assert all(c.check() for c in cases)
    for c in cases:
        c.poison()
        assert not c.check()
        if c.in_place:  # the input survives the poison
            assert torch.equal(c.inp.view(torch.int16), ins[c.rig.rank].view(-1))
    assert cases[0].hbm_bytes() == coll.hbm_bytes(size, world)
