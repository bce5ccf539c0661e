"""No-device tier: what the benchmarks report. ``conccl bench tp``'s table carries each
implementation's host time (the host's time to queue one call: what a step whose host cannot
run ahead pays); ``conccl bench``'s bandwidths are nccl-tests'."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from conccl.bench.tp import Record, TPBenchConfig, document, markdown  # noqa: E402


def test_the_table_shows_host_time_beside_gpu_time_and_old_records_without_it():
    recs = [Record("ag_gemm", 1024, 8192, 7168, 2, "gemm_only", None, None, 0.177, 0.01, 1.0, host_ms=0.021),
            Record("ag_gemm", 1024, 8192, 7168, 2, "conccl", "direct", "p1-g1", 0.188, 0.02, 1.062, host_ms=0.4123),
            Record("ag_gemm", 1024, 8192, 7168, 2, "torch_async_tp", None, None, 0.2, 0.02, 1.13)]
    doc = document({"machine_kind": "x", "world": 2, "date": "d", "commit": "c"}, TPBenchConfig(), recs)
    md = markdown(doc)
    assert "| ms | spread | x GEMM | host ms | wrong |" in md
    assert "| conccl | direct | 0.188 | 2.0% | 1.062 | 0.412 |  |" in md
    assert "| torch_async_tp |  | 0.200 | 2.0% | 1.130 |  |  |" in md  # no host time recorded: blank
    assert doc["results"][1]["host_ms"] == 0.4123


def test_bandwidth_bytes_are_nccl_tests_size_column():
    # nccl-tests' algbw divides by its "size": the output per rank, but a reduce-scatter's input
    from conccl.collectives import REGISTRY

    assert REGISTRY["reduce_scatter"].bandwidth_bytes(1 << 20, 4) == 4 << 20
    for name in ("all_gather", "all_to_all", "all_reduce"):
        assert REGISTRY[name].bandwidth_bytes(1 << 20, 4) == 1 << 20, name
