"""Why ``auto`` ran slower than the ``conccl`` strategy with the same plan: the runtime path, or
what ran just before it?

In the studies of benchmarks/2026-11-21-h200x4-fast-path, ``auto`` (the planner's plan, run by
``conccl.runtime.launch``) took 2-10% longer than the ``conccl`` strategy on some scenarios
(cb4_2.5G, mb1_896M) and 3-7% less on others (cb4_512M, cb4_1G), run after run, although the
plan was the same: GEMM first, conccl's copy engines, every SM for the GEMM. In a study,
``conccl`` always runs right after ``c3_sp_rp`` (NCCL with a green-context GEMM) and ``auto``
right after ``conccl_rp`` (a GEMM with 16 SMs fewer).

For each scenario this times, with the study's own Rig (6 warm-ups, 9 timed, slowest rank):

* blocks back to back: S (the conccl strategy), A (auto), S, A;
* each of S and A right after a block of P (the configuration that precedes it in a study) and
  after a block of the other one's predecessor;
* S and A in turns (side by side), 15 rounds;
* A' : runtime.launch on the study's own GEMM and collective streams (is it the streams?).

Run: ``PYTHONPATH=src python3 benchmarks/2026-11-21-h200x4-auto-in-turns/auto_gap.py --out DIR [--only cb4_2.5G/all_gather,...]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

import conccl
from conccl import runtime
from conccl.launch import run_per_gpu
from conccl.study.cases import CollectiveCase, GemmCase
from conccl.study.config import StudyConfig, scenario_arenas
from conccl.study.measure import _auto_parts
from conccl.study.rig import Rig
from conccl.study.scenarios import load_suite

DEFAULT = "cb4_2.5G/all_gather,cb4_512M/all_gather,mb1_896M/all_gather,dec2_128M/all_to_all"


def worker(rank: int, world: int, ids: list[str]) -> list[dict] | None:
    suite = {s.id: s for s in load_suite()}
    scenarios = [suite[i] for i in ids]
    cfg = StudyConfig(scenarios=scenarios)
    rig = Rig(rank, world, cfg)
    out_b, in_b = (max(sizes) for sizes in zip(*(scenario_arenas(s, world) for s in scenarios)))  # one pair for all
    arenas = (conccl.empty(out_b, dtype=torch.uint8), conccl.empty(in_b, dtype=torch.uint8))
    rows = []
    for s in scenarios:
        size = s.size_for(world)
        gemm = GemmCase(rig, s.gemm)
        case = CollectiveCase(rig, s.collective, size, arenas)
        stream16, _ = rig.green_stream(16)
        grp = rig.nccl_group(ctas=32)
        cfgs = {
            "S": [(rig.gemm_stream, gemm.fn()), (rig.comm_stream, case.fn("conccl"))],
            "A": _auto_parts(rig, s, size, case, gemm)[0],
            "P_S": [(rig.comm_stream, case.fn("nccl", grp)), (rig.green_stream(32)[0], gemm.fn())],  # c3_sp_rp 32
            "P_A": [(stream16, gemm.fn()), (rig.comm_stream, case.fn("conccl"))],  # conccl_rp 16
        }
        plan = runtime.get_plan((s.gemm.m, s.gemm.n, s.gemm.k), s.collective, size, world, "auto",
                                device_name=rig.device_name)

        class _RigParts:  # runtime.launch on the study's own streams
            comm_stream = rig.comm_stream

            def green_stream(self, k):
                return rig.green_stream(k)

            def nccl_group(self, ctas, hp):
                return rig.nccl_group(ctas, hp)

            def events(self):
                return rig.partitions.events()

        compute = gemm.fn()
        outer = torch.cuda.Stream()  # the caller's stream, apart from the two launch() uses
        cfgs["A_rig"] = [(outer, lambda: runtime.launch(plan, compute, lambda impl, group: case.fn(impl, group)(),
                                           parts=_RigParts()))]
        med = lambda name: statistics.median(rig.timed(cfgs[name]))  # noqa: E731
        rec = {"id": s.id, "plan": plan.strategy, "order": list(plan.launch_order)}
        seq = []
        for name in ("S", "A", "S", "A", "A_rig", "S", "A_rig"):
            seq.append((name, med(name)))
        rec["blocks"] = seq
        after = {}
        for prev in ("P_S", "P_A"):
            for name in ("S", "A"):
                med(prev)
                after[f"{name} after {prev}"] = med(name)
        rec["after"] = after
        saved = rig.cfg.iters
        rig.cfg.iters = 15
        res = rig.timed_side_by_side([(cfgs["S"], None, None), (cfgs["A"], None, None), (cfgs["A_rig"], None, None)])
        rig.cfg.iters = saved
        rec["in_turns"] = {k: statistics.median(t) for k, (t, _) in zip(("S", "A", "A_rig"), res)}
        rows.append(rec)
        if rank == 0:
            print(json.dumps(rec), flush=True)
        cfgs = gemm = case = None
        torch.cuda.empty_cache()
    return rows if rank == 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=DEFAULT)
    args = ap.parse_args()

    rows = run_per_gpu(worker, args.only.split(","), timeout_s=900)[0]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "auto_gap.json"), "w") as f:
        json.dump({"commit": os.environ.get("CONCCL_COMMIT"), "rows": rows}, f, indent=1)
    lines = ["| scenario | plan | blocks S, A, S, A, A_rig, S, A_rig (ms) | S / A after P_S | S / A after P_A | "
             "in turns S / A / A_rig |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        a = r["after"]
        t = r["in_turns"]
        lines.append(f"| {r['id']} | {r['plan']} | {', '.join(f'{n} {v:.3f}' for n, v in r['blocks'])} | "
                     f"{a['S after P_S']:.3f} / {a['A after P_S']:.3f} | {a['S after P_A']:.3f} / {a['A after P_A']:.3f} | "
                     f"{t['S']:.3f} / {t['A']:.3f} / {t['A_rig']:.3f} |")
    with open(os.path.join(args.out, "auto_gap.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
