"""The tensor-parallel commands (conccl study tp, bench tp, plan tp): bad input refused in one
line with exit code 2, the plan printed, the evaluation computed from a recorded run."""
from __future__ import annotations

import json

import pytest

from conccl.cli import main
from conccl.study import tp_evaluate
from conccl.planner import tp as tpp


@pytest.mark.parametrize("argv,words", [
    (["study", "tp", "--out", "X", "--shapes", "12x3"], "MxKxN"),
    (["study", "tp", "--out", "X", "--chunks", "0,2"], ">= 1"),
    (["bench", "tp", "--out", "X", "--ops", "all_gather"], "known: ag_gemm"),
    (["bench", "tp", "--out", "X", "--schedules", "direct-q2"], "unknown tensor-parallel schedule"),
    (["bench", "tp", "--out", "X", "--block", "8192x4096"], "TOKENSxDxFFN"),
    (["bench", "tp", "--out", "X", "--block", "8192x0x7"], "TOKENSxDxFFN"),
    (["bench", "tp", "--out", "X", "--block", "--align"], "drop --align"),
    (["plan", "tp", "--shape", "1001x8x8", "--world", "2"], "divisible"),
    (["plan", "tp"], "--shape"),
    (["plan", "tp", "--shape", "8x8x8", "--markdown", "m.md"], "--evaluate"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own checks exit from parse_args
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_plan_tp_prints_the_choice_and_writes_it(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "tp", "--op", "gemm_rs", "--shape", "8192x3584x8192", "--world", "4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["schedule"] in text and doc["prediction"] is True
    assert 0 < doc["gemm_alone_s"] <= doc["predicted_s"] <= doc["serial_s"]


def _bench_doc(model, shapes, schedules, world=2, bias=1.0):
    """A one-GPU bench record set whose times are the model's own, times ``bias``."""
    from conccl.schedule.pipeline import TPSchedule

    results = []
    for op, (M, K, N) in shapes:
        for name in schedules:
            s = tpp.decomposition_s(model, op, TPSchedule.parse(name), M, K, N, world)
            results.append({"op": op, "M": M, "K": K, "N": N, "world": 1, "impl": "conccl", "schedule": name,
                            "ms": 1e3 * s * bias})
    return {"results": results}


def test_the_evaluation_is_exact_on_the_models_own_times_and_sees_a_bias():
    model = tpp.model_from()
    shapes = [("ag_gemm", (8192, 8192, 7168)), ("gemm_rs", (8192, 3584, 8192))]
    scheds = ["serial", "direct", "direct-p2", "direct-p4-g2"]
    ev = tp_evaluate.evaluate(_bench_doc(model, shapes, scheds), model)
    assert ev["summary"]["shapes"] == 2 and ev["summary"]["error_mean"] == pytest.approx(0, abs=1e-9)
    assert all(r["auto_loss"] >= 0 for r in ev["rows"])
    biased = tp_evaluate.evaluate(_bench_doc(model, shapes, scheds, bias=1.25), model)
    assert biased["summary"]["error_mean"] == pytest.approx(0.2, abs=1e-6)  # the model is 20% short
    assert "| ag_gemm | 8192x8192x7168 |" in tp_evaluate.markdown(ev)


def _pipelines_doc(model, shapes, schedules, world=2, bias=None, others=None):
    """A several-GPU bench record set: each schedule's ratio to the GEMM the model's own (times
    ``bias[name]``), plus the other implementations' ratios ``others``."""
    from conccl.schedule.pipeline import TPSchedule

    results = []
    for op, (M, K, N) in shapes:
        gemm = model.gemm_s(M, K, N)
        for name in schedules:
            ratio = tpp.predict(model, op, TPSchedule.parse(name), M, K, N, world) / gemm * (bias or {}).get(name, 1.0)
            results.append({"op": op, "M": M, "K": K, "N": N, "world": world, "impl": "conccl", "schedule": name,
                            "ms": 1e3 * gemm * ratio, "ratio_to_gemm": ratio, "error": None})
        for impl, ratio in (others or {}).items():
            results.append({"op": op, "M": M, "K": K, "N": N, "world": world, "impl": impl, "schedule": None,
                            "ms": 1e3 * gemm * ratio, "ratio_to_gemm": ratio, "error": None})
    return {"results": results, "meta": {"device": "NVIDIA H100 80GB HBM3"}}


def test_the_pipeline_evaluation_judges_picks_auto_and_its_rivals():
    model = tpp.model_from()
    shapes = [("ag_gemm", (8192, 8192, 7168)), ("gemm_rs", (8192, 3584, 8192))]
    scheds = ["serial", "direct", "direct-p2", "direct-p4-g2"]
    exact = tp_evaluate.evaluate_pipelines(_pipelines_doc(model, shapes, scheds), model)
    assert exact["world"] == 2 and exact["summary"]["shapes"] == 2
    assert exact["summary"]["error_mean"] == pytest.approx(0, abs=1e-9)
    assert all(r["model_pick_loss"] == 0 and r["auto_ratio"] is None for r in exact["rows"])
    # measured: direct 20% slower than the model says, so the model's pick may lose; auto and rivals given
    picked = {r["op"]: r["model_pick"] for r in exact["rows"]}
    doc = _pipelines_doc(model, shapes, scheds, bias={"direct": 1.2, "direct-p2": 1.2, "direct-p4-g2": 1.2},
                         others={"conccl_auto": 1.10, "serial_nccl": 1.30, "torch_async_tp": 1.05})
    ev = tp_evaluate.evaluate_pipelines(doc, model)
    for r in ev["rows"]:
        assert r["best"] == min(scheds, key=lambda n: next(x["ratio_to_gemm"] for x in doc["results"]
                                                            if x["op"] == r["op"] and x["schedule"] == n))
        assert r["model_pick"] == picked[r["op"]]  # the model's ranking did not change, the measurement did
        assert r["rival_ratio"] == 1.05 and r["auto_vs_rival"] == pytest.approx(1.10 / 1.05 - 1)
        assert r["auto_vs_best"] == pytest.approx(1.10 / r["best_ratio"] - 1)
    assert ev["summary"]["auto_not_slower_than_rival"] == 0 and ev["summary"]["auto_shapes"] == 2
    assert "whole pipelines on 2 GPUs" in tp_evaluate.pipelines_markdown(ev)


def test_plan_tp_evaluates_a_several_gpu_run(tmp_path, capsys):
    model = tpp.model_from(device_name="H100")
    path = tmp_path / "tp.json"
    path.write_text(json.dumps(_pipelines_doc(model, [("ag_gemm", (8192, 8192, 7168))], ["direct", "ring-p2"],
                                              others={"conccl_auto": 1.1})))
    assert main(["plan", "tp", "--evaluate", str(path), "--json", str(tmp_path / "e.json")]) == 0
    assert "whole pipelines on 2 GPUs" in capsys.readouterr().out
    assert json.loads((tmp_path / "e.json").read_text())["summary"]["auto_shapes"] == 1


def _characterization(ms_whole: float) -> dict:
    """One shape, 8192x8192x7168, whose halves cost what the whole does (no decomposition loss)."""
    from conccl.study.tp_measure import FORMAT

    t = [{"M": 8192, "K": 8192, "N": 7168, "chunks": c, "variant": "rows", "ms": ms_whole / c, "ms_spread": 0.01,
          "total_ms": ms_whole} for c in (1, 2, 4)]
    return {"format": FORMAT, "dtype": "bfloat16", "world": 2, "meta": {}, "timings": t}


def test_plan_tp_uses_a_characterization_of_this_gpu(tmp_path, capsys):
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(_characterization(10.0)))
    out = tmp_path / "p.json"
    assert main(["plan", "tp", "--shape", "8192x8192x7168", "--characterization", str(slow), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["gemm_alone_s"] == pytest.approx(0.010)  # the file's whole GEMM, not the embedded H200's ~1.2 ms
    assert main(["plan", "tp", "--shape", "8192x8192x7168", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["gemm_alone_s"] < 0.005


@pytest.mark.parametrize("content,words", [
    ("{", "not valid JSON"),
    ('{"format": "other"}', "not a conccl-tp-characterization/1 file"),
    ('{"format": "conccl-tp-characterization/1", "dtype": "bfloat16"}', "not a whole characterization"),
])
def test_a_bad_characterization_is_refused_in_one_line(tmp_path, capsys, content, words):
    bad = tmp_path / "c.json"
    bad.write_text(content)
    assert main(["plan", "tp", "--shape", "8192x8192x7168", "--characterization", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "--characterization" in err and len(err.splitlines()) == 1


def test_the_embedded_characterization_follows_the_gpu(tmp_path, capsys):
    from conccl.planner import tp as tpp

    assert tpp.embedded_gpu("NVIDIA H100 80GB HBM3") == "H100" and tpp.embedded_gpu("NVIDIA H200") == "H200"
    assert tpp.embedded_gpu(None) == "H200"  # no GPU: the H200's profile and table
    assert tpp.embedded_gpu("NVIDIA A100-SXM4-80GB") == "H100"  # another GPU borrows the H100's, table too
    h100 = tpp.model_from(device_name="NVIDIA H100 80GB HBM3")
    h200 = tpp.model_from(device_name="NVIDIA H200")
    assert h100.rows_ms != h200.rows_ms  # two measured tables, not one
    times = {}
    for gpu in ("H100", "H200"):
        out = tmp_path / f"{gpu}.json"
        assert main(["plan", "tp", "--shape", "8192x8192x7168", "--gpu", gpu, "--json", str(out)]) == 0
        doc = json.loads(out.read_text())
        assert gpu in doc["characterization"]
        times[gpu] = doc["gemm_alone_s"]
    assert times["H100"] == pytest.approx(h100.gemm_s(8192, 8192, 7168)) != times["H200"]
    char = tmp_path / "c.json"
    char.write_text(json.dumps(_characterization(10.0)))
    assert main(["plan", "tp", "--shape", "8192x8192x7168", "--gpu", "H100", "--characterization", str(char)]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_evaluate_takes_the_runs_gpu(tmp_path, capsys):
    from conccl.planner import tp as tpp

    model = tpp.model_from(device_name="H100")
    doc = _bench_doc(model, [("ag_gemm", (8192, 8192, 7168))], ["serial", "direct", "direct-p2"])
    doc["meta"] = {"device": "NVIDIA H100 80GB HBM3"}
    path = tmp_path / "tp.json"
    path.write_text(json.dumps(doc))
    assert main(["plan", "tp", "--evaluate", str(path), "--json", str(tmp_path / "e.json")]) == 0
    ev = json.loads((tmp_path / "e.json").read_text())
    assert "H100" in ev["characterization"] and ev["summary"]["error_mean"] == pytest.approx(0, abs=1e-9)


def test_study_tp_keeps_the_characterization_in_a_profile_and_plan_reads_it(tmp_path, capsys, monkeypatch):
    """`conccl study tp --profile FILE` (its measurement faked: the CPU has no GPU) writes the
    table into the profile; `conccl plan tp --profile FILE` plans from it."""
    from conccl.cli import study_tp
    from conccl.planner.profile import load_profile
    from conccl.study.tp_measure import TPCharacterization

    prof = tmp_path / "profile.json"
    prof.write_text(load_profile().to_json())
    assert load_profile(prof).tp == {}
    fake = TPCharacterization.from_dict(_characterization(10.0))
    monkeypatch.setattr(study_tp.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(study_tp.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(study_tp.torch.cuda, "get_device_name", lambda i=None: load_profile().device)
    monkeypatch.setattr(study_tp.tp_measure, "measure", lambda *a, **k: fake)
    monkeypatch.setattr(study_tp, "environment", lambda kind, world: {"machine_kind": kind, "date": "d", "commit": "c"})
    monkeypatch.setattr(study_tp.tp_report, "figure", lambda char, path: path.write_text("png"))
    assert main(["study", "tp", "--out", str(tmp_path / "st"), "--profile", str(prof)]) == 0
    kept = load_profile(prof).tp
    assert kept["rows_ms"]["8192x8192x7168"]["4096"] == pytest.approx(5.0)
    out = tmp_path / "p.json"
    assert main(["plan", "tp", "--shape", "8192x8192x7168", "--profile", str(prof), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["gemm_alone_s"] == pytest.approx(0.010) and str(prof) in doc["characterization"]


def test_study_tp_refuses_a_bad_profile_before_measuring(tmp_path, capsys, monkeypatch):
    from conccl.cli import study_tp

    bad = tmp_path / "profile.json"
    bad.write_text('{"format": "conccl-profile/1"}')
    monkeypatch.setattr(study_tp.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(study_tp.tp_measure, "measure", lambda *a, **k: pytest.fail("measured before refusing"))
    assert main(["study", "tp", "--out", str(tmp_path / "st"), "--profile", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--profile" in err and "missing field" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("tp,words", [
    ({"rows_ms": {"8192x8192": {"1": 1.0}}}, "MxKxN"),
    ({"rows_ms": {"8x8x8": {"0": 1.0}}}, "row counts"),
    ({"rows_ms": {"8x8x8": {"8": -1.0}}}, "tp.rows_ms.8x8x8.8"),
    ({"rows_ms": {"8x8x8": {"8": 1.0}}, "contention": {"8x8x8": {"8": 1e9}}}, "tp.contention.8x8x8.8"),
    ([], "field tp must be an object"),
    ({"rows_ms": {"8x8x8": {}}}, "at least one row count"),
    ({"bogus": 1}, "tp.rows_ms must hold"),
    ({"rows_ms": {"8x8x8": {"\u00b2": 1.0}}}, "row counts"),
])
def test_a_broken_tp_table_in_a_profile_is_refused(tp, words):
    import dataclasses

    from conccl.planner.profile import HardwareProfile, ProfileError, load_profile

    data = dataclasses.asdict(load_profile())
    data["tp"] = tp
    with pytest.raises(ProfileError, match=words.replace(".", r"\.")):
        HardwareProfile.from_dict(data)


def test_plan_tp_refuses_gpu_beside_a_profiles_own_table(tmp_path, capsys):
    import dataclasses

    from conccl.planner.profile import load_profile

    prof = tmp_path / "profile.json"
    table = {"rows_ms": {"8192x8192x7168": {"8192": 10.0, "4096": 5.0}}}
    prof.write_text(dataclasses.replace(load_profile(), tp=table).to_json())
    assert main(["plan", "tp", "--shape", "8192x8192x7168", "--profile", str(prof), "--gpu", "H100"]) == 2
    assert "drop --gpu" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["plan", "tp", "--shape", "8192x8192x7168"], ["plan", "tp", "--evaluate", "RUN"]])
def test_plan_tp_json_dash_is_stdout_and_writes_no_file(argv, tmp_path, capsys, monkeypatch):
    from conccl.planner import tp as tpp

    run = tmp_path / "tp.json"
    run.write_text(json.dumps(_bench_doc(tpp.model_from(), [("ag_gemm", (8192, 8192, 7168))], ["serial", "direct"])))
    monkeypatch.chdir(tmp_path)
    assert main([a if a != "RUN" else str(run) for a in argv] + ["--json", "-"]) == 0
    json.loads(capsys.readouterr().out)  # the JSON alone
    assert not (tmp_path / "-").exists()


def test_study_tp_refuses_a_profile_of_another_gpu_before_measuring(tmp_path, capsys, monkeypatch):
    from conccl.cli import study_tp
    from conccl.planner.profile import load_profile

    prof = tmp_path / "profile.json"
    prof.write_text(load_profile().to_json())
    monkeypatch.setattr(study_tp.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(study_tp.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(study_tp.torch.cuda, "get_device_name", lambda i=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(study_tp.tp_measure, "measure", lambda *a, **k: pytest.fail("measured before refusing"))
    assert main(["study", "tp", "--out", str(tmp_path / "st"), "--profile", str(prof)]) == 2
    assert "this GPU is 'NVIDIA A100-SXM4-80GB'" in capsys.readouterr().err


def test_the_gemm_kernels_are_loaded_once_per_shape(monkeypatch):
    from conccl.tp import ops

    monkeypatch.setattr(ops, "_LOADED", set())
    runs = []
    for key in ("a", "a", "b", "a"):
        ops._load_kernels(key, lambda key=key: runs.append(key))
    assert runs == ["a", "b"]


def test_auto_passes_the_device_name_to_the_planner(monkeypatch):
    import torch

    from conccl.tp import ops

    seen = []
    real = ops.tp_planner.choose
    monkeypatch.setattr(ops.tp_planner, "choose", lambda *a, **k: seen.append(k.get("device_name")) or real(*a, **k))
    monkeypatch.setattr(ops, "_device_name", lambda device: "NVIDIA H100 80GB HBM3" if device is not None else None)
    ops._auto.cache_clear()
    ops.resolve_schedule("auto", "ag_gemm", 8192, 8192, 7168, 2, torch.bfloat16, torch.device("cpu"))
    assert seen == ["NVIDIA H100 80GB HBM3"]


def test_the_graph_workspace_covers_every_captured_conccl_call():
    from conccl.bench.tp import TPBenchConfig, graph_workspace_bytes

    shapes = {"ag_gemm": ((1024, 8192, 7168),), "gemm_rs": ((1024, 3584, 8192),)}
    cfg = TPBenchConfig(shapes=shapes, schedules=("serial", "direct"), graph=True)
    # conccl's two schedules, auto (which may push: a shard per rank) and serial_conccl
    shard, partials = 512 * 8192 * 2, 1024 * 8192 * 2
    assert graph_workspace_bytes(cfg, 2) == 5 * shard + 4 * partials
    fewer = TPBenchConfig(shapes=shapes, schedules=("direct",), impls=("gemm_only", "conccl"), graph=True)
    assert graph_workspace_bytes(fewer, 2) == shard + partials
    # a push pipeline takes a shard per rank; the reduce-scatter has no push schedule to run
    pushed = TPBenchConfig(shapes=shapes, schedules=("direct", "push"), impls=("gemm_only", "conccl"), graph=True)
    assert graph_workspace_bytes(pushed, 4) == 5 * (256 * 8192 * 2) + partials


def test_align_reaches_the_config_and_the_record():
    import argparse

    from conccl.bench.tp import TPBenchConfig, document, markdown
    from conccl.cli import bench_tp

    parser = argparse.ArgumentParser()
    bench_tp.add_parser(parser.add_subparsers())
    for argv, want in ((["bench-tp", "--out", "X", "--align"], True), (["bench-tp", "--out", "X"], False)):
        assert bench_tp.config(parser.parse_args(argv)).align is want
    doc = document({"machine_kind": "x"}, TPBenchConfig(align=True), [])
    assert doc["config"]["align"] is True and "all-reduce" in markdown(doc)
    assert "all-reduce" not in markdown(document({"machine_kind": "x"}, TPBenchConfig(), []))
