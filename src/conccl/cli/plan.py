"""``conccl plan``: the plan for one GEMM beside one collective, the planner's accuracy
against a measured study (``--evaluate``), or a prediction for a multi-node job (``--nodes``:
:mod:`.plan_multinode`). Runs on a CPU machine."""
from __future__ import annotations

import argparse
import json

from ..collectives import REGISTRY as COLLECTIVES
from ..planner import candidates, plan
from ..jsonfile import write_text
from ..planner import timing
from ..planner.profile import load_profile
from ..planner.timing import MAX_WORLD
from ..strategy import STRATEGIES
from ..study.evaluate import evaluate, markdown
from ..study.results import load_results
from ..study.scenarios import Scenario, parse_gemm
from ..units import parse_size
from . import plan_multinode
from .common import COMMAND_HELP, EXIT_OK, UsageError, about, check_out_file, fail, int_range, print_and_write


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan", help=COMMAND_HELP["plan"],
        description="Prints the plan the runtime would apply (conccl.overlap(plan='auto')), the predicted times "
                    "and percent of ideal, as a table (and JSON with --json). With --evaluate DIR, compares the "
                    "planner's choices with the best strategy a measured `conccl study` found.")
    p.add_argument("--gemm", metavar="MxNxK", help="GEMM shape: C[M x N] = A[M x K] @ B[K x N]")
    p.add_argument("--collective", choices=tuple(COLLECTIVES), default="all_gather")
    p.add_argument("--size", metavar="BYTES", help="collective output bytes per rank, e.g. 2G")
    p.add_argument("--world", type=int_range(2, MAX_WORLD), default=None,
                   help=f"ranks, 2 to {MAX_WORLD} (default: the profile's; another is an extrapolation)")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    p.add_argument("--strategy", default="auto",
                   help="auto (the planner) or a study strategy to predict: "
                        + ", ".join(n for n, s in STRATEGIES.items() if s.runtime_applies))
    p.add_argument("--profile", metavar="FILE", help="hardware profile (default: the embedded H200 x4)")
    p.add_argument("--json", metavar="FILE", help="also write the plan as JSON to FILE ('-': JSON only, on stdout)")
    p.add_argument("--evaluate", metavar="REPORT_DIR", help="judge the planner on a measured study's results.json")
    p.add_argument("--markdown", metavar="FILE", help="with --evaluate: write the evaluation as markdown")
    plan_multinode.add_arguments(p)


def plan_table(pl, prof=None, extrapolated: str | None = None) -> str:
    w, pr = pl.workload, pl.predicted
    ill = pr["ideal"] < timing.ILL_CONDITIONED
    rows = [("PREDICTION", "from the hardware profile " + (f"{prof.device} x{prof.world}, measured "
                                                         f"{prof.source.get('date', '?')}, commit "
                                                         f"{prof.source.get('commit', '?')}" if prof else "given")),
            ("GEMM", f"{w.m}x{w.n}x{w.k} ({pr['gemm_class']})"),
            ("collective", f"{w.collective}, {w.size} B output per rank, world {w.world}"),
            ("strategy", pl.strategy),
            ("collective implementation", {"nccl": "NCCL (SM kernels)", "conccl": "conccl (copy engines, no SM)"}[pl.impl]),
            ("launch order", " -> ".join(pl.launch_order)),
            ("collective stream priority", "high" if pl.comm_high_priority else "normal"),
            ("SMs withheld from the GEMM", str(pl.gemm_sms_taken)),
            ("NCCL CTAs", "NCCL's choice" if pl.nccl_ctas is None else str(pl.nccl_ctas)),
            ("predicted efficiency", f"{pr['efficiency']:.1f}% (max(GEMM, fastest collective) alone / together)"),
            ("predicted GEMM alone", f"{1e3 * pr['gemm_s']:.3f} ms"),
            ("predicted collective alone", f"{1e3 * pr['comm_s']:.3f} ms ({pl.impl}); NCCL {1e3 * pr['comm_nccl_s']:.3f} ms"),
            ("predicted together", f"{1e3 * pr['concurrent_s']:.3f} ms"),
            ("ideal speedup", f"{pr['ideal']:.3f}x"),
            ("predicted speedup", f"{pr['speedup']:.3f}x"),
            ("predicted % of ideal", f"{pr['pct_ideal']:.1f}%" + (
                f" (ill-conditioned: the ideal is below {timing.ILL_CONDITIONED}x, one kernel much longer; "
                "read the efficiency)" if ill else ""))]
    if extrapolated:
        rows.insert(1, ("EXTRAPOLATED", extrapolated))
    width = max(len(k) for k, _ in rows)
    out = [f"{k:<{width}}  {v}" for k, v in rows]
    out += [f"{'why':<{width}}  {r}" for r in pl.reasons]
    return "\n".join(out)


def run(args) -> int:
    for flag in ("--json", "--markdown"):
        check_out_file(getattr(args, flag[2:]), flag)
    if args.markdown and not args.evaluate:
        raise UsageError("--markdown writes the evaluation: give it with --evaluate REPORT_DIR")
    with about("--profile", args.profile or "(embedded)"):
        prof = load_profile(args.profile)
    if plan_multinode.wanted(args):
        return plan_multinode.run(args, prof)
    if args.evaluate:
        ignored = [f for f, v in (("--gemm", args.gemm), ("--size", args.size), ("--world", args.world)) if v]
        if ignored:
            raise UsageError(f"--evaluate judges a study's own scenarios; {', '.join(ignored)} would be ignored: "
                             "drop them")
        return _evaluate(args, prof)
    if not args.gemm or not args.size:
        return fail("plan", "give --gemm MxNxK and --size BYTES (or --evaluate REPORT_DIR)")
    with about("--gemm", args.gemm):
        g = parse_gemm(args.gemm)
    try:
        size = parse_size(args.size)
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"--size: {e}") from None
    world = args.world or prof.world
    need = Scenario("plan", g, args.collective, size).memory_bytes(world)
    if need > prof.memory_bytes:
        raise UsageError(f"--gemm {args.gemm} --size {args.size}: needs {need / 2**30:.1f} GiB per GPU, the profile's "
                         f"GPU has {prof.memory_bytes / 2**30:.1f} GiB; give a smaller GEMM or size")
    with about("--strategy", args.strategy):
        pl = plan(prof, (g.m, g.n, g.k), args.collective, size, world, args.strategy,
                  dtype_bytes=2 if args.dtype in ("bfloat16", "float16") else 4)
    extrapolated = timing.extrapolation(prof, world)
    doc = {"format": "conccl-plan/1", "plan": pl.to_dict(), "prediction": True, "extrapolated": extrapolated,
           "candidates": [c.to_dict() for c in candidates(prof, pl.workload)],
           "profile": {"device": prof.device, "world": prof.world, **prof.source}}
    if args.json == "-":
        print(json.dumps(doc, indent=1))
        return EXIT_OK
    print(plan_table(pl, prof, extrapolated))
    if args.json:
        write_text(args.json, json.dumps(doc, indent=1) + "\n")
    return EXIT_OK


def _evaluate(args, prof) -> int:
    with about("--evaluate", args.evaluate):
        res = load_results(args.evaluate)
        ev = evaluate(res, prof)
    print_and_write(markdown(ev), args.markdown, args.json, ev)
    return EXIT_OK
