"""``conccl study``: the paper's C3 characterization on these GPUs, or predicted without them."""
from __future__ import annotations

import datetime as _dt
import os
import pathlib
import sys

import torch

from ..bench.environment import environment
from ..collectives import STUDIED as COLLECTIVES
from ..launch import under_torchrun
from ..planner.profile import ProfileError
from ..study import report
from ..study.measure import StudyError
from ..study.results import load_results
from ..study.run import measured, predicted
from ..study.scenarios import SuiteError, load_suite, scenario_from_args, select
from .common import EXIT_FAILED, EXIT_OK, add_machine_kind, fail


def add_parser(sub) -> None:
    s = sub.add_parser(
        "study", help="the paper's C3 characterization on these GPUs: every strategy, a report with figures",
        description="Runs the study suite (or your scenarios) on every visible GPU, one process each (or joins "
                    "torchrun), and writes a report folder: report.md, results.json/.csv, figures/, profile.json. "
                    "With no GPU it predicts the same report from a measured hardware profile (labelled a "
                    "prediction). Sizes are bytes of the collective's output per rank.")
    s.add_argument("--out", default=None, help="report folder (default: study-YYYYmmdd-HHMMSS); must not hold a report")
    s.add_argument("--quick", action="store_true", help="a small subset and shorter sweeps, for a first look")
    s.add_argument("--gpus", type=int, default=None, help="number of GPUs / processes (default: all visible)")
    s.add_argument("--suite", metavar="FILE", help="scenario suite file (default: the paper's, shipped with conccl)")
    s.add_argument("--only", metavar="TAGS", help="comma-separated scenario tags or ids of the suite to run")
    s.add_argument("--gemm", metavar="MxNxK", help="your own scenario: GEMM shape (with --size)")
    s.add_argument("--size", metavar="BYTES", help="your own scenario: collective output bytes per rank, e.g. 1G")
    s.add_argument("--collective", default="all", help=f"your own scenario: {', '.join(COLLECTIVES)} or all")
    s.add_argument("--predict", action="store_true", help="predict from a hardware profile even if GPUs are visible")
    s.add_argument("--profile", metavar="FILE", help="hardware profile to predict from, and that the 'auto' strategy "
                                                     "plans with (default: the embedded H200 x4)")
    s.add_argument("--report", metavar="DIR", help="only re-draw the report of an earlier run from its results.json")
    s.add_argument("--force", action="store_true", help="write into --out even if it holds a report")
    s.add_argument("--no-ncu", action="store_true", help="skip reading GEMM DRAM/L2 bytes with ncu (when installed)")
    s.add_argument("--side-by-side", action="store_true",
                   help="time a scenario's configurations in turns (round robin) instead of one after another")
    add_machine_kind(s, "report")


def study_scenarios(args):
    """The scenarios the flags select; SuiteError naming what is wrong with them."""
    if args.gemm or args.size:
        if not (args.gemm and args.size):
            raise SuiteError("your own scenario needs both --gemm MxNxK and --size BYTES")
        if args.suite or args.only:
            raise SuiteError("give either your own scenario (--gemm/--size) or a suite (--suite/--only), not both")
        return select(scenario_from_args(args.gemm, args.collective, args.size), quick=False)
    if args.collective != "all":
        raise SuiteError("--collective needs --gemm and --size (to filter a suite, use --only)")
    scenarios = select(load_suite(args.suite), quick=args.quick, only=args.only)
    if not scenarios:
        raise SuiteError("no scenario selected")
    return scenarios


def run(args) -> int:
    if args.report:
        try:
            report.render(args.report, load_results(args.report))
        except ValueError as e:
            return fail("study", str(e))
        return EXIT_OK
    try:
        scenarios = study_scenarios(args)
    except SuiteError as e:
        return fail("study", str(e))
    if args.gpus is not None and args.gpus < 1:
        return fail("study", "--gpus must be >= 1")
    out = pathlib.Path(args.out or _dt.datetime.now().strftime("study-%Y%m%d-%H%M%S"))
    if (out / "results.json").exists() and not args.force:
        return fail("study", f"{out} already holds a study report; choose another --out or pass --force")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else (args.gpus or gpus)
    try:
        if args.predict or gpus == 0:
            if not args.predict:
                print("conccl study: no CUDA GPU visible: PREDICTING the report from the embedded hardware profile",
                      file=sys.stderr)
            predicted(scenarios, out, args.gpus, args.quick, args.profile, environment(args.machine_kind, world or 0))
            return EXIT_OK
        if world < 2:
            return fail("study", f"a measured study needs at least 2 GPUs linked by NVLink, found {world}; "
                                 "pass --predict for a report modelled from a hardware profile")
        memory = torch.cuda.get_device_properties(0).total_memory
        res, finished = measured(scenarios, out, world, args.quick, environment(args.machine_kind, world), memory,
                                 use_ncu=not args.no_ncu, plan_profile=args.profile, side_by_side=args.side_by_side)
    except (StudyError, SuiteError, ProfileError) as e:
        return fail("study", str(e))
    if not finished:
        return EXIT_FAILED
    wrong = res is not None and res.summary is not None and res.summary.wrong
    return EXIT_FAILED if wrong else EXIT_OK
