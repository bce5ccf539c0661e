"""No-device tier: ``conccl.bench.clocks`` (the SM clock sampled by nvidia-smi beside a benchmark)
and how ``conccl bench fsdp --clocks`` reports it. A fake ``nvidia-smi`` on PATH stands in for the
driver's; the GPU run is the benchmark's (benchmarks/2026-11-27-h200x2-session17)."""
from __future__ import annotations

import os
import stat
import time

import pytest

from conccl.bench import clocks


def test_a_sample_line_is_the_clock_and_the_reason_bits_anything_else_is_skipped():
    assert clocks.parse_line("1410, 0x0000000000000004") == (1410.0, 4)
    assert clocks.parse_line(" 1980 , 0x0000000000000000 ") == (1980.0, 0)
    for junk in ("[N/A], 0x0000000000000004", "1410", "", "Field \"clocks_event_reasons.active\" is not a valid field",
                 "1410, 0x4, 700"):
        assert clocks.parse_line(junk) is None


def test_the_summary_gives_the_median_clock_overall_and_while_the_power_cap_held_it():
    lines = ["1980, 0x0", "1410, 0x4", "1380, 0x4", "1395, 0x0000000000000004", "[N/A], 0x4", "1500, 0x1"]
    s = clocks.summarize(lines)
    assert s == {"samples": 5, "period_ms": clocks.PERIOD_MS, "sm_mhz_median": 1410.0, "capped_samples": 3,
                 "sm_mhz_median_capped": 1395.0}
    uncapped = clocks.summarize(["1980, 0x0", "1965, 0x0"])
    assert uncapped["capped_samples"] == 0 and uncapped["sm_mhz_median_capped"] is None
    assert clocks.summarize([]) is None and clocks.summarize(["garbage"]) is None


def test_without_nvidia_smi_the_sampler_gives_no_summary_and_the_block_still_runs(monkeypatch):
    monkeypatch.setattr(clocks.shutil, "which", lambda name: None)
    ran = []
    with clocks.ClockSampler("GPU-x") as s:
        ran.append(1)
    assert ran == [1] and s.summary() is None
    with pytest.raises(ValueError, match="at least 1 ms"):
        clocks.ClockSampler("GPU-x", period_ms=0)


def test_the_sampler_runs_nvidia_smi_for_that_gpu_and_reads_what_it_printed(tmp_path, monkeypatch):
    args_file = tmp_path / "args"
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    f"echo \"$@\" > {args_file}\n"
                    "echo '1410, 0x0000000000000004'\necho '1395, 0x0000000000000004'\necho '1980, 0x0'\n"
                    "exec sleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    t0 = time.monotonic()
    with clocks.ClockSampler("GPU-1234", period_ms=20) as s:
        for _ in range(100):  # until the fake has printed
            if args_file.exists() and args_file.read_text():
                break
            time.sleep(0.05)
        time.sleep(0.2)
    assert time.monotonic() - t0 < 20  # the sleeping fake was stopped, not waited for
    assert args_file.read_text().split() == ["--query-gpu=clocks.sm,clocks_event_reasons.active",
                                             "--format=csv,noheader,nounits", "-i", "GPU-1234", "-lms", "20"]
    assert s.summary() == {"samples": 3, "period_ms": 20, "sm_mhz_median": 1410.0, "capped_samples": 2,
                           "sm_mhz_median_capped": 1402.5}


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

    capped = clocks.summarize(["1515, 0x4", "1530, 0x4", "1980, 0x0"])
    never = clocks.summarize(["1980, 0x0"])
    res = combine([[rec(0, capped)], [rec(1, never)]])
    assert res[0]["clocks_per_rank"] == [capped, never]
    doc = {"machine_kind": "k", "device": "H100", "world": 2, "commit": "abc", "date": "d", "torch": "2.11",
           "nccl": "2.28", "results": res, "model": {"layers": 1, "dim": 64, "ffn": 128, "heads": 2, "parameters": 1e6}}
    md = markdown(doc)
    assert ("SM clock over the warm-up and timed steps (nvidia-smi every 20 ms), median while the power cap held it: "
            "rank 0 1522 MHz (2 of 3 samples), rank 1 never capped (1 samples, 1980 MHz)") in md
    assert "SM clock" not in markdown({**doc, "results": combine([[rec(0, None)], [rec(1, None)]])})
    parse = build_parser().parse_args
    assert config(parse(["bench-fsdp", "--out", str(tmp_path), "--clocks"])).clocks is True
    assert config(parse(["bench-fsdp", "--out", str(tmp_path)])).clocks is False
