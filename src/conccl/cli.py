"""The ``conccl`` command: ``conccl bench`` (and, later, ``study`` and ``plan``)."""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import re
import subprocess
import sys

from .collectives import REGISTRY as COLLECTIVES

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'1M' -> 1048576; accepts B/K/M/G/T suffixes (powers of 1024) and decimals ('1.5G')."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([BKMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"malformed size {text!r}: expected e.g. 1024, 64K, 1M, 4G")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"size {text!r} must be a whole number of bytes >= 1")
    return int(value)


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


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return cmd_bench(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
