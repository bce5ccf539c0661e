"""``conccl bench``: the nccl-tests-style sweep (flags as nccl-tests: -b -e -f -n -w -c -d)."""
from __future__ import annotations

import math
import os
from dataclasses import asdict


from ..bench import report
from ..bench.environment import environment
from ..bench.impls import DEFAULT_IMPLS, NAMES as IMPLS
from ..bench.variant import add_variant_flags, variant_of
from ..bench.run import BenchConfig, run_bench
from ..collectives import REGISTRY as COLLECTIVES
from ..launch import under_torchrun
from ..units import parse_size
from ..jsonfile import write_text
from ..planner.timing import MAX_WORLD
from .common import COMMAND_HELP, EXIT_FAILED, EXIT_OK, add_machine_kind, check_out_file, fail, gpu_world, int_range

MAX_ITERS = 100_000  # -n / -w beyond this would run for days: a typo, not a plan


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help=COMMAND_HELP["bench"],
                       description="Starts one process per visible GPU (or joins a torchrun launch). Sizes are bytes of "
                                   "output per rank; algbw and busbw are nccl-tests' (a reduce-scatter's from its input "
                                   "bytes, world x the size).")
    b.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("1M"), help="smallest size (default 1M)")
    b.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("4G"), help="largest size (default 4G)")
    b.add_argument("-f", "--stepfactor", type=float, default=2.0, help="multiply the size by this each step (default 2)")
    b.add_argument("-n", "--iters", type=int_range(1, MAX_ITERS), default=20, help="timed iterations per size (default 20)")
    b.add_argument("-w", "--warmup_iters", type=int_range(0, MAX_ITERS), default=5,
                   help="warm-up iterations per size (default 5)")
    b.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="check results (#wrong), default 1")
    b.add_argument("-d", "--datatype", default="bfloat16", choices=("bfloat16", "float16", "float32", "int8"))
    b.add_argument("--collective", default="all", choices=("all", *COLLECTIVES))
    b.add_argument("--impl", default=",".join(DEFAULT_IMPLS),
                   help=f"comma-separated implementations, or 'all' (known: {', '.join(IMPLS)})")
    add_variant_flags(b)
    b.add_argument("--no-overlap", action="store_true", help="skip the concurrent-GEMM column")
    b.add_argument("--no-profile", action="store_true", help="skip counting kernels per call with the profiler")
    b.add_argument("--gpus", type=int_range(2, MAX_WORLD), default=None,
                   help="number of GPUs / processes (default: all visible)")
    b.add_argument("--json", metavar="FILE", help="write every field, the device, versions and commit to FILE")
    b.add_argument("--markdown", metavar="FILE", help="write readable tables to FILE")
    add_machine_kind(b, "JSON")


def sweep(begin: int, end: int, factor: float) -> list[int]:
    """nccl-tests' sizes: ``begin``, ``begin * factor``, ... up to ``end``."""
    if end < begin:
        raise ValueError(f"-e (max size, {end}) is below -b (min size, {begin}); give -e >= -b")
    if not 1 < factor < math.inf:
        raise ValueError(f"-f (step factor) must be a number > 1, got {factor}")
    sizes, s = [], begin
    while s <= end:
        sizes.append(int(s))
        s *= factor
    return sizes


def bench_config(args) -> BenchConfig:
    """The run the flags ask for; ValueError naming what is wrong with them."""
    impls = list(IMPLS) if args.impl == "all" else [s.strip() for s in args.impl.split(",") if s.strip()]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown or not impls:
        raise ValueError(f"--impl {args.impl!r}: unknown implementation(s) {', '.join(unknown) or '(none given)'}; "
                         f"known: {', '.join(IMPLS)}, or all")
    if args.iters < 1 or args.warmup_iters < 0:
        raise ValueError("-n must be >= 1 and -w >= 0")
    colls = list(COLLECTIVES) if args.collective == "all" else [args.collective]
    return BenchConfig(
        sizes=sweep(args.minbytes, args.maxbytes, args.stepfactor), collectives=colls, impls=impls,
        variant=variant_of(args),
        dtype=args.datatype, iters=args.iters, warmup=args.warmup_iters, check=bool(args.check),
        overlap=not args.no_overlap, profile=not args.no_profile,
    )


def run(args) -> int:
    try:
        cfg = bench_config(args)
    except ValueError as e:
        return fail("bench", str(e))
    for flag in ("--json", "--markdown"):
        check_out_file(getattr(args, flag[2:]), flag)
    world, why = gpu_world(args.gpus)
    if why:
        return fail("bench", why)
    meta = environment(args.machine_kind, world)
    print(f"# conccl bench on {world} x {meta['device']} (torch {meta['torch']}, NCCL {meta['nccl']}), "
          f"{len(cfg.sizes)} sizes x {len(cfg.impls)} implementations x {len(cfg.collectives)} collectives", flush=True)
    records = run_bench(cfg, nprocs=args.gpus)
    if under_torchrun() and int(os.environ["RANK"]) != 0:
        return EXIT_OK  # rank 0 holds the slowest-rank figures and writes the files
    if args.json:
        report.write_json(args.json, meta, asdict(cfg), records)
    if args.markdown:
        write_text(args.markdown, report.markdown({**meta, "conccl calls": cfg.variant.describe()}, records))
    bad = [r for r in records if r.get("wrong", 0) or "error" in r]
    return EXIT_FAILED if bad else EXIT_OK
