"""The tensor-parallel planner from pipelines timed on several GPUs (conccl.planner.tp's
``pipelines``): made from bench tp results, chosen from where they exist, the model elsewhere."""
from __future__ import annotations

import dataclasses
import json

import pytest

from conccl.cli import main
from conccl.errors import InvalidArgument
from conccl.planner import tp as tpp


def _doc(world=2, dtype="bfloat16", ratios=None, M=8192, K=8192, N=7168, op="ag_gemm"):
    ratios = ratios or {"serial": 1.2, "direct": 1.05, "direct-p2": 1.03}
    results = [{"op": op, "M": M, "K": K, "N": N, "world": world, "impl": "conccl", "schedule": n,
                "ratio_to_gemm": r, "error": None, "wrong": False} for n, r in ratios.items()]
    results.append({"op": op, "M": M, "K": K, "N": N, "world": world, "impl": "torch_async_tp", "schedule": None,
                    "ratio_to_gemm": 1.0, "error": None, "wrong": False})  # not conccl's: not a candidate
    results.append({"op": op, "M": M, "K": K, "N": N, "world": world, "impl": "conccl", "schedule": "ring",
                    "ratio_to_gemm": 0.5, "error": None, "wrong": True})  # a wrong result never counts
    return {"config": {"dtype": dtype}, "results": results}


def test_the_table_is_the_median_of_the_runs_and_refuses_mixed_or_one_gpu_runs():
    table = tpp.pipelines_from_bench([_doc(), _doc(ratios={"serial": 1.4, "direct": 1.01, "direct-p2": 1.09}),
                                      _doc(ratios={"serial": 1.3, "direct": 1.02, "direct-p2": 1.04})])
    assert table["world"] == 2 and table["dtype"] == "bfloat16"
    assert table["ag_gemm"]["8192x8192x7168"] == {"direct": 1.02, "direct-p2": 1.04, "serial": 1.3}
    for docs in ([_doc(), _doc(world=4)], [_doc(world=1)], [_doc(), _doc(dtype="float16")], []):
        with pytest.raises(InvalidArgument):
            tpp.pipelines_from_bench(docs)


def test_auto_runs_the_fastest_measured_schedule_where_one_was_timed_and_the_model_elsewhere():
    model = dataclasses.replace(tpp.model_from(device_name="NVIDIA H200"),
                                pipelines=tpp.pipelines_from_bench([_doc(ratios={"serial": 0.9, "direct": 1.05})]))
    c = tpp.choose("ag_gemm", 8192, 8192, 7168, 2, model=model)
    assert c.schedule.name == "serial" and c.from_runs == 2  # what the runs say, however odd
    assert c.predicted_s == pytest.approx(0.9 * c.gemm_alone_s) and c.serial_s == c.predicted_s
    assert [n for n, _ in c.ranked] == ["serial", "direct"]
    model_only = tpp.choose("ag_gemm", 8192, 8192, 7168, 2, model=dataclasses.replace(model, pipelines={}))
    for other in (tpp.choose("ag_gemm", 8192, 8192, 7168, 4, model=model),  # another world
                  tpp.choose("gemm_rs", 8192, 8192, 7168, 2, model=model),  # another op
                  tpp.choose("ag_gemm", 8192, 8192, 7168, 2, "float16", model=model),  # another dtype
                  tpp.choose("ag_gemm", 8192, 8192, 7168, 2, model=tpp.without(model, 8192, 8192, 7168))):
        assert other.from_runs is None and len(other.ranked) > 2
    assert model_only.from_runs is None and model_only.ranked[0][0] != "serial"


def test_a_table_of_pipelines_alone_keeps_the_gpus_shipped_gemm_steps():
    pipelines = tpp.pipelines_from_bench([_doc()])
    m = tpp.model_from(table={"pipelines": pipelines}, device_name="NVIDIA H200")
    assert m.rows_ms == tpp.model_from(device_name="NVIDIA H200").rows_ms and m.pipelines == pipelines


def test_the_shipped_h200_table_has_two_gpu_pipelines_and_auto_takes_its_best():
    m = tpp.model_from(device_name="NVIDIA H200")
    runs = tpp.measured_pipelines(m, "ag_gemm", 16384, 8192, 14336, 2)
    assert runs and m.pipelines["world"] == 2
    c = tpp.choose("ag_gemm", 16384, 8192, 14336, 2, model=m)
    assert c.schedule.name == min(runs, key=runs.get) and c.from_runs == 2


@pytest.mark.parametrize("argv,words", [
    (["bench", "tp", "--out", "X", "--profile", "missing.json"], "--profile"),
    (["bench", "tp", "--out", "X", "--block", "--profile", "p.json"], "--block"),
    (["bench", "tp", "--out", "X", "--block", "--ops", "ag_gemm"], "drop --ops"),
    (["bench", "tp", "--out", "X", "--block", "--shapes", "8x8x8"], "drop --shapes"),
])
def test_bench_tp_profile_is_refused_before_measuring(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_a_profile_keeping_pipelines_loads_back_and_bad_tables_are_refused(tmp_path):
    """What ``conccl bench tp --profile`` writes: a shipped profile with no tp table of its own
    gets the GPU's shipped GEMM steps beside the pipelines, and loads back."""
    from conccl.planner.profile import ProfileError, load_profile
    from conccl.planner.shipped import shipped

    name, prof = next((n, p) for n, p in shipped() if p.device == "NVIDIA H200")
    assert not prof.tp
    pipelines = tpp.pipelines_from_bench([_doc()])
    table, note = tpp.with_pipelines(prof.tp, pipelines, prof.device)
    assert note == "merged with those it held"  # the shipped H200 pipelines (world 2, bf16) kept
    assert table["pipelines"]["ag_gemm"]["8192x8192x7168"] == pipelines["ag_gemm"]["8192x8192x7168"]
    assert "16384x8192x14336" in table["pipelines"]["ag_gemm"]
    path = tmp_path / "profile.json"
    path.write_text(dataclasses.replace(prof, tp=table).to_json())
    back = load_profile(path)
    assert back.tp["pipelines"] == table["pipelines"] and back.tp["rows_ms"]
    m = tpp.model_from(back, device_name=prof.device)
    assert tpp.choose("ag_gemm", 8192, 8192, 7168, 2, model=m).schedule.name == "direct-p2"
    for bad in ({"world": 1}, {"world": 2, "ag_gemm": {"8x8": {"direct": 1.0}}},
                {"world": 2, "ag_gemm": {"8x8x8": {"fast": 1.0}}}, {"world": 2, "ag_gemm": {"8x8x8": {"direct": 0.1}}},
                {"world": 2, "all_reduce": {}}):
        doc = json.loads(prof.to_json())
        path.write_text(json.dumps({**doc, "tp": {**table, "pipelines": bad}}))
        with pytest.raises(ProfileError, match="tp.pipelines"):
            load_profile(path)


def test_new_times_merge_with_those_of_the_same_world_and_dtype_and_replace_others():
    base = {"rows_ms": {"8x8x8": {"8": 0.01}}}
    first = tpp.pipelines_from_bench([_doc(M=1024), _doc(M=2048, op="gemm_rs")])
    table, note = tpp.with_pipelines(base, first, "NVIDIA H200")
    assert note == "new" and table["rows_ms"] == base["rows_ms"]
    second = tpp.pipelines_from_bench([_doc(M=1024, ratios={"direct": 1.5})])
    merged, note = tpp.with_pipelines(table, second, "NVIDIA H200")
    assert note == "merged with those it held"
    assert merged["pipelines"]["ag_gemm"]["1024x8192x7168"] == {"direct": 1.5}  # the new run's shape replaced
    assert merged["pipelines"]["gemm_rs"] == first["gemm_rs"]  # the other op kept
    other, note = tpp.with_pipelines(merged, tpp.pipelines_from_bench([_doc(world=4)]), "NVIDIA H200")
    assert note.startswith("replacing") and other["pipelines"]["world"] == 4 and "gemm_rs" not in other["pipelines"]


def test_bench_tp_profile_needs_conccls_schedules_timed(tmp_path, capsys):
    import shutil

    from conccl.planner.shipped import EMBEDDED

    prof = tmp_path / "profile.json"
    shutil.copy(EMBEDDED, prof)
    assert main(["bench", "tp", "--out", str(tmp_path / "o"), "--impls", "gemm_only,torch_async_tp",
                 "--profile", str(prof)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--impls must include conccl" in err and len(err.splitlines()) == 1


def _timed_table(plain, timed, schedules, call_s: float) -> dict:
    """A ``pipelines`` table of two ranks as if each schedule took what ``timed`` predicts plus
    ``call_s``, as ratios to ``plain``'s GEMM alone."""
    from conccl.schedule.pipeline import TPSchedule

    table = {"world": 2, "dtype": "bfloat16"}
    for op, shapes in (("ag_gemm", ((1024, 8192, 7168), (8192, 8192, 7168))), ("gemm_rs", ((1024, 3584, 8192),))):
        table[op] = {f"{M}x{K}x{N}": {n: (tpp.predict(timed, op, TPSchedule.parse(n), M, K, N, 2) + call_s)
                                      / plain.gemm_s(M, K, N) for n in schedules} for M, K, N in shapes}
    return table


def test_the_call_overhead_fitted_to_timed_pipelines_is_found_again():
    """Pipelines timed as the model predicts plus a fixed 25 us: the fit finds 25 us; none
    without timed pipelines (the model then adds nothing)."""
    from conccl.schedule.pipeline import TPSchedule

    plain = dataclasses.replace(tpp.model_from(device_name="NVIDIA H200"), pipelines={}, call_overhead_s=0.0)
    assert tpp.fit_call_overhead(plain) is None
    table = _timed_table(plain, plain, ("serial", "direct", "direct-p2"), 25e-6)
    fitted = tpp._fitted(dataclasses.replace(plain, pipelines=table))
    assert fitted.call_overhead_s == pytest.approx(25e-6)
    g = plain.gemm_s(1024, 8192, 7168)
    assert tpp.predict(fitted, "ag_gemm", TPSchedule(), 1024, 8192, 7168, 2) == pytest.approx(
        tpp.predict(plain, "ag_gemm", TPSchedule(), 1024, 8192, 7168, 2) + 25e-6)
    assert tpp.predict(fitted, "ag_gemm", TPSchedule(), 1024, 8192, 7168, 1) < g * 1.5  # one rank: no call


def test_a_step_overhead_fitted_to_timed_pipelines_is_found_again():
    """Pipelines timed as a model whose steps last at least 20 us predicts, plus 25 us a call:
    the fit finds both (decode-size pipelines of several steps show the first)."""
    from conccl.schedule.pipeline import TPSchedule

    plain = dataclasses.replace(tpp.model_from(device_name="NVIDIA H200"), pipelines={}, call_overhead_s=0.0,
                                step_overhead_s=0.0)
    slow = dataclasses.replace(plain, step_overhead_s=20e-6)
    table = _timed_table(plain, slow, ("serial", "direct", "direct-p2", "direct-p4"), 25e-6)
    fitted = tpp._fitted(dataclasses.replace(plain, pipelines=table))
    assert fitted.call_overhead_s == pytest.approx(25e-6) and fitted.step_overhead_s == pytest.approx(20e-6)
    # a pipeline of several steps costs at least the step overhead per step; one step, none
    p4 = TPSchedule.parse("direct-p4")
    assert tpp.predict(fitted, "gemm_rs", p4, 1024, 3584, 8192, 2) > tpp.predict(plain, "gemm_rs", p4, 1024, 3584, 8192,
                                                                                 2) + 25e-6
    assert tpp.predict(fitted, "gemm_rs", TPSchedule(), 1024, 3584, 8192, 2) == pytest.approx(
        tpp.predict(plain, "gemm_rs", TPSchedule(), 1024, 3584, 8192, 2) + 25e-6)
