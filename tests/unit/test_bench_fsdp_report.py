"""No-device tier: ``conccl bench fsdp``'s reduction over ranks and its table, from made-up
per-rank records (the GPU run is the benchmark's, under benchmarks/)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from conccl.bench.fsdp import combine, markdown  # noqa: E402


def _rec(rank, config, times, direct=None, host=None):
    return {"tokens_per_rank": 2048, "config": config, "rank": rank, "times_ms": times, "peak_alloc_bytes": 2**30,
            "iteration_ms": [t + 2 * rank + 1 for t in times],
            "host_ms": host,
            "peak_reserved_bytes": 2**31, "conccl_workspace_bytes": 0, "loss": 1.5, "loss_deterministic": False,
            "loss_timed_run": 1.5,
            "conccl": None if direct is None else {"modules": 9, "fallback": [], "memory": {}, "direct": direct,
                                                   "programs_compiled_timed": 3, "program_compile_s_timed": 0.0021,
                                                   "board_posts_timed": 20, "board_exchanges_timed": 24}}


def test_slowest_rank_per_step_then_median_and_the_direct_counts_in_the_table():
    direct = {"skipped_copy_outs": 180, "declined_gathers": 0, "skipped_copy_ins": 90, "declined_reduces": 1,
              "skipped_gather_copy_ins": 170}
    per_rank = [[_rec(0, "no_comm", [10, 12, 11]), _rec(0, "conccl_direct", [11, 30, 12], direct, [5, 9, 4])],
                [_rec(1, "no_comm", [13, 9, 11]), _rec(1, "conccl_direct", [20, 12, 12], direct, [6, 2, 3])]]
    res = combine(per_rank)
    assert [r["step_ms"] for r in res] == [12, 20]  # slowest per step: [13, 12, 11] and [20, 30, 12]
    assert res[0]["host_ms"] is None and res[1]["host_ms"] == 6  # slowest per step: [6, 9, 4]
    assert res[1]["step_ms_spread"] == [12, 30]
    doc = {"machine_kind": "nvidia-h200-x2", "device": "H200", "world": 2, "commit": "abc", "date": "2026-11-23",
           "torch": "2.11", "nccl": "2.28", "results": res,
           "model": {"layers": 1, "dim": 64, "ffn": 128, "heads": 2, "parameters": 1e6}}
    md = markdown(doc)
    # the whole iteration (times + 1 on rank 0, + 3 on rank 1): slowest per step [16, 13, 14] and [23, 31, 15]
    assert res[1]["iteration_ms"] == 23 and res[1]["iteration_ms_spread"] == [15, 31]
    assert "| 2048 | conccl_direct | 20.00 | 12.00-30.00 | 1.667 | 23.00 | 15.00-31.00 | 1.643 |" in md
    assert ("conccl_direct, 2048 tokens (rank 0, timed run): 3 copy-engine programs compiled during the timed steps "
            "(2.1 ms of host time); 20 of its 24 calls on the host board during the timed steps posted their row "
            "without waiting for the peers'; the host queued a step's forward and backward in 6.00 ms (median, slowest rank); "
            "180 all-gather copy-outs, 170 all-gather copy-ins and 90 reduce-scatter copy-ins skipped; "
            "0 all-gathers and 1 reduce-scatters left to FSDP's copies.") in md


def test_segments_are_summed_per_stream_they_were_made_on_largest_first(monkeypatch):
    import types

    pytest.importorskip("torch")
    from conccl.bench import fsdp as bench_fsdp

    snapshot = [{"stream": 11, "total_size": 2 << 30, "allocated_size": 1 << 30},
                {"stream": 99, "total_size": 3 << 30, "allocated_size": 0},
                {"stream": 11, "total_size": 2 << 30, "allocated_size": 0}]
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        current_stream=lambda: types.SimpleNamespace(cuda_stream=11), memory_snapshot=lambda: snapshot))
    rows = bench_fsdp._segments(fake)
    assert rows == [{"stream": "compute", "segments": 2, "reserved_gib": 4.0, "allocated_gib": 1.0},
                    {"stream": "99", "segments": 1, "reserved_gib": 3.0, "allocated_gib": 0.0}]


def test_host_profile_names_the_model_s_own_functions_per_step_and_the_table_shows_them():
    import torch

    from conccl.bench import fsdp as bench_fsdp, fsdp_profile

    shape = bench_fsdp.ModelShape(dim=32, ffn=64, heads=2, layers=2)
    model = bench_fsdp.Model(shape)
    x = torch.randn(1, 8, 32)
    hp = fsdp_profile.host_profile(model, x, steps=2)
    assert hp["steps"] == 2 and hp["host_ms_per_step_profiled"] > 0
    assert set(hp["gc_ms_per_step"]) == {"generation 0", "generation 1", "generation 2"}
    assert all(v >= 0 for v in hp["gc_ms_per_step"].values()) and hp["gc_collections_per_step"] >= 0
    forward = [r for r in hp["by_cumulative_time"] if r["function"].endswith("(forward)") and "fsdp.py" in r["function"]]
    # Model.forward once per step, Block.forward twice: both among the costliest by cumulative time
    assert sorted(r["calls_per_step"] for r in forward) == [1, 2], hp["by_cumulative_time"]
    assert all(r["cumulative_ms"] >= r["own_ms"] >= 0 for r in hp["by_own_time"])
    assert all(p.grad is None for p in model.parameters())  # the profiled steps leave no gradient behind
    res = combine([[dict(_rec(0, "stock", [10.0]), host_profile=hp)]])
    md = markdown({"machine_kind": "cpu", "device": "cpu", "world": 1, "commit": "abc", "date": "d", "torch": "t",
                   "nccl": "n", "results": res, "model": {"layers": 2, "dim": 32, "ffn": 64, "heads": 2,
                                                          "parameters": 1e4}})
    assert "## stock, 2048 tokens: host time by function (cProfile, rank 0, 2 steps" in md
    assert "Python's garbage collector per step: generation 0 " in md
    assert f"| `{hp['by_own_time'][0]['function']}` |" in md


def test_overlap_splits_copy_time_into_beside_kernels_and_alone_and_the_table_says_it():
    from conccl.bench.fsdp_profile import overlap

    # kernels 0-10 and 8-20 (one busy span 0-20) and 30-40; copies 5-25 and 38-45 (us)
    o = overlap([(0, 10), (8, 20), (30, 40)], [(5, 25), (38, 45)])
    assert o["span_ms"] == pytest.approx(0.045) and o["kernel_ms"] == pytest.approx(0.030)
    assert o["copy_ms"] == pytest.approx(0.027)
    assert o["copy_beside_kernels_ms"] == pytest.approx(0.017)  # 5-20 and 38-40
    assert o["copy_alone_ms"] == pytest.approx(0.010)  # 20-25 and 40-45
    assert o["idle_ms"] == pytest.approx(0.005)  # 25-30
    assert o["copy_alone_longest"] == [[0.02, 0.005], [0.04, 0.005]]  # [ms from the start, ms long]
    # a copy under several kernels with gaps between them: exposed only in the gaps
    gaps = overlap([(0, 10), (12, 14), (16, 30)], [(5, 25)])
    assert gaps["copy_alone_ms"] == pytest.approx(0.004) and gaps["copy_alone_longest"] == [[0.01, 0.002], [0.014, 0.002]]
    assert overlap([], []) == {"span_ms": 0, "kernel_ms": 0, "copy_ms": 0, "copy_beside_kernels_ms": 0,
                               "copy_alone_ms": 0, "idle_ms": 0, "copy_alone_longest": []}
    prof = {"stream 7": {"gemm": 1.5, "memcpy (copy engine)": 0.25}, "overlap": o}
    res = combine([[dict(_rec(0, "conccl_direct_prefetch", [10.0], {"skipped_copy_outs": 1, "declined_gathers": 0,
                                                                       "skipped_copy_ins": 1, "declined_reduces": 0,
                                                                       "cast_gathers": 9, "reused_casts": 8}),
                         profile=prof)]])
    md = markdown({"machine_kind": "cpu", "device": "cpu", "world": 1, "commit": "abc", "date": "d", "torch": "t",
                   "nccl": "n", "results": res, "model": {"layers": 2, "dim": 32, "ffn": 64, "heads": 2,
                                                          "parameters": 1e4}})
    assert "| stream 7 | 1.50 | 0.25 |" in md and "| overlap |" not in md
    assert ("kernels ran 0.03 ms, copy engines 0.03 ms (0.02 beside a kernel, 0.01 with none running), "
            "nothing 0.01 ms.") in md
    assert "(9 made one cast into a cast home instead, 8 backward all-gathers read their forward's cast)" in md


def test_the_learning_rate_is_in_the_header_and_the_flag_reaches_the_config(tmp_path):
    from conccl.cli import build_parser
    from conccl.cli.bench_fsdp import config

    doc = {"machine_kind": "k", "device": "H100", "world": 2, "commit": "abc", "date": "d", "torch": "2.11",
           "nccl": "2.28", "results": combine([[_rec(0, "no_comm", [10])], [_rec(1, "no_comm", [11])]]),
           "model": {"layers": 1, "dim": 64, "ffn": 128, "heads": 2, "parameters": 1e6}}
    assert "AdamW at lr 0.0001;" in markdown({**doc, "config": {"lr": 1e-4}})
    assert "AdamW at lr 0 (the weights never change: every config multiplies the same data)" in markdown(
        {**doc, "config": {"lr": 0.0}})
    parse = build_parser().parse_args
    assert config(parse(["bench-fsdp", "--out", str(tmp_path), "--lr", "0"])).lr == 0.0
    assert config(parse(["bench-fsdp", "--out", str(tmp_path)])).lr == 1e-4
