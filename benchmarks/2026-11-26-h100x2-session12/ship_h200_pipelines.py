"""Rebuild the H200's shipped pipelines table (src/conccl/data/h200_tp.json, ``pipelines``):
all-gather+GEMM from this session's four runs on 2 x H200 (run1, run2, run3's two), which time
every schedule with push among them, GEMM+reduce-scatter from session 5's two (this session's
ran none): per op, shape and schedule the median ratio to the GEMM alone over those runs
(conccl.planner.tp.pipelines_from_bench). Medians over runs that timed different schedules
would compare a schedule's GEMM-alone timings with another's: session 5's direct 1.07-1.10 on
4096x8192x8192 against this session's 1.17, which made push (1.14 here) look slower.
Run from the checkout:
    PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session12/ship_h200_pipelines.py
"""
import json
from pathlib import Path

from conccl.planner.tp import pipelines_from_bench

OLD = ["benchmarks/2026-11-26-h100x2-session5/run4/ops_a/tp.json",
       "benchmarks/2026-11-26-h100x2-session5/run3/ops/tp.json"]
NEW = ["benchmarks/2026-11-26-h100x2-session12/run1/ops/tp.json",
       "benchmarks/2026-11-26-h100x2-session12/run2/ops/tp.json",
       "benchmarks/2026-11-26-h100x2-session12/run3/ops1/tp.json",
       "benchmarks/2026-11-26-h100x2-session12/run3/ops2/tp.json"]
RUNS = OLD + NEW
TABLE = Path("src/conccl/data/h200_tp.json")

docs = [json.loads(Path(p).read_text()) for p in RUNS]
table = json.loads(TABLE.read_text())
pipelines = pipelines_from_bench(docs[len(OLD):])  # all-gather+GEMM only
pipelines["gemm_rs"] = pipelines_from_bench(docs[:len(OLD)])["gemm_rs"]
pipelines["source"] = {
    "from": RUNS, "machine": "2 x NVIDIA H200 (nvidia-h100-x2 kind, served as H200)",
    "commits": [d["meta"].get("commit") for d in docs],
    "what": "conccl bench tp on 2 GPUs: per op, shape and schedule the median ratio to the GEMM alone over the "
            "runs (conccl.planner.tp.pipelines_from_bench)"}
table["pipelines"] = pipelines
TABLE.write_text(json.dumps(table, indent=1) + "\n")
print(json.dumps({k: v for k, v in pipelines["ag_gemm"].items()}, indent=0)[:3000])
