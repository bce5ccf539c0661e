"""No-device tier: argument checks, the public API without a process group, CLI parsing and the
benchmark report writer on recorded numbers."""
from __future__ import annotations

import json
import pathlib

import pytest

torch = pytest.importorskip("torch")

import conccl  # noqa: E402
from conccl.cli import build_parser, main  # noqa: E402
from conccl.cli.bench import bench_config, sweep  # noqa: E402
from conccl.units import parse_size  # noqa: E402
from conccl.collectives.all_gather import check_all_gather  # noqa: E402
from conccl.collectives.all_to_all import check_all_to_all  # noqa: E402
from conccl.validate import InvalidArgument  # noqa: E402

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("output,input,match", [
    (torch.empty(8), torch.empty(8)[::2], "contiguous"),
    (torch.empty(8), torch.empty(4, dtype=torch.float16), "dtype mismatch"),
    (torch.empty(8), torch.empty(3), "expected world_size"),
    (torch.empty(8), "not a tensor", "torch.Tensor"),
    (torch.empty(8), torch.empty(4, device="meta"), "is on meta, expected a cpu tensor"),
])
def test_all_gather_bad_arguments(output, input, match):
    with pytest.raises(InvalidArgument, match=match):
        check_all_gather(output, input, 2, 0, "cpu")


def test_cpu_tensors_are_refused_for_the_gpu_api():
    with pytest.raises(InvalidArgument, match="cuda"):
        check_all_gather(torch.empty(8), torch.empty(4), 2, 0, "cuda")


def test_in_place_input_must_be_the_own_chunk():
    out = torch.empty(8)
    assert check_all_gather(out, out[4:], 2, 1, "cpu") is True
    with pytest.raises(InvalidArgument, match="chunk for rank 0"):
        check_all_gather(out, out[4:], 2, 0, "cpu")


@pytest.mark.parametrize("out_splits,in_splits,match", [
    ([1, 2], [1, -1], "negative"),
    ([1, 2], [1, 1], "sum to 2"),
    ([3], [1, 2], "one per rank"),
    ([1.5, 1.5], [1, 2], "not an integer"),
])
def test_all_to_all_bad_splits(out_splits, in_splits, match):
    with pytest.raises(InvalidArgument, match=match):
        check_all_to_all(torch.empty(3), torch.empty(3), out_splits, in_splits, 2, "cpu")


def test_all_to_all_needs_even_division_without_splits_and_no_aliasing():
    with pytest.raises(InvalidArgument, match="does not divide"):
        check_all_to_all(torch.empty(3), torch.empty(3), None, None, 2, "cpu")
    t = torch.empty(4)
    with pytest.raises(InvalidArgument, match="in place"):
        check_all_to_all(t, t, None, None, 2, "cpu")
    with pytest.raises(InvalidArgument, match="rows have shape"):
        check_all_to_all(torch.empty(2, 3), torch.empty(2, 4), None, None, 2, "cpu")


def test_public_api_without_a_process_group_is_a_clear_error():
    out = torch.empty(4)
    with pytest.raises(InvalidArgument, match="not initialised"):
        conccl.all_gather_into_tensor(out, torch.empty(2))
    with pytest.raises(InvalidArgument, match="not initialised"):
        conccl.all_to_all_single(out, torch.empty(4))
    assert set(conccl.__all__) >= {"all_gather_into_tensor", "all_to_all_single", "empty", "Work"}


@pytest.mark.parametrize("text,value", [("1", 1), ("64K", 65536), ("1M", 1 << 20), ("4G", 4 << 30),
                                        ("1.5G", 3 << 29), ("2MiB", 2 << 20)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "1X", "-4M", "0", "0.5"])
def test_parse_size_rejects_malformed(text):
    with pytest.raises(Exception, match="size"):
        parse_size(text)


def test_sweep_and_flags_as_nccl_tests():
    assert sweep(1 << 20, 4 << 30, 2)[-1] == 4 << 30 and len(sweep(1 << 20, 4 << 30, 2)) == 13
    args = build_parser().parse_args(["bench", "-b", "8M", "-e", "64M", "-f", "4", "-n", "7", "-w", "2", "-c", "0",
                                      "--collective", "all_to_all", "--impl", "conccl,nccl", "-d", "int8"])
    cfg = bench_config(args)
    assert cfg.sizes == [8 << 20, 32 << 20] and cfg.iters == 7 and cfg.warmup == 2 and not cfg.check
    assert cfg.collectives == ["all_to_all"] and cfg.impls == ["conccl", "nccl"] and cfg.dtype == "int8"
    with pytest.raises(ValueError, match="unknown implementation"):
        bench_config(build_parser().parse_args(["bench", "--impl", "nope"]))
    with pytest.raises(ValueError, match="below"):
        bench_config(build_parser().parse_args(["bench", "-b", "4G", "-e", "1M"]))


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() >= 2, reason="GPUs present")
def test_bench_without_gpus_exits_nonzero_with_a_message(capsys):
    assert main(["bench", "-b", "1M", "-e", "1M"]) == 2
    assert "needs at least 2 CUDA GPUs" in capsys.readouterr().err


def test_report_writer_on_recorded_numbers(tmp_path):
    from conccl.bench import report

    recorded = sorted(BENCH.glob("*/bench.json"))
    assert recorded, "a committed benchmark run is expected under benchmarks/"
    data = json.loads(recorded[-1].read_text())
    md = report.markdown(data["meta"], data["records"])
    assert "## all_gather: bus bandwidth (GB/s)" in md and "| 4G |" in md
    rec = next(r for r in data["records"] if "busbw" in r)
    cells = report.row_cells(rec)
    assert cells[0] == rec["size"] and float(cells[6]) == pytest.approx(rec["busbw"], abs=0.01)
    assert rec["busbw"] == pytest.approx(rec["algbw"] * (rec["world"] - 1) / rec["world"])


def test_latency_bench_refuses_unknown_impls_and_runs_only_with_gpus(capsys):
    from conccl.bench import latency

    with pytest.raises(SystemExit) as e:
        latency.main(["--out", "x", "--impls", "conccl,nccl_ce"])  # nccl_ce needs another process family
    assert e.value.code == 2 and "nccl_ce" in capsys.readouterr().err
    import torch

    if torch.cuda.device_count() < 2:
        assert latency.main(["--out", "x"]) == 2
        assert "at least 2 GPUs" in capsys.readouterr().err


def test_latency_table_marks_an_expired_gate():
    from conccl.bench.latency import markdown

    rec = {"collective": "all_gather", "impl": "conccl", "size": 1 << 20, "time_us": 80.84, "loop_us": 70.0,
           "host_us": 69.2, "gpu_us": 27.3, "gate_expired": True, "wrong": 0, "signal_batching": "all"}
    text = markdown({"meta": {"machine_kind": "k", "date": "d", "commit": "c"}, "world": 4, "iters": 100, "reps": 3,
                     "records": [rec, dict(rec, impl="nccl", gate_expired=False)]})
    assert "| all_gather | conccl | 1048576 | 80.8 | 70.0 | 69.2 | 27.3 (gate expired) | 0 |" in text
    assert "| all_gather | nccl | 1048576 | 80.8 | 70.0 | 69.2 | 27.3 | 0 |" in text
    assert "signal batching: ['all']" in text


def test_latency_phase_timer_times_the_wrapped_phases_and_restores_them(monkeypatch):
    import time

    import torch

    from conccl.bench import latency
    from conccl.collectives import all_gather as ag

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    plan, check = ag.plan_all_gather, ag.check_all_gather

    def run():
        time.sleep(0.002)  # in no phase
        ag.plan_all_gather(4, 0, 1 << 12)
        time.sleep(0.001)

    phases = latency._time_phases(run, 3)
    assert ag.plan_all_gather is plan and ag.check_all_gather is check  # unwrapped again
    assert set(phases) == set(latency.PHASE_LABELS)
    assert 0 < phases["plan"] < 1000  # us per call: the plan only, not the sleeps
    assert phases["validate"] == 0 and phases["call"] == 0
    rec = {"collective": "all_gather", "impl": "conccl", "size": 1 << 20, "time_us": 80.0, "loop_us": 70.0,
           "host_us": 69.0, "gpu_us": 27.0, "gate_expired": False, "wrong": 0, "host_phases_us": phases}
    text = latency.markdown({"meta": {}, "world": 4, "iters": 3, "reps": 1, "records": [rec]})
    assert "| collective | implementation | size (B) | call | call key | local step | validate | board exchange |" in text
    assert f"| all_gather | conccl | 1048576 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | {phases['plan']:.1f} |" in text
