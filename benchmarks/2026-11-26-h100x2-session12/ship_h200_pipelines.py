"""Rebuild the H200's shipped pipelines table (src/conccl/data/h200_tp.json, ``pipelines``) from
session 5's two runs and this session's run1 and run2 (both on 2 x H200), which add the push
schedules: per op, shape and schedule the median ratio to the GEMM alone over the runs that
timed it (conccl.planner.tp.pipelines_from_bench). Run from the checkout:
    PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session12/ship_h200_pipelines.py
"""
import json
from pathlib import Path

from conccl.planner.tp import pipelines_from_bench

RUNS = ["benchmarks/2026-11-26-h100x2-session5/run4/ops_a/tp.json",
        "benchmarks/2026-11-26-h100x2-session5/run3/ops/tp.json",
        "benchmarks/2026-11-26-h100x2-session12/run1/ops/tp.json",
        "benchmarks/2026-11-26-h100x2-session12/run2/ops/tp.json"]
TABLE = Path("src/conccl/data/h200_tp.json")

docs = [json.loads(Path(p).read_text()) for p in RUNS]
table = json.loads(TABLE.read_text())
pipelines = pipelines_from_bench(docs)
pipelines["source"] = {
    "from": RUNS, "machine": "2 x NVIDIA H200 (nvidia-h100-x2 kind, served as H200)",
    "commits": [d["meta"].get("commit") for d in docs],
    "what": "conccl bench tp on 2 GPUs: per op, shape and schedule the median ratio to the GEMM alone over the "
            "runs (conccl.planner.tp.pipelines_from_bench)"}
table["pipelines"] = pipelines
TABLE.write_text(json.dumps(table, indent=1) + "\n")
print(json.dumps({k: v for k, v in pipelines["ag_gemm"].items()}, indent=0)[:3000])
