"""GPU tier: a tiny ``conccl bench graphs`` (2 sizes, every collective, every mode: graph, eager
and beside running GEMMs) writes a record for every case, each with finite times and 0 wrong
elements against NCCL.

Starts one process per GPU (skipping: conftest.py)."""
from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")


def test_tiny_graphs_bench_is_complete_finite_and_correct(tmp_path):
    from conccl.bench import graphs
    from conccl.cli import main
    impls = ["nccl", "conccl", "conccl_auto"]  # auto on any GPU: a shipped profile, or a borrowed one
    sizes = [64 << 10, 1 << 20]
    rc = main(["bench", "graphs", "--out", str(tmp_path), "--sizes", "64K,1M", "--calls", "4", "--replays", "2",
               "--runs", "2", "--warmup", "1", "--gpus", "2", "--impls", ",".join(impls),
               "--modes", "graph,eager,beside",
               "--machine-kind", "test"])
    doc = json.loads((tmp_path / "graphs.json").read_text())
    md = (tmp_path / "graphs.md").read_text()
    recs = graphs.records_of(doc)
    failed = [r for r in recs if r.error is not None or r.wrong]
    assert rc == 0 and not failed, failed
    assert doc["machine_kind"] == "test" and doc["world"] == 2 and doc["nccl"] and doc["commit"]
    cases = {(r.collective, r.bytes, r.impl, r.mode) for r in recs}
    want = {(c, s, i, m) for c in doc["config"]["collectives"] for s in sizes for i in impls for m in graphs.MODES}
    assert cases == want, want ^ cases
    for r in recs:
        assert all(math.isfinite(t) and t > 0 for t in (r.us_per_call, r.us_min, r.us_max)), r
        assert r.calls_per_graph == (1 if r.mode == "beside" else 4) and len(r.us_runs) == 2
        if r.mode == "beside":  # one call's completion while GEMMs run, and what the GEMMs lost
            assert r.alone_us > 0 and 0.5 < r.gemm_slowdown < 3, r
        if r.impl == "conccl_auto":
            assert r.path in ("copy_engines", "nccl"), r
    assert "## all_gather, in a graph" in md and "## all_to_all, eager" in md and "## all_reduce, beside" in md
    # what set_eager_path("auto") returned is in the file, with the profile it chose
    assert doc["eager_path"]["profile"]["chosen"] in ("shipped", "fallback")
    assert "conccl_auto planned with the hardware profile" in md
