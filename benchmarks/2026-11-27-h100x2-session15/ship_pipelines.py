"""Rebuild the shipped H100 pipelines table (src/conccl/data/h100_tp.json, ``pipelines``) from
run7's two turns (2 x H100, 2026-11-27): the first op benches whose all-gather+GEMM ratios
divide by a GEMM alone on the gathered rows (before, its input was uninitialised unless a
serial schedule ran: ratios off by up to 10%, conccl.bench.tp.gathered_input), and whose
GEMM+reduce-scatter pipelines are this code's (the settled pipelines' edges, session 13's
tail). Both ops, every schedule: per op, shape and schedule the median ratio over the two
turns (conccl.planner.tp.pipelines_from_bench). The H200 table keeps its runs (not re-measured).
    PYTHONPATH=src python3 benchmarks/2026-11-27-h100x2-session15/ship_pipelines.py
"""
import json
from pathlib import Path

from conccl.planner.tp import pipelines_from_bench

S15 = "benchmarks/2026-11-27-h100x2-session15"
RUNS = [f"{S15}/run7/ops_1/tp.json", f"{S15}/run7/ops_2/tp.json"]

path = Path("src/conccl/data/h100_tp.json")
table = json.loads(path.read_text())
docs = [json.loads(Path(p).read_text()) for p in RUNS]
pipelines = pipelines_from_bench(docs)
pipelines["source"] = {
    "from": RUNS, "machine": "2 x NVIDIA H100 80GB HBM3 (nvidia-h100-x2)",
    "commits": [d["meta"].get("commit") for d in docs],
    "what": "conccl bench tp on 2 GPUs, ranks aligned: per op, shape and schedule the median ratio to the GEMM alone "
            "over the runs (conccl.planner.tp.pipelines_from_bench); the GEMM alone multiplies the gathered rows"}
table["pipelines"] = pipelines
path.write_text(json.dumps(table, indent=1) + "\n")
for op in ("ag_gemm", "gemm_rs"):
    for shape, by in pipelines[op].items():
        best = min(by, key=by.get)
        print(op, shape, best, by[best])
