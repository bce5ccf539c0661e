"""Rebuild the shipped pipelines tables (src/conccl/data/h100_tp.json and h200_tp.json,
``pipelines``): all-gather+GEMM from this session's runs, which time every schedule with push
among them (H200: run1, run2, run3's two; H100: run4's two and run5), GEMM+reduce-scatter from
the runs shipped before and, on H100, run5 (the same schedules): per op, shape and schedule the median ratio to the
GEMM alone over those runs (conccl.planner.tp.pipelines_from_bench). Medians over runs that
timed different schedules would set one schedule's GEMM-alone timings against another's (on
H200 session 5's direct 1.07-1.10 on 4096x8192x8192 against this session's 1.17 made push,
1.14 here, look slower). Run from the checkout:
    PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session12/ship_pipelines.py
"""
import json
from pathlib import Path

from conccl.planner.tp import pipelines_from_bench

S12 = "benchmarks/2026-11-26-h100x2-session12"
TABLES = {
    "h200": ("2 x NVIDIA H200 (nvidia-h100-x2 kind, served as H200)",
             ["benchmarks/2026-11-26-h100x2-session5/run4/ops_a/tp.json",
              "benchmarks/2026-11-26-h100x2-session5/run3/ops/tp.json"],
             [f"{S12}/run1/ops/tp.json", f"{S12}/run2/ops/tp.json", f"{S12}/run3/ops1/tp.json",
              f"{S12}/run3/ops2/tp.json"]),
    "h100": ("2 x NVIDIA H100 80GB HBM3 (nvidia-h100-x2)",
             ["benchmarks/2026-11-26-h100x2-session6/run8/ops/tp.json",
              "benchmarks/2026-11-26-h100x2-session7/run1/ops/tp.json", f"{S12}/run5/ops/tp.json"],
             [f"{S12}/run4/ops1/tp.json", f"{S12}/run4/ops2/tp.json", f"{S12}/run5/ops/tp.json"]),
}

for gpu, (machine, old, new) in TABLES.items():
    path = Path(f"src/conccl/data/{gpu}_tp.json")
    load = lambda paths: [json.loads(Path(p).read_text()) for p in paths]  # noqa: E731
    table = json.loads(path.read_text())
    pipelines = pipelines_from_bench(load(new))  # all-gather+GEMM only
    pipelines["gemm_rs"] = pipelines_from_bench(load(old))["gemm_rs"]
    runs = list(dict.fromkeys(old + new))
    docs = load(runs)
    pipelines["source"] = {
        "from": runs, "machine": machine, "commits": [d["meta"].get("commit") for d in docs],
        "what": "conccl bench tp on 2 GPUs: per op, shape and schedule the median ratio to the GEMM alone over the "
                "runs (conccl.planner.tp.pipelines_from_bench); all-gather+GEMM from the newest runs, which time push"}
    table["pipelines"] = pipelines
    path.write_text(json.dumps(table, indent=1) + "\n")
    for shape, by in pipelines["ag_gemm"].items():
        best = min(by, key=by.get)
        print(gpu, shape, best, by[best], "direct", by.get("direct"))
