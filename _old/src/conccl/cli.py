"""The ``conccl`` command: ``conccl bench``, ``conccl study``, ``conccl plan``."""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import subprocess
import sys

from .collectives import REGISTRY as COLLECTIVES
from .units import parse_size

def sweep(begin: int, end: int, factor: float) -> list[int]:
    if end < begin:
        raise ValueError(f"max size ({end}) is below min size ({begin})")
    if factor <= 1:
        raise ValueError(f"step factor must be > 1, got {factor}")
    sizes, s = [], begin
    while s <= end:
        sizes.append(int(s))
        s *= factor
    return sizes


def build_parser() -> argparse.ArgumentParser:
    from .bench.impls import DEFAULT_IMPLS, REGISTRY as IMPLS

    p = argparse.ArgumentParser(prog="conccl", description="Copy-engine collectives for concurrent computation and communication.")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="nccl-tests-style sweep of conccl against NCCL and PyTorch, with an overlap column",
                       description="Starts one process per visible GPU (or joins a torchrun launch). Sizes are bytes of "
                                   "output per rank, as in nccl-tests.")
    b.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("1M"), help="smallest size (default 1M)")
    b.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("4G"), help="largest size (default 4G)")
    b.add_argument("-f", "--stepfactor", type=float, default=2.0, help="multiply the size by this each step (default 2)")
    b.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    b.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations per size (default 5)")
    b.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="check results (#wrong), default 1")
    b.add_argument("-d", "--datatype", default="bfloat16", choices=("bfloat16", "float16", "float32", "int8"))
    b.add_argument("--collective", default="all", choices=("all", *COLLECTIVES))
    b.add_argument("--impl", default=",".join(DEFAULT_IMPLS),
                   help=f"comma-separated implementations, or 'all' (known: {', '.join(IMPLS)})")
    b.add_argument("--no-overlap", action="store_true", help="skip the concurrent-GEMM column")
    b.add_argument("--no-profile", action="store_true", help="skip counting kernels per call with the profiler")
    b.add_argument("--gpus", type=int, default=None, help="number of GPUs / processes (default: all visible)")
    b.add_argument("--json", metavar="FILE", help="write every field, the device, versions and commit to FILE")
    b.add_argument("--markdown", metavar="FILE", help="write readable tables to FILE")
    b.add_argument("--machine-kind", default=os.environ.get("CONCCL_MACHINE_KIND", "unknown"),
                   help="label recorded in the JSON (e.g. nvidia-h200-x4)")
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
    s.add_argument("--collective", default="all", help="your own scenario: all_gather, all_to_all or all")
    s.add_argument("--predict", action="store_true", help="predict from a hardware profile even if GPUs are visible")
    s.add_argument("--profile", metavar="FILE", help="hardware profile to predict from, and that the 'auto' strategy "
                                                     "plans with (default: the embedded H200 x4)")
    s.add_argument("--report", metavar="DIR", help="only re-draw the report of an earlier run from its results.json")
    s.add_argument("--force", action="store_true", help="write into --out even if it holds a report")
    s.add_argument("--no-ncu", action="store_true", help="skip reading GEMM DRAM/L2 bytes with ncu (when installed)")
    s.add_argument("--side-by-side", action="store_true",
                   help="time a scenario's configurations in turns (round robin) instead of one after another")
    s.add_argument("--machine-kind", default=os.environ.get("CONCCL_MACHINE_KIND", "unknown"),
                   help="label recorded in the report (e.g. nvidia-h200-x4)")
    from .planner.command import add_parser as add_plan_parser

    add_plan_parser(sub)
    return p


def bench_config(args):
    from .bench.impls import REGISTRY as IMPLS
    from .bench.run import BenchConfig

    impls = list(IMPLS) if args.impl == "all" else [s.strip() for s in args.impl.split(",") if s.strip()]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        raise ValueError(f"unknown implementation(s) {', '.join(unknown)}; known: {', '.join(IMPLS)}")
    if args.iters < 1 or args.warmup_iters < 0:
        raise ValueError("-n must be >= 1 and -w >= 0")
    colls = list(COLLECTIVES) if args.collective == "all" else [args.collective]
    return BenchConfig(
        sizes=sweep(args.minbytes, args.maxbytes, args.stepfactor), collectives=colls, impls=impls,
        dtype=args.datatype, iters=args.iters, warmup=args.warmup_iters, check=bool(args.check),
        overlap=not args.no_overlap, profile=not args.no_profile,
    )


def environment(machine_kind: str, world: int) -> dict:
    """Machine, versions, date and commit for a benchmark record."""
    import importlib.metadata as md
    import platform

    import torch

    def version(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    # CONCCL_COMMIT first: a checkout copied to a GPU machine may carry no .git.
    commit = os.environ.get("CONCCL_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                                    cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        except Exception:
            commit = "unknown"
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    return {
        "machine_kind": machine_kind, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "host": platform.node(), "world": world,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
        "cuda_python": version("cuda-python") or version("cuda-bindings"), "conccl": version("conccl") or "checkout",
        "python": platform.python_version(),
    }


def cmd_bench(args) -> int:
    import torch

    from .bench import report
    from dataclasses import asdict

    from .bench.run import run_bench
    from .launch import under_torchrun

    try:
        cfg = bench_config(args)
    except ValueError as e:
        print(f"conccl bench: {e}", file=sys.stderr)
        return 2
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else (args.gpus or torch.cuda.device_count())
    if not torch.cuda.is_available() or world < 2:
        print(f"conccl bench: needs at least 2 CUDA GPUs linked by NVLink, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    meta = environment(args.machine_kind, world)
    print(f"# conccl bench on {world} x {meta['device']} (torch {meta['torch']}, NCCL {meta['nccl']}), "
          f"{len(cfg.sizes)} sizes x {len(cfg.impls)} implementations x {len(cfg.collectives)} collectives", flush=True)
    records = run_bench(cfg, nprocs=args.gpus)
    if under_torchrun() and int(os.environ["RANK"]) != 0:
        return 0  # rank 0 holds the slowest-rank figures and writes the files
    if args.json:
        report.write_json(args.json, meta, asdict(cfg), records)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.markdown(meta, records))
    bad = [r for r in records if r.get("wrong", 0) or "error" in r]
    return 1 if bad else 0


def study_scenarios(args):
    from .study.scenarios import SuiteError, load_suite, scenario_from_args, select

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


def cmd_study(args) -> int:
    import pathlib

    from .profile import ProfileError
    from .study import report
    from .study.measure import StudyError
    from .study.run import measured, predicted
    from .study.scenarios import SuiteError

    def fail(msg: str) -> int:
        print(f"conccl study: {msg}", file=sys.stderr)
        return 2

    if args.report:
        try:
            report.render(args.report, report.load_results(args.report))
        except ValueError as e:
            return fail(str(e))
        return 0
    try:
        scenarios = study_scenarios(args)
    except SuiteError as e:
        return fail(str(e))
    if args.gpus is not None and args.gpus < 1:
        return fail("--gpus must be >= 1")
    out = pathlib.Path(args.out or _dt.datetime.now().strftime("study-%Y%m%d-%H%M%S"))
    if (out / "results.json").exists() and not args.force:
        return fail(f"{out} already holds a study report; choose another --out or pass --force")
    import torch

    from .launch import under_torchrun

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else (args.gpus or gpus)
    try:
        if args.predict or gpus == 0:
            if not args.predict:
                print("conccl study: no CUDA GPU visible: PREDICTING the report from the embedded hardware profile",
                      file=sys.stderr)
            predicted(scenarios, out, args.gpus, args.quick, args.profile, environment(args.machine_kind, world or 0))
            return 0
        if world < 2:
            return fail(f"a measured study needs at least 2 GPUs linked by NVLink, found {world}; "
                        "pass --predict for a report modelled from a hardware profile")
        memory = torch.cuda.get_device_properties(0).total_memory
        doc, finished = measured(scenarios, out, world, args.quick, environment(args.machine_kind, world), memory,
                                  use_ncu=not args.no_ncu, plan_profile=args.profile, side_by_side=args.side_by_side)
    except (StudyError, SuiteError, ProfileError) as e:
        return fail(str(e))
    if not finished:
        return 1
    return 1 if doc and doc.get("summary", {}).get("wrong") else 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return cmd_bench(args)
    if args.command == "study":
        return cmd_study(args)
    if args.command == "plan":
        from .planner.command import cmd_plan

        return cmd_plan(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
