"""No-device tier: ``conccl.bench.clocks`` (the SM clock sampled by nvidia-smi beside a benchmark)
and how ``conccl bench fsdp --clocks`` reports it. A fake ``nvidia-smi`` on PATH stands in for the
driver's; the GPU run is the benchmark's (docs/results.md, FSDP2)."""
from __future__ import annotations

import os
import stat
import time

import pytest

from conccl.bench import clocks

T = "2026/11/27 03:22:25.572"


def test_a_sample_line_is_its_time_the_clock_and_the_reason_bits_anything_else_is_skipped():
    assert clocks.parse_line(f"{T}, 1410, 0x0000000000000004") == (3 * 3600 + 22 * 60 + 25.572, 1410.0, 4)
    assert clocks.parse_line(f" {T} , 1980 , 0x0000000000000000 ")[1:] == (1980.0, 0)
    for junk in (f"{T}, [N/A], 0x4", "1410, 0x4", "", "Field \"clocks_event_reasons.active\" is not a valid field",
                 f"{T}, 1410, 0x4, 700", "yesterday, 1410, 0x4"):
        assert clocks.parse_line(junk) is None


def _lines(*samples, step_ms=20):
    return [f"2026/11/27 03:22:{25 + i * step_ms / 1e3:06.3f}, {mhz}, {bits}" for i, (mhz, bits) in enumerate(samples)]


def test_the_summary_gives_the_median_clock_overall_and_while_the_power_cap_held_it_and_the_period():
    lines = _lines((1980, "0x0"), (1410, "0x4"), (1380, "0x4"), (1395, "0x0000000000000004"), (1500, "0x1"),
                   step_ms=21) + [f"{T}, [N/A], 0x4"]
    assert clocks.summarize(lines) == {"samples": 5, "period_ms": 21.0, "sm_mhz_median": 1410.0,
                                       "capped_samples": 3, "sm_mhz_median_capped": 1395.0}
    uncapped = clocks.summarize(_lines((1980, "0x0"), (1965, "0x0")))
    assert uncapped["capped_samples"] == 0 and uncapped["sm_mhz_median_capped"] is None
    assert clocks.summarize(_lines((1980, "0x0")))["period_ms"] is None
    assert clocks.summarize([]) is None and clocks.summarize(["garbage"]) is None
    # a window across midnight
    late = ["2026/11/27 23:59:59.990, 1410, 0x4", "2026/11/28 00:00:00.010, 1410, 0x4"]
    assert clocks.summarize(late)["period_ms"] == 20.0


def test_without_nvidia_smi_the_sampler_gives_no_summary_and_the_block_still_runs(monkeypatch):
    monkeypatch.setattr(clocks.shutil, "which", lambda name: None)
    ran = []
    with clocks.ClockSampler("GPU-x") as s:
        ran.append(1)
    assert ran == [1] and s.summary() is None
    s.stop()  # again: nothing to stop
    with pytest.raises(ValueError, match="at least 1 ms"):
        clocks.ClockSampler("GPU-x", period_ms=0)


def _fake_smi(tmp_path, monkeypatch, body: str):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n" + body)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    return fake


def _wait_for(path):
    for _ in range(100):  # until the fake has started
        if path.exists() and path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError("the fake nvidia-smi never ran")


def test_the_sampler_runs_nvidia_smi_for_that_gpu_and_reads_what_it_printed(tmp_path, monkeypatch):
    args_file = tmp_path / "args"
    printed = "\n".join(_lines((1410, "0x0000000000000004"), (1395, "0x0000000000000004"), (1980, "0x0")))
    _fake_smi(tmp_path, monkeypatch, f"echo \"$@\" > {args_file}\nprintf '{printed}\\n'\nexec sleep 30\n")
    t0 = time.monotonic()
    with clocks.ClockSampler("GPU-1234", period_ms=20) as s:
        _wait_for(args_file)
        time.sleep(0.2)
    assert time.monotonic() - t0 < 20  # the sleeping fake was stopped, not waited for
    assert args_file.read_text().split() == ["--query-gpu=timestamp,clocks.sm,clocks_event_reasons.active",
                                             "--format=csv,noheader,nounits", "-i", "GPU-1234", "-lms", "20"]
    assert s.summary() == {"samples": 3, "period_ms": 20.0, "sm_mhz_median": 1410.0, "capped_samples": 2,
                           "sm_mhz_median_capped": 1402.5, "gpu": "GPU-1234"}


def test_an_error_inside_the_block_still_stops_a_sampler_that_ignores_sigterm(tmp_path, monkeypatch):
    started = tmp_path / "started"
    _fake_smi(tmp_path, monkeypatch, f"trap '' TERM\necho up > {started}\n"
                                     "i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done\n")
    s = clocks.ClockSampler("GPU-1")
    with pytest.raises(RuntimeError, match="boom"):
        with s:
            _wait_for(started)
            raise RuntimeError("boom")
    assert s._proc is None and s.summary() is None  # killed after the grace period; it printed no sample


def test_a_nvidia_smi_that_cannot_start_gives_no_summary(tmp_path, monkeypatch):
    fake = _fake_smi(tmp_path, monkeypatch, "")
    monkeypatch.setattr(clocks.shutil, "which", lambda name: str(fake))
    fake.chmod(0o644)  # found (as which says) but not executable
    with clocks.ClockSampler("GPU-1") as s:
        pass
    assert s.summary() is None


def test_bench_fsdp_reports_each_rank_s_capped_clock_and_the_flag_reaches_the_config(tmp_path):
    pytest.importorskip("torch")
    from conccl.bench.fsdp import combine, markdown
    from conccl.cli import build_parser
    from conccl.cli.bench_fsdp import config

    def rec(rank, clk):
        return {"tokens_per_rank": 8192, "config": "conccl_direct_prefetch", "rank": rank, "times_ms": [10.0],
                "iteration_ms": [12.0], "host_ms": None, "peak_alloc_bytes": 2**30, "peak_reserved_bytes": 2**31,
                "conccl_workspace_bytes": 0, "loss": 1.5, "loss_deterministic": False, "loss_timed_run": 1.5,
                "conccl": None, "clocks": clk}

    capped = clocks.summarize(_lines((1515, "0x4"), (1530, "0x4"), (1980, "0x0"), step_ms=21))
    never = clocks.summarize(_lines((1980, "0x0")))
    res = combine([[rec(0, capped)], [rec(1, never)]])
    assert res[0]["clocks_per_rank"] == [capped, never]
    doc = {"machine_kind": "k", "device": "H100", "world": 2, "commit": "abc", "date": "d", "torch": "2.11",
           "nccl": "2.28", "results": res, "model": {"layers": 1, "dim": 64, "ffn": 128, "heads": 2, "parameters": 1e6}}
    md = markdown(doc)
    assert ("conccl_direct_prefetch, 8192 tokens: the SM clock over the timed steps (nvidia-smi), median while the "
            "power cap held it: rank 0 1522 MHz (2 of 3 samples, one every 21 ms), rank 1 never capped (1980 MHz; "
            "1 sample).") in md
    assert "SM clock" not in markdown({**doc, "results": combine([[rec(0, None)], [rec(1, None)]])})
    parse = build_parser().parse_args
    assert config(parse(["bench-fsdp", "--out", str(tmp_path), "--clocks"])).clocks is True
    assert config(parse(["bench-fsdp", "--out", str(tmp_path)])).clocks is False
