"""``conccl study``: the paper's C3 characterization on these GPUs, or predicted without them."""
from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
from dataclasses import asdict

import torch

from ..bench.environment import environment
from ..collectives import REGISTRY, STUDIED as COLLECTIVES
from ..jsonfile import write_text
from ..launch import under_torchrun
from ..planner import multinode
from ..planner.profile import load_profile
from ..planner.timing import MAX_WORLD
from ..study import report
from ..study.results import RESULTS, ResultsError, StudyResults, load_results
from ..study.one_gpu import one_gpu
from ..study.run import measured, predicted
from ..study.scenarios import SuiteError, load_suite, scenario_from_args, select
from . import plan_multinode
from .common import COMMAND_HELP, EXIT_FAILED, EXIT_OK, UsageError, about, add_machine_kind, check_out_dir, int_range


def add_parser(sub) -> None:
    s = sub.add_parser(
        "study", help=COMMAND_HELP["study"],
        description="Runs the study suite (or your scenarios) on every visible GPU, one process each (or joins "
                    "torchrun), and writes a report folder: report.md, results.json/.csv, figures/, profile.json. "
                    "With no GPU it predicts the same report from a measured hardware profile (labelled a "
                    "prediction). Sizes are bytes of the collective's output per rank.")
    s.add_argument("--out", default=None, help="report folder (default: study-YYYYmmdd-HHMMSS); must not hold a report")
    s.add_argument("--quick", action="store_true", help="a small subset and shorter sweeps, for a first look")
    s.add_argument("--gpus", type=int_range(2, MAX_WORLD), default=None,
                   help="number of GPUs / processes (default: all visible; a prediction: the profile's)")
    s.add_argument("--suite", metavar="FILE", help="scenario suite file (default: the paper's, shipped with conccl)")
    s.add_argument("--only", metavar="TAGS", help="comma-separated scenario tags or ids of the suite to run")
    s.add_argument("--gemm", metavar="MxNxK", help="your own scenario: GEMM shape (with --size)")
    s.add_argument("--size", metavar="BYTES", help="your own scenario: collective output bytes per rank, e.g. 1G")
    s.add_argument("--collective", default="all", help=f"your own scenario: {', '.join(REGISTRY)}, or all ({', '.join(COLLECTIVES)})")
    s.add_argument("--predict", action="store_true", help="predict from a hardware profile even if GPUs are visible")
    s.add_argument("--profile", metavar="FILE", help="hardware profile to predict from (default: the shipped H200 x4), "
                                                     "or that a measured or one-GPU study plans 'auto' with (default: "
                                                     "the one chosen for this GPU)")
    s.add_argument("--report", metavar="DIR", help="only re-draw the report of an earlier run from its results.json")
    s.add_argument("--force", action="store_true", help="write into --out even if it holds a report (starts over)")
    s.add_argument("--resume", action="store_true",
                   help="continue the interrupted study in --out (give the options it was started with); "
                        "a finished one from before the eager sweep gets only that")
    s.add_argument("--no-ncu", action="store_true", help="skip reading GEMM DRAM/L2 bytes with ncu (when installed)")
    s.add_argument("--side-by-side", action="store_true",
                   help="time a scenario's configurations in turns (round robin) instead of one after another")
    add_machine_kind(s, "report")
    plan_multinode.add_arguments(s)  # a prediction only: --nodes writes multinode.md beside the report


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
    with about("--suite", args.suite or "(the shipped suite)"):
        suite = load_suite(args.suite)
    scenarios = select(suite, quick=args.quick, only=args.only)
    if not scenarios:
        raise SuiteError("no scenario selected")
    return scenarios


def out_folder(args) -> tuple[pathlib.Path, StudyResults | None]:
    """The report folder, checked before anything runs, and the interrupted study to resume."""
    out = pathlib.Path(args.out or _dt.datetime.now().strftime("study-%Y%m%d-%H%M%S"))
    check_out_dir(out, "--out")
    if args.resume and args.force:
        raise UsageError("--resume continues the study in --out, --force starts it over: give one")
    held = out / RESULTS
    if args.resume:
        if not held.exists():
            raise UsageError(f"--resume: {out} holds no {RESULTS} to continue; drop --resume to start a study there")
        with about("--resume: --out", out):
            return out, load_results(out)
    if held.exists() and not args.force:
        try:
            earlier = load_results(out)
        except ResultsError as e:
            raise UsageError(f"--out {out} holds a {RESULTS} this conccl cannot read ({e}); choose another --out "
                             "or pass --force to start over") from e
        if not earlier.complete:
            raise UsageError(f"--out {out} holds an interrupted study ({len(earlier.scenarios)} scenario(s) done); "
                             "pass --resume to continue it or --force to start over")
        if not (out / "report.md").exists():  # interrupted while the report was being drawn
            raise UsageError(f"--out {out} holds a finished study without its report: `conccl study --report {out}` "
                             "draws it; or choose another --out or pass --force")
        raise UsageError(f"--out {out} already holds a study report; choose another --out or pass --force")
    return out, None


# Options that shape a run; --report only redraws one, so with it they would be ignored.
RUN_OPTIONS = ("out", "quick", "gpus", "suite", "only", "gemm", "size", "predict", "profile", "force", "resume",
               "side_by_side", "nodes", *plan_multinode.OWN)


def run(args) -> int:
    if args.report:
        given = [o for o in RUN_OPTIONS if getattr(args, o)]
        if given:
            flags = ", ".join("--" + o.replace("_", "-") for o in given)
            raise UsageError(f"--report only redraws the report in {args.report}; {flags} would be ignored: drop them")
        with about("--report", args.report):
            res = load_results(args.report)
        check_out_dir(args.report, "--report")
        report.render(args.report, res)
        return EXIT_OK
    scenarios = study_scenarios(args)
    out, resume = out_folder(args)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.predict or gpus == 0:
        if args.side_by_side:  # how a measurement is timed; a prediction would ignore it
            raise UsageError("--side-by-side times a measured study's configurations in turns; a prediction "
                             f"({'--predict' if args.predict else 'no GPU visible'}) times nothing: drop it")
        notice = None if args.predict else ("conccl study: no CUDA GPU visible: PREDICTING the report from a "
                                            "hardware profile (no GPU runs anything)")
        with about("--profile", args.profile or "(embedded)"):
            profile = load_profile(args.profile)
        # the multi-node sweep is checked and computed before anything is predicted or written
        rows = multinode_rows(args, profile) if plan_multinode.wanted(args) else None
        predicted(scenarios, out, args.gpus, args.quick, args.profile, environment(args.machine_kind, args.gpus or 0),
                  resume=resume, notice=notice, profile=profile, own=bool(args.gemm))
        if rows:
            write_multinode(out, args, rows)
        return EXIT_OK
    if plan_multinode.wanted(args):
        raise UsageError("--nodes predicts a multi-node job from a hardware profile; a measured study runs on this "
                         "node's GPUs: add --predict (or run the study without --nodes)")
    if args.gpus and args.gpus > gpus and not under_torchrun():
        raise UsageError(f"--gpus {args.gpus}: only {gpus} GPU(s) visible here; give --gpus 2 to {gpus}, "
                         "or --predict for a report modelled from a hardware profile")
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else (args.gpus or gpus)
    memory = torch.cuda.get_device_properties(0).total_memory
    if world < 2:  # what one GPU can measure, measured; the collectives' part predicted, labelled
        if resume is not None or args.side_by_side:
            raise UsageError("a one-GPU study runs whole in minutes: drop --resume and --side-by-side")
        one_gpu(scenarios, out, args.quick, environment(args.machine_kind, 1), memory, args.profile, None,
                own=bool(args.gemm))
        return EXIT_OK
    res, finished = measured(scenarios, out, world, args.quick, environment(args.machine_kind, world), memory,
                             use_ncu=not args.no_ncu, plan_profile=args.profile, side_by_side=args.side_by_side,
                             resume=resume, own=bool(args.gemm))
    if not finished:
        return EXIT_FAILED
    wrong = res is not None and res.summary is not None and res.summary.wrong
    return EXIT_FAILED if wrong else EXIT_OK


def multinode_rows(args, profile) -> list:
    """The multi-node prediction sweep (:func:`conccl.planner.multinode.sweep`) for ``--nodes``
    x ``--gpus-per-node``; a bad job shape is refused here, before the study starts."""
    gpn = args.gpus_per_node or plan_multinode.DEFAULT_GPUS_PER_NODE
    if args.nodes * gpn < 2:
        raise UsageError(f"--nodes {args.nodes} --gpus-per-node {gpn}: one rank has no collective; give 2 or more in all")
    net = multinode.gbps(args.network_gbps) if args.network_gbps else None
    nvl = multinode.gbps(args.nvlink_gbps) if args.nvlink_gbps else None
    rows = multinode.sweep(profile, args.nodes, gpn, net, nvl, args.nccl_ctas)
    if not rows:
        raise UsageError(f"--nodes {args.nodes} --gpus-per-node {gpn}: no size of the sweep fits the profile's GPU")
    return rows


def write_multinode(out, args, rows) -> None:
    """multinode.md and multinode.json in the report folder (a PREDICTION)."""
    out = pathlib.Path(out)
    write_text(out / "multinode.md", multinode.sweep_markdown(rows))
    doc = {"format": multinode.SWEEP_FORMAT, "prediction": True, "prediction_of": "a multi-node job no machine here has",
           "results": [{"links": asdict(lk) | {"world": lk.world}, "result": pr.to_dict()} for lk, pr in rows]}
    write_text(out / "multinode.json", json.dumps(doc, indent=1) + "\n")
    print(f"conccl study: multi-node PREDICTION ({rows[0][0].nodes} x {rows[0][0].gpus_per_node}) written to "
          f"{out / 'multinode.md'}")
