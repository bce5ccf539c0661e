"""``conccl bench moe``: MoE dispatch and combine (conccl.ep) against the NCCL reference dispatcher."""
from __future__ import annotations

import os
import sys

import torch

from ..bench import moe as bench_moe
from ..bench.environment import environment
from ..launch import run_per_gpu, under_torchrun
from ..planner.timing import MAX_WORLD
from .common import (COMMAND_HELP, EXIT_FAILED, EXIT_OK, UsageError, add_machine_kind, check_out_dir, comma_list,
                     int_range)


def add_parser(sub) -> None:
    d = bench_moe.MoEBenchConfig()
    b = sub.add_parser("bench-moe", help=COMMAND_HELP["bench-moe"],
                       description="Per routing and implementation: dispatch and combine times (the slowest rank's "
                                   "median), rows sent, link bandwidth, kernel time, and the expert GEMM's "
                                   "slowdown beside them; conccl.ep's results checked against the reference's bit "
                                   "for bit. Writes moe.json and moe.md into --out. Needs 2 or more GPUs.")
    b.add_argument("--out", required=True, help="folder for moe.json and moe.md")
    b.add_argument("--tokens", type=int_range(1, 1 << 20), default=d.tokens, help="tokens per rank")
    b.add_argument("--hidden", type=int_range(8, 1 << 16), default=d.hidden)
    b.add_argument("--experts", type=int_range(1, 4096), default=d.experts, help="experts in all (split evenly)")
    b.add_argument("--topk", type=int_range(1, 64), default=d.topk)
    b.add_argument("--ffn", type=int_range(8, 1 << 16), default=d.ffn, help="the expert GEMM's width")
    b.add_argument("--routings", default=",".join(bench_moe.ROUTINGS), help="comma-separated of random, skewed")
    b.add_argument("--impls", default=",".join(bench_moe.IMPLS),
                   help=f"comma-separated of {', '.join(bench_moe.IMPLS)}")
    b.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=d.dtype)
    b.add_argument("--runs", type=int_range(1, 10_000), default=d.runs)
    b.add_argument("--warmup", type=int_range(0, 10_000), default=d.warmup)
    b.add_argument("--seed", type=int_range(0, 1 << 30), default=d.seed)
    b.add_argument("--same-routing", action="store_true",
                   help="one routing for every run (default: a new one every run, as training routes)")
    b.add_argument("--layer-chunks", type=int_range(0, 64), default=d.layer_chunks,
                   help="time a MoE layer forward+backward over this many overlapped micro-batches (0: not)")
    b.add_argument("--train-steps", type=int_range(0, 10_000), default=d.train_steps,
                   help="AdamW steps of the small MoE model on each dispatcher (0: none)")
    b.add_argument("--gpus", type=int_range(2, MAX_WORLD), default=None, help="processes (default: all visible GPUs)")
    add_machine_kind(b, "JSON")


def config(args) -> bench_moe.MoEBenchConfig:
    """The run's configuration; every flag checked before any GPU is asked for."""
    if args.topk > args.experts:
        raise UsageError(f"--topk {args.topk} is more than --experts {args.experts}")
    return bench_moe.MoEBenchConfig(tokens=args.tokens, hidden=args.hidden, experts=args.experts, topk=args.topk,
                                    ffn=args.ffn, dtype=args.dtype,
                                    routings=comma_list(args.routings, bench_moe.ROUTINGS, "--routings"),
                                    impls=comma_list(args.impls, bench_moe.IMPLS, "--impls"), warmup=args.warmup,
                                    runs=args.runs, seed=args.seed, fresh_routing=not args.same_routing,
                                    train_steps=args.train_steps, layer_chunks=args.layer_chunks)


def _progress(r) -> None:
    what = (f"dispatch {r.dispatch_ms:.3f} ms, combine {'' if r.combine_ms is None else format(r.combine_ms, '.3f')} "
            f"ms, GEMM beside {r.gemm_slowdown:.3f}x{' WRONG' if r.wrong else ''}")
    print(f"  {r.routing} {r.impl}: {what}", file=sys.stderr, flush=True)


def run(args) -> int:
    cfg = config(args)
    out = check_out_dir(args.out, "--out")
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not under_torchrun() and visible < 2:
        raise UsageError(f"needs at least 2 CUDA GPUs; {visible} visible")
    if args.gpus and args.gpus > visible and not under_torchrun():
        raise UsageError(f"--gpus {args.gpus}: only {visible} GPU(s) visible here")
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else (args.gpus or visible)
    if cfg.experts % world:
        raise UsageError(f"--experts {cfg.experts} does not split evenly over {world} ranks")
    meta = environment(args.machine_kind, world)
    print(f"# conccl bench moe on {world} x {meta['device']}: progress on stderr", flush=True)
    records = run_per_gpu(bench_moe.run_rank, cfg, _progress, nprocs=args.gpus, timeout_s=3600)[0]
    if under_torchrun() and int(os.environ["RANK"]) != 0:
        return EXIT_OK
    out.mkdir(parents=True, exist_ok=True)
    doc = bench_moe.document(meta, cfg, records)
    bench_moe.write(out, doc)
    print(bench_moe.markdown(doc))
    bad = any(r.error or r.wrong for r in records if not isinstance(r, dict)) or bool((doc["layer"] or {}).get("error"))
    return EXIT_FAILED if bad or (doc["training"] and not doc["training"]["equal"]) else EXIT_OK
