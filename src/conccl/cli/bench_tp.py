"""``conccl bench tp``: tensor-parallel ops (conccl.tp) against the GEMM alone, NCCL and async-TP."""
from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch

from ..bench import tp as bench_tp
from ..bench import tp_block
from ..bench.environment import environment
from ..errors import InvalidArgument
from ..jsonfile import write_text
from ..launch import run_per_gpu, under_torchrun
from ..schedule.pipeline import TPSchedule
from ..planner import tp as tp_planner
from ..planner.profile import ProfileError, load_profile
from ..planner.timing import MAX_WORLD
from .common import (COMMAND_HELP, EXIT_FAILED, EXIT_OK, UsageError, add_machine_kind, check_out_dir, check_out_file,
                     comma_list, int_range)
from .study_tp import parse_shapes

IMPLS = ("gemm_only", "serial_nccl", "serial_conccl", "torch_async_tp", "conccl", "conccl_auto")


def add_parser(sub) -> None:
    b = sub.add_parser("bench-tp", help=COMMAND_HELP["bench-tp"],
                       description="Per op (ag_gemm, gemm_rs), shape and implementation: the slowest rank's "
                                   "median time and its ratio to the GEMM alone, every result checked against "
                                   "serial NCCL's. Writes tp.json and tp.md into --out. On one GPU only the "
                                   "decomposition (each schedule's GEMM steps alone) is timed.")
    b.add_argument("--out", required=True, help="folder for tp.json and tp.md")
    b.add_argument("--ops", default=None, help="comma-separated of ag_gemm, gemm_rs (default both)")
    b.add_argument("--shapes", type=parse_shapes, default=None,
                   help="MxKxN,... for every op (default: 8 per op, Llama-3 8B/70B layers)")
    b.add_argument("--schedules", default=None,
                   help="conccl schedules to time, comma-separated (serial, ring, direct, direct-p4-g2, ...; default "
                        f"{','.join(bench_tp.DEFAULT_SCHEDULES)}; with --block: auto)")
    b.add_argument("--impls", default=None, help=f"comma-separated of {', '.join(IMPLS)} (default all)")
    b.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    b.add_argument("--runs", type=int_range(1, 10_000), default=bench_tp.TPBenchConfig.runs)
    b.add_argument("--warmup", type=int_range(0, 10_000), default=3)
    b.add_argument("--gpus", type=int_range(1, MAX_WORLD), default=None, help="processes (default: all visible GPUs)")
    b.add_argument("--model-world", type=int_range(2, MAX_WORLD), default=2,
                   help="one GPU: the pipeline world whose GEMM steps are timed (default 2)")
    b.add_argument("--block", nargs="?", const="x".join(map(str, tp_block.DEFAULT_BLOCK)), default=None,
                   metavar="TOKENSxDxFFN",
                   help="time a sequence-parallel SwiGLU MLP block forward+backward instead of single ops "
                        "(default 8192x4096x14336: tokens over all ranks, model width, ffn width): compute only, "
                        "serial NCCL, async-TP and conccl.tp's layers with each of --schedules (default auto); "
                        "writes block.json and block.md")
    b.add_argument("--graph", action="store_true",
                   help="capture every implementation (the GEMM alone too) into a CUDA graph and time its replays "
                        "(decode runs as a graph); conccl's captured calls reserve graph workspace for every shape")
    b.add_argument("--align", action="store_true",
                   help="start each run on every GPU after a one-element NCCL all-reduce, so that the hosts' skew "
                        "(tens of microseconds) stays out of a small op's time")
    b.add_argument("--profile", metavar="FILE",
                   help="on 2 or more GPUs: also keep the pipelines' times in this hardware profile (a `conccl study` "
                        "profile.json of this GPU, rewritten in place), so that schedule='auto' runs the fastest "
                        "schedule measured for these shapes (CONCCL_PROFILE=FILE)")
    add_machine_kind(b, "JSON")


def config(args, allow_auto: bool = False) -> bench_tp.TPBenchConfig:
    """``allow_auto``: --schedules may name "auto" (the block bench's layers take it)."""
    ops = comma_list(args.ops or ",".join(bench_tp.OPS), bench_tp.OPS, "--ops")
    given = args.schedules or ("auto" if allow_auto else ",".join(bench_tp.DEFAULT_SCHEDULES))
    schedules = tuple(x.strip() for x in given.split(",") if x.strip())
    for name in schedules:
        if allow_auto and name == "auto":
            continue
        try:
            TPSchedule.parse(name)
        except ValueError as e:
            raise UsageError(f"--schedules: {e}") from None
    shapes = {op: (args.shapes or bench_tp.DEFAULT_SHAPES[op]) for op in ops}
    return bench_tp.TPBenchConfig(ops=ops, shapes=shapes, schedules=schedules,
                                  impls=comma_list(args.impls or ",".join(IMPLS), IMPLS, "--impls"), dtype=args.dtype,
                                  warmup=args.warmup,
                                  runs=args.runs, model_world=args.model_world, graph=args.graph,
                                  align=args.align)


def _progress(r) -> None:
    what = f"error {r.error}" if r.error else f"{r.ms:.3f} ms, {r.ratio_to_gemm:.3f}x GEMM{' WRONG' if r.wrong else ''}"
    print(f"  {r.op} {r.M}x{r.K}x{r.N} {r.impl} {r.schedule or ''}: {what}", file=sys.stderr, flush=True)


def _profile_to_keep(path: str, block, cfg):
    """The hardware profile --profile names, read and checked writable before the measuring."""
    if block is not None:
        raise UsageError("--profile keeps the op bench's pipelines; --block times a whole block: drop one")
    try:
        profile = load_profile(path)
    except ProfileError as e:
        raise UsageError(f"--profile: {e}") from None
    check_out_file(path, "--profile")
    here = torch.cuda.get_device_name(torch.cuda.current_device()) if torch.cuda.is_available() else None
    if here is not None and profile.device != here:
        raise UsageError(f"--profile {path} was measured on {profile.device!r}, this GPU is {here!r}")
    if "conccl" not in cfg.impls:
        raise UsageError("--profile keeps conccl's schedules' times: --impls must include conccl")
    return profile


def _block_shape(text: str) -> tuple[int, int, int]:
    try:
        shape = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) <= 0:
        raise UsageError(f"--block: expected TOKENSxDxFFN (three positive integers), got {text!r}")
    return shape


def _block_progress(r) -> None:
    what = f"error {r.error}" if r.error else f"{r.ms:.3f} ms, {r.ratio or 0:.3f}x compute only"
    print(f"  block {r.impl} {r.schedule or ''}: {what}", file=sys.stderr, flush=True)


def _run_block(args, shape, schedules, out, world: int, meta: dict) -> int:
    if world < 2:
        raise UsageError("conccl bench tp --block needs 2 or more GPUs (a sharded block has peers)")
    if shape[0] % world or shape[2] % world:
        raise UsageError(f"--block {args.block}: tokens and ffn must be divisible by the world size {world}")
    records = run_per_gpu(tp_block.run_rank, shape, schedules, args.warmup, args.runs, args.dtype, _block_progress,
                          nprocs=args.gpus, timeout_s=3600)[0]
    if under_torchrun() and int(os.environ["RANK"]) != 0:
        return EXIT_OK
    out.mkdir(parents=True, exist_ok=True)
    doc = tp_block.document(meta, records, args.warmup, args.runs)
    write_text(out / "block.json", json.dumps(doc, indent=1))
    write_text(out / "block.md", tp_block.markdown(doc))
    print(tp_block.markdown(doc))
    bad = [r for r in records if r.error or (r.rel_diff_vs_unsharded or 0) > tp_block.UNSHARDED_TOL]
    return EXIT_FAILED if bad else EXIT_OK


def run(args) -> int:
    block = _block_shape(args.block) if args.block is not None else None
    if block is not None:
        given = [f for f, v in (("--ops", args.ops), ("--shapes", args.shapes), ("--impls", args.impls),
                                ("--graph", args.graph), ("--align", args.align)) if v]
        if given:
            raise UsageError(f"--block times one block (its shape in --block, every implementation): drop {given[0]}")
    cfg = config(args, allow_auto=block is not None)
    out = check_out_dir(args.out, "--out")
    profile = _profile_to_keep(args.profile, block, cfg) if args.profile else None
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not visible:
        raise UsageError("conccl bench tp runs on CUDA GPUs and none is visible")
    if args.gpus and args.gpus > visible and not under_torchrun():
        raise UsageError(f"--gpus {args.gpus}: only {visible} GPU(s) visible here")
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else (args.gpus or visible)
    meta = environment(args.machine_kind, world)
    print(f"# conccl bench tp on {world} x {meta['device']}: progress on stderr", flush=True)
    if profile is not None and world < 2:
        raise UsageError("--profile keeps pipelines timed on 2 or more GPUs; this run would have one")
    if cfg.align and world < 2:
        raise UsageError("--align lines up the ranks of a 2-or-more-GPU run; this run would have one")
    if args.block is not None:
        return _run_block(args, block, cfg.schedules, out, world, meta)
    if world == 1:
        torch.cuda.set_device(0)
        records = bench_tp.run_rank(0, 1, cfg, _progress)
    else:
        records = run_per_gpu(bench_tp.run_rank, cfg, _progress, nprocs=args.gpus, timeout_s=3600)[0]
        if under_torchrun() and int(os.environ["RANK"]) != 0:
            return EXIT_OK
    out.mkdir(parents=True, exist_ok=True)
    doc = bench_tp.document(meta, cfg, records)
    bench_tp.write(out, doc)
    print(bench_tp.markdown(doc))
    if profile is not None:
        try:
            table, note = tp_planner.with_pipelines(profile.tp, tp_planner.pipelines_from_bench([doc]), meta["device"])
            write_text(args.profile, dataclasses.replace(profile, tp=table).to_json())
        except (InvalidArgument, ProfileError) as e:  # every conccl case failed, or a time out of range
            raise UsageError(f"--profile {args.profile}: not kept: {e} (the results are in {out})") from None
        print(f"conccl bench tp: kept the pipelines' times in {args.profile} ({note})")
    return EXIT_FAILED if any(r.error or r.wrong for r in records) else EXIT_OK
