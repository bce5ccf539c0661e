"""``conccl bench fsdp``: an FSDP2 training step, no communication vs stock FSDP2 vs conccl."""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict


from ..bench import fsdp as bench_fsdp
from ..bench.environment import environment
from ..launch import run_per_gpu, under_torchrun
from ..planner.timing import MAX_WORLD
from .common import COMMAND_HELP, EXIT_FAILED, EXIT_OK, add_machine_kind, check_out_dir, fail, gpu_world, int_range


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--tokens: expected comma-separated whole numbers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"--tokens: expected whole numbers >= 1, got {text!r}")
    return vals


def add_parser(sub) -> None:
    b = sub.add_parser("bench-fsdp", help=COMMAND_HELP["bench-fsdp"],
                       description=bench_fsdp.__doc__.split("\n\n")[1].replace("\n", " "))
    b.add_argument("--tokens", default="2048,8192", help="tokens per rank, comma-separated (default 2048,8192)")
    b.add_argument("--configs", default=",".join(bench_fsdp.CONFIGS),
                   help=f"comma-separated, of {', '.join(bench_fsdp.CONFIGS)} (default all)")
    b.add_argument("--layers", type=int, default=8)
    b.add_argument("--dim", type=int, default=4096)
    b.add_argument("--ffn", type=int, default=14336)
    b.add_argument("--heads", type=int, default=32)
    b.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    b.add_argument("--train-steps", type=int, default=20, help="AdamW steps; the ones after the warm-up are timed "
                                                                 "(default 20)")
    b.add_argument("--no-profile", action="store_true", help="skip the profiled step")
    b.add_argument("--host-profile", action="store_true",
                   help="after the timed run, profile the host's forward+backward by function (cProfile, rank 0)")
    b.add_argument("--no-deterministic-loss", action="store_true",
                   help="report the timed run's loss instead of training again under deterministic algorithms "
                        "(faster; the loss then varies in its last bits from run to run)")
    b.add_argument("--mixed-precision", action="store_true",
                   help="fp32 parameters under FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) "
                        "(no_comm: the bf16 model)")
    b.add_argument("--cast-every-gather", action="store_true",
                   help="with --mixed-precision: conccl.fsdp.enable(cast_once=False), the shards cast at every gather "
                        "as FSDP does (default: the backward's gathers read the forward's cast)")
    b.add_argument("--lr", type=float, default=1e-4,
                   help="AdamW's learning rate (default 1e-4); 0: the weights never change, so every config's "
                        "GEMMs multiply the same data and configs differ by their communication alone")
    b.add_argument("--clocks", action="store_true",
                   help="sample each rank's SM clock with nvidia-smi every 20 ms during the timed steps and report its "
                        "median while the power cap held it (costs some host time; compare configs run one per "
                        "invocation)")
    b.add_argument("--trace-dir", default=None,
                   help="also write rank 0's profiled iteration per config there, as a gzipped Chrome trace")
    b.add_argument("--gpus", type=int_range(2, MAX_WORLD), default=None, help="processes (default: all visible GPUs)")
    b.add_argument("--out", required=True, help="folder for fsdp.json and fsdp.md")
    add_machine_kind(b, "JSON")


def config(args) -> bench_fsdp.FsdpConfig:
    """The run the flags ask for; ValueError naming what is wrong."""
    tokens = _ints(args.tokens)
    configs = tuple(c.strip() for c in args.configs.split(",") if c.strip())
    unknown = [c for c in configs if c not in bench_fsdp.CONFIGS]
    if unknown or not configs:
        raise ValueError(f"--configs: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(bench_fsdp.CONFIGS)}")
    shape = bench_fsdp.ModelShape(args.dim, args.ffn, args.heads, args.layers)
    for name in ("dim", "ffn", "heads", "layers"):
        if getattr(shape, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(shape, name)}")
    if shape.dim % shape.heads:
        raise ValueError(f"--dim ({shape.dim}) must be a multiple of --heads ({shape.heads})")
    if args.cast_every_gather and not args.mixed_precision:
        raise ValueError("--cast-every-gather needs --mixed-precision (only a mixed-precision gather casts)")
    if not (args.lr >= 0 and math.isfinite(args.lr)):
        raise ValueError(f"--lr must be a number >= 0, got {args.lr}")
    if args.warmup < 0 or args.train_steps - args.warmup < 1:
        raise ValueError(f"--train-steps ({args.train_steps}) must exceed --warmup ({args.warmup}) >= 0")
    return bench_fsdp.FsdpConfig(shape, tokens, configs, args.warmup, args.train_steps, not args.no_profile,
                                 not args.no_deterministic_loss, args.mixed_precision,
                                 args.host_profile, not args.cast_every_gather, args.trace_dir, lr=args.lr,
                                 clocks=args.clocks)


def run(args) -> int:
    try:
        cfg = config(args)
    except ValueError as e:
        return fail("bench fsdp", str(e))
    out = check_out_dir(args.out, "--out")
    world, why = gpu_world(args.gpus)
    if why:
        return fail("bench fsdp", why)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return fail("bench fsdp", f"--out {args.out}: cannot create the folder ({e.strerror})")
    # cuBLAS is reproducible under deterministic algorithms only with a fixed workspace; read
    # when a process makes its first handle, so set before the workers start.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    meta = environment(args.machine_kind, world)
    print(f"# conccl bench fsdp on {world} x {meta['device']}: {cfg.shape.parameters() / 1e9:.2f} B parameters, "
          f"tokens {list(cfg.tokens)}, configs {list(cfg.configs)}", flush=True)
    per_rank = run_per_gpu(bench_fsdp.run_rank, cfg, nprocs=args.gpus)
    if under_torchrun() and int(os.environ["RANK"]) != 0:
        return EXIT_OK
    doc = {**meta, "model": {**asdict(cfg.shape), "parameters": cfg.shape.parameters(),
                                "dtype": "float32 (bf16 compute)" if cfg.mixed_precision else "bfloat16"},
           "config": {k: v for k, v in asdict(cfg).items() if k != "shape"}, "results": bench_fsdp.combine(per_rank)}
    (out / "fsdp.json").write_text(json.dumps(doc, indent=1))
    (out / "fsdp.md").write_text(bench_fsdp.markdown(doc))
    print((out / "fsdp.md").read_text().split("\n## ")[0])
    fallback = [r for r in doc["results"] if r["config"].startswith("conccl") and r["conccl"] and r["conccl"]["fallback"]]
    return EXIT_FAILED if fallback else EXIT_OK
