"""Efficiency, the headline: max(t_gemm, fastest collective alone) / t_concurrent. One number per
(scenario, strategy), the same in results.json, results.csv, the report's tables and the
planner's output; percent of ideal beside it, never alone."""
from __future__ import annotations

import csv
import json
import re
import statistics

import pytest

pytest.importorskip("torch")

from conccl.cli import main  # noqa: E402
from conccl.study import metrics  # noqa: E402
from conccl.study.results import load_results  # noqa: E402


def test_efficiency_is_well_defined_where_percent_of_ideal_explodes():
    # A 100 ms GEMM beside a 0.01 ms collective, together 100.5 ms: almost perfectly hidden.
    tg, tc, t = 100.0, 0.01, 100.5
    eff = metrics.efficiency(tg, tc, t)
    assert eff == pytest.approx(100 * 100 / 100.5)
    pct = metrics.percent_of_ideal(metrics.speedup(tg, tc, t), metrics.ideal_speedup(tg, tc))
    assert pct < -4000  # the paper's measure calls the same pair a disaster
    assert metrics.efficiency(2.0, 3.0, 3.0) == pytest.approx(100.0)  # the shorter one wholly hidden
    with pytest.raises(ValueError):
        metrics.efficiency(1.0, 0.0, 1.0)


@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    out = tmp_path_factory.mktemp("p") / "study"
    assert main(["study", "--predict", "--quick", "--out", str(out)]) == 0
    return out, load_results(out)


def test_every_strategy_has_one_efficiency_from_its_own_fastest_run(predicted):
    _, res = predicted
    for s in res.scenarios:
        best_alone = min(s.t_comm["nccl"].median, s.t_comm["conccl"].median)
        assert s.t_comm_best == pytest.approx(best_alone)
        for name, r in s.strategies.items():
            fastest = min(s.runs[name], key=lambda x: x.time_ms.median)
            assert r.time_ms.median == fastest.time_ms.median
            assert r.efficiency == pytest.approx(100 * max(s.t_gemm.median, best_alone) / r.time_ms.median)
    for name, summ in res.summary.strategies.items():
        if name in ("best", "c3_best"):
            continue
        vals = [s.strategies[name].efficiency for s in res.scenarios if name in s.strategies]
        assert summ.mean_efficiency == pytest.approx(statistics.fmean(vals))


def test_auto_and_the_strategy_it_picked_agree(predicted):
    """auto ran conccl's very plan: the same time gives the same efficiency and own-ideal."""
    _, res = predicted
    same = 0
    for s in res.scenarios:
        (auto,) = s.runs["auto"]
        twin = [r for r in s.runs.get(auto.plan, []) if r.sms == auto.sms]
        if twin and twin[0].time_ms.median == auto.time_ms.median:
            same += 1
            assert auto.efficiency == pytest.approx(twin[0].efficiency)
            assert auto.pct_own_ideal == pytest.approx(twin[0].pct_own_ideal)
    assert same >= 1


def test_the_same_number_in_json_csv_and_the_report(predicted):
    out, res = predicted
    rows = list(csv.DictReader((out / "results.csv").open()))
    md = (out / "report.md").read_text()
    table = md.split("## Predicted: scenarios")[1].split("\n## ")[0]
    header = next(ln for ln in table.splitlines() if ln.startswith("| scenario"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    checked = 0
    for s in res.scenarios:
        line = next(ln for ln in table.splitlines() if ln.startswith(f"| {s.id} |"))
        cells = dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
        for name, r in s.strategies.items():
            (row,) = [x for x in rows if x["scenario"] == s.id and x["strategy"] == name
                      and x["strategy_best"] == "True"]
            assert float(row["efficiency"]) == pytest.approx(r.efficiency, abs=0.01)
            assert row["kind"] == "prediction"
            if name in cells:
                eff, pct = re.fullmatch(r"(-?\d+)% / (-?\d+)%", cells[name]).groups()
                assert int(eff) == round(r.efficiency) and int(pct) == round(r.pct_ideal)
                checked += 1
    assert checked >= len(res.scenarios) * 4
    summary = md.split("## Predicted: efficiency per strategy")[1].split("\n## ")[0]
    for name, summ in res.summary.strategies.items():
        assert f"| {name} | **{summ.mean_efficiency:.1f}%** |" in summary
    # a mean percent of ideal never appears without the efficiency beside it
    for ln in md.splitlines():
        if "% of ideal" in ln and ln.startswith("| ") and "DMA" not in ln and "---" not in ln:
            assert "efficiency" in ln or "%**" in ln or re.search(r"\d+% / -?\d+%", ln), ln


def test_plan_prints_and_writes_the_efficiency_first(tmp_path, capsys):
    f = tmp_path / "plan.json"
    assert main(["plan", "--gemm", "8192x8192x8192", "--size", "1G", "--json", str(f)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("PREDICTION")
    i_eff = next(i for i, ln in enumerate(lines) if ln.startswith("predicted efficiency"))
    i_pct = next(i for i, ln in enumerate(lines) if ln.startswith("predicted % of ideal"))
    assert i_eff < i_pct
    pr = json.loads(f.read_text())["plan"]["predicted"]
    assert pr["efficiency"] == pytest.approx(100 * max(pr["gemm_s"], pr["comm_best_s"]) / pr["concurrent_s"])
    assert pr["comm_best_s"] <= pr["comm_nccl_s"]


def test_an_ill_conditioned_percent_of_ideal_is_flagged(capsys):
    assert main(["plan", "--gemm", "64x64x64", "--size", "1G"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("predicted % of ideal"))
    assert "ill-conditioned" in line


def test_a_prediction_for_another_world_is_labelled_extrapolated(tmp_path, capsys):
    from conccl.planner.profile import load_profile

    prof = load_profile()
    other = 8 if prof.world != 8 else 2
    out = tmp_path / "x"
    assert main(["study", "--predict", "--quick", "--gpus", str(other), "--out", str(out)]) == 0
    md, term = (out / "report.md").read_text(), capsys.readouterr().out
    reason = f"extrapolated to {other} GPUs from a profile measured on {prof.world}"
    assert "**EXTRAPOLATED**" in md and reason in md and reason in term
    assert load_results(out).meta["extrapolated"].startswith(reason)
    same = tmp_path / "same"
    assert main(["study", "--predict", "--quick", "--gpus", str(prof.world), "--out", str(same)]) == 0
    assert "EXTRAPOLATED" not in (same / "report.md").read_text()
    capsys.readouterr()
    assert main(["plan", "--gemm", "8192x8192x8192", "--size", "1G", "--world", str(other)]) == 0
    assert reason in capsys.readouterr().out
    f = tmp_path / "p.json"
    assert main(["plan", "--gemm", "8192x8192x8192", "--size", "1G", "--world", str(other), "--json", str(f)]) == 0
    assert json.loads(f.read_text())["extrapolated"].startswith(reason)
