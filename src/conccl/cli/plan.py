"""``conccl plan``: the plan for one GEMM beside one collective, or the planner's accuracy
against a measured study (``--evaluate``). Runs on a CPU machine."""
from __future__ import annotations

import argparse
import json
import pathlib

from ..collectives import STUDIED as COLLECTIVES
from ..planner import candidates, plan
from ..planner.plan import PlanError
from ..planner.profile import ProfileError, load_profile
from ..strategy import STRATEGIES
from ..study.evaluate import evaluate, markdown
from ..study.results import load_results
from ..study.scenarios import SuiteError, parse_gemm
from ..units import parse_size
from .common import EXIT_OK, fail


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan", help="the strategy and SM split for a GEMM beside a collective, predicted from a hardware profile",
        description="Prints the plan the runtime would apply (conccl.overlap(plan='auto')), the predicted times "
                    "and percent of ideal, as a table (and JSON with --json). With --evaluate DIR, compares the "
                    "planner's choices with the best strategy a measured `conccl study` found.")
    p.add_argument("--gemm", metavar="MxNxK", help="GEMM shape: C[M x N] = A[M x K] @ B[K x N]")
    p.add_argument("--collective", choices=tuple(COLLECTIVES), default="all_gather")
    p.add_argument("--size", metavar="BYTES", help="collective output bytes per rank, e.g. 2G")
    p.add_argument("--world", type=int, default=None, help="ranks (default: the profile's)")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    p.add_argument("--strategy", default="auto",
                   help="auto (the planner) or a study strategy to predict: "
                        + ", ".join(n for n, s in STRATEGIES.items() if s.runtime_applies))
    p.add_argument("--profile", metavar="FILE", help="hardware profile (default: the embedded H200 x4)")
    p.add_argument("--json", metavar="FILE", help="also write the plan as JSON to FILE ('-': JSON only, on stdout)")
    p.add_argument("--evaluate", metavar="REPORT_DIR", help="judge the planner on a measured study's results.json")
    p.add_argument("--markdown", metavar="FILE", help="with --evaluate: write the evaluation as markdown")


def plan_table(pl) -> str:
    w, pr = pl.workload, pl.predicted
    rows = [("GEMM", f"{w.m}x{w.n}x{w.k} ({pr['gemm_class']})"),
            ("collective", f"{w.collective}, {w.size} B output per rank, world {w.world}"),
            ("strategy", pl.strategy),
            ("collective implementation", {"nccl": "NCCL (SM kernels)", "conccl": "conccl (copy engines, no SM)"}[pl.impl]),
            ("launch order", " -> ".join(pl.launch_order)),
            ("collective stream priority", "high" if pl.comm_high_priority else "normal"),
            ("SMs withheld from the GEMM", str(pl.gemm_sms_taken)),
            ("NCCL CTAs", "NCCL's choice" if pl.nccl_ctas is None else str(pl.nccl_ctas)),
            ("predicted GEMM alone", f"{1e3 * pr['gemm_s']:.3f} ms"),
            ("predicted collective alone", f"{1e3 * pr['comm_s']:.3f} ms ({pl.impl}); NCCL {1e3 * pr['comm_nccl_s']:.3f} ms"),
            ("predicted together", f"{1e3 * pr['concurrent_s']:.3f} ms"),
            ("ideal speedup", f"{pr['ideal']:.3f}x"),
            ("predicted speedup", f"{pr['speedup']:.3f}x"),
            ("predicted % of ideal", f"{pr['pct_ideal']:.1f}%")]
    width = max(len(k) for k, _ in rows)
    out = [f"{k:<{width}}  {v}" for k, v in rows]
    out += [f"{'why':<{width}}  {r}" for r in pl.reasons]
    return "\n".join(out)


def run(args) -> int:
    try:
        prof = load_profile(args.profile)
    except ProfileError as e:
        return fail("plan", str(e))
    if args.evaluate:
        return _evaluate(args, prof)
    if not args.gemm or not args.size:
        return fail("plan", "give --gemm MxNxK and --size BYTES (or --evaluate REPORT_DIR)")
    try:
        g = parse_gemm(args.gemm)
        size = parse_size(args.size)
        pl = plan(prof, (g.m, g.n, g.k), args.collective, size, args.world, args.strategy,
                  dtype_bytes=2 if args.dtype in ("bfloat16", "float16") else 4)
    except (SuiteError, PlanError, ValueError, argparse.ArgumentTypeError) as e:
        return fail("plan", str(e))
    doc = {"format": "conccl-plan/1", "plan": pl.to_dict(),
           "candidates": [c.to_dict() for c in candidates(prof, pl.workload)],
           "profile": {"device": prof.device, "world": prof.world, **prof.source}}
    if args.json == "-":
        print(json.dumps(doc, indent=1))
        return EXIT_OK
    print(plan_table(pl))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return EXIT_OK


def _evaluate(args, prof) -> int:
    try:
        ev = evaluate(load_results(args.evaluate), prof)
    except ValueError as e:
        return fail("plan", str(e))
    text = markdown(ev)
    print(text)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(ev, indent=1) + "\n")
    return EXIT_OK
