"""Interrupted studies: Ctrl-C or a crash leaves results.json marked incomplete with what
finished and a report labelled PARTIAL; ``--resume`` continues where it stopped. On the CPU
paths: the prediction (interrupted for real, mid-run) and the measured run's bookkeeping (its
GPU workers replaced by a stand-in that saves part of a run, then stops)."""
from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

pytest.importorskip("torch")

from conccl.cli import EXIT_INTERRUPTED, main  # noqa: E402
from conccl.study import model, run as study_run  # noqa: E402
from conccl.study.measure import steps_done  # noqa: E402
from conccl.study.results import CollSize, Timing, from_dict, load_results, save_results  # noqa: E402
from conccl.study.scenarios import load_suite, select  # noqa: E402

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "study-v1" / "results.json"


def _stop_after(monkeypatch, n: int, exc: BaseException):
    """predict_scenario, stopping with ``exc`` once ``n`` scenarios are done; returns the call log."""
    real, calls = model.predict_scenario, []

    def fake(p, s, world, quick):
        if len(calls) == n:
            raise exc
        calls.append(s.id)
        return real(p, s, world, quick)

    monkeypatch.setattr(model, "predict_scenario", fake)
    return calls


def test_ctrl_c_mid_prediction_then_resume(tmp_path, monkeypatch, capsys):
    out = tmp_path / "study"
    argv = ["study", "--predict", "--quick", "--out", str(out)]
    calls = _stop_after(monkeypatch, 2, KeyboardInterrupt())
    assert main(argv) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "--resume" in err and "Traceback" not in err
    res = load_results(out)
    assert not res.complete and res.error == "interrupted (Ctrl-C)"
    assert [s.id for s in res.scenarios] == calls and len(calls) == 2
    md = (out / "report.md").read_text()
    assert "**PARTIAL**" in md and "2 scenario(s)" in md

    # A plain rerun into the folder does not start over silently.
    monkeypatch.undo()
    assert main(argv) == 2
    assert "--resume" in capsys.readouterr().err

    # --resume predicts only what is missing, and ends where a run never stopped would.
    calls = _stop_after(monkeypatch, 10**6, RuntimeError("unreachable"))
    assert main(argv + ["--resume"]) == 0
    wanted = [s.id for s in select(load_suite(), quick=True)]
    assert calls == wanted[2:]
    done = load_results(out)
    assert done.complete and done.error is None and [s.id for s in done.scenarios] == wanted
    md = (out / "report.md").read_text()
    assert "PARTIAL" not in md and "Resumed: the first part ran" in md and "2 scenario(s) done" in md
    fresh = tmp_path / "fresh"
    assert main(["study", "--predict", "--quick", "--out", str(fresh)]) == 0
    a, b = load_results(fresh), done
    for x, y in zip(a.scenarios, b.scenarios):
        assert {n: r.efficiency for n, r in x.strategies.items()} == {n: r.efficiency for n, r in y.strategies.items()}


def test_a_crash_mid_prediction_leaves_a_partial_report(tmp_path, monkeypatch, capsys):
    out = tmp_path / "study"
    _stop_after(monkeypatch, 1, ZeroDivisionError("boom"))
    assert main(["study", "--predict", "--quick", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "internal error" in err and "Traceback" not in err
    res = load_results(out)
    assert not res.complete and len(res.scenarios) == 1 and "ZeroDivisionError" in res.error
    assert "**PARTIAL**" in (out / "report.md").read_text()


def test_resume_refuses_other_settings(tmp_path, monkeypatch, capsys):
    out = tmp_path / "study"
    _stop_after(monkeypatch, 1, KeyboardInterrupt())
    assert main(["study", "--predict", "--quick", "--out", str(out)]) == EXIT_INTERRUPTED
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["study", "--predict", "--out", str(out), "--resume"]) == 2  # without --quick
    assert "--quick" in capsys.readouterr().err
    assert main(["study", "--predict", "--quick", "--gpus", "8", "--out", str(out), "--resume"]) == 2
    assert "--gpus" in capsys.readouterr().err


def _partial_measured() -> dict:
    d = json.loads(FIXTURE.read_text())
    d["scenarios"] = d["scenarios"][:3]
    d["complete"] = False
    return d


def test_measured_run_stopped_by_ctrl_c_keeps_what_it_measured(tmp_path, monkeypatch):
    """The GPU workers save after every step; the parent, on Ctrl-C, marks the run partial."""
    out = tmp_path / "study"
    scenarios = select(load_suite(), only="cb1_896M")

    def workers(fn, cfg, nprocs=None, timeout_s=None):
        save_results(cfg.out_dir, from_dict(_partial_measured()))  # what rank 0 had saved
        raise KeyboardInterrupt

    monkeypatch.setattr(study_run, "run_per_gpu", workers)
    monkeypatch.setattr(study_run.ncu, "gemm_counters", lambda gemms: {})
    with pytest.raises(KeyboardInterrupt):
        study_run.measured(scenarios, out, 4, False, {}, 1 << 50)
    res = load_results(out)
    assert not res.complete and res.error == "interrupted (Ctrl-C)" and len(res.scenarios) == 3
    assert "**PARTIAL**" in (out / "report.md").read_text()
    assert not (out / "profile.json").exists()

    seen = {}

    def resumed(fn, cfg, nprocs=None, timeout_s=None):
        seen["resume"] = cfg.resume
        res = cfg.resume
        res.complete = True
        return [res]

    monkeypatch.setattr(study_run, "run_per_gpu", resumed)
    res, finished = study_run.measured(scenarios, out, 4, False, {}, 1 << 50, resume=load_results(out))
    assert finished and [s.id for s in seen["resume"].scenarios] == [s.id for s in res.scenarios]
    assert (out / "profile.json").exists() and "PARTIAL" not in (out / "report.md").read_text()


def test_the_steps_a_partial_measured_run_holds():
    res = from_dict(_partial_measured())
    done = steps_done(res)
    assert {("scenario", s.id) for s in res.scenarios} <= done
    assert {("gemm", r.gemm) for r in res.gemm_sm_loss} <= done
    assert ("scenario", "cb1_896M/all_to_all") not in done  # the fourth scenario was cut off
    assert not any(step[0] == "eager" for step in done if isinstance(step, tuple))  # before the eager sweep
    res.peaks.hbm_bytes_per_s = None
    assert "hbm" not in steps_done(res)
    res.eager_sizes = [CollSize(collective="all_gather", size=1 << 20, impl="nccl", time_ms=Timing.of([0.04]))]
    assert ("eager", "all_gather") in steps_done(res) and ("eager", "all_to_all") not in steps_done(res)


def test_a_finished_study_from_before_the_eager_sweep_may_be_resumed_to_add_it():
    from conccl.study.run import check_resumable
    from conccl.study.config import StudyError

    res = from_dict(json.loads(FIXTURE.read_text()))  # complete, measured, no eager sweep
    assert res.complete and res.kind == "measured" and not res.eager_sizes
    check_resumable(res, "measured", res.world, res.config.quick)  # allowed: the eager sweep is missing
    res.eager_sizes = [CollSize(collective="all_gather", size=1 << 20, impl="nccl", time_ms=Timing.of([0.04]))]
    with pytest.raises(StudyError, match="that study is complete"):
        check_resumable(res, "measured", res.world, res.config.quick)
    res.eager_sizes = []
    with pytest.raises(StudyError, match="that study is complete"):  # a finished prediction: nothing to add
        check_resumable(dataclasses.replace(res, kind="prediction"), "prediction", res.world, res.config.quick)
