"""``conccl bench graphs``: small collectives captured into a CUDA graph and eager, against NCCL."""
from __future__ import annotations

import argparse
import os



from ..bench import graphs
from ..collectives import REGISTRY as COLLECTIVES
from ..bench.environment import environment
from ..bench.graphs_run import run_all
from ..bench.variant import add_variant_flags, variant_of
from ..launch import run_per_gpu, under_torchrun
from ..planner.timing import MAX_WORLD
from ..units import format_size, parse_size
from .common import COMMAND_HELP, EXIT_FAILED, EXIT_OK, add_machine_kind, check_out_dir, fail, gpu_world, int_range

MAX_COUNT = 100_000  # calls, replays, runs or warm-ups beyond this would run for days: a typo


def add_parser(sub) -> None:
    b = sub.add_parser("bench-graphs", help=COMMAND_HELP["bench-graphs"],
                       description="Per collective, size (output bytes per rank, bf16) and implementation: --calls "
                                   "calls captured into one CUDA graph and replayed, and the same calls eager; us per "
                                   "call (median of --runs, slowest rank), each case checked against NCCL bit for "
                                   "bit. Writes graphs.json and graphs.md into --out. Needs at least 2 GPUs.")
    b.add_argument("--sizes", default=",".join(format_size(s) for s in graphs.DEFAULT_SIZES),
                   help="output bytes per rank, comma-separated (default 4K,16K,...,256M: 9 sizes)")
    b.add_argument("--collectives", default="all",
                   help=f"comma-separated, of {', '.join(COLLECTIVES)}, or all (default)")
    b.add_argument("--impls", default=",".join(graphs.IMPLS),
                   help=f"comma-separated, of {', '.join(graphs.KNOWN_IMPLS)} (default: {', '.join(graphs.IMPLS)}); "
                   "conccl's tensors, algorithm and stream mode: the flags below")
    add_variant_flags(b)
    b.add_argument("--modes", default=",".join(graphs.DEFAULT_MODES),
                   help="of graph, eager, beside (one eager call queued while bf16 8192^3 GEMMs hold the SMs: its "
                        "completion against alone); default graph,eager")
    b.add_argument("--calls", type=int_range(1, MAX_COUNT), default=20,
                   help="calls captured into one graph; eager: queued back to back (default 20)")
    b.add_argument("--replays", type=int_range(1, MAX_COUNT), default=10,
                   help="graph replays (eager: groups of calls) per timed run (default 10)")
    b.add_argument("--runs", type=int_range(1, MAX_COUNT), default=5, help="timed runs; their median counts (default 5)")
    b.add_argument("--warmup", type=int_range(0, MAX_COUNT), default=3, help="untimed replays first (default 3)")
    b.add_argument("--graph-workspace", default="4G",
                   help="graph workspace a case's captured conccl calls may take; fewer calls are captured where "
                        "--calls would need more (default 4G)")
    b.add_argument("--gpus", type=int_range(2, MAX_WORLD), default=None, help="processes (default: all visible GPUs)")
    b.add_argument("--out", required=True, help="folder for graphs.json and graphs.md")
    add_machine_kind(b, "JSON")


def _size(text: str, flag: str | None = None) -> int:
    try:
        return parse_size(text)
    except argparse.ArgumentTypeError as e:  # its message says what is wrong
        raise ValueError(f"{flag}: {e}" if flag else str(e)) from None


def config(args) -> graphs.GraphsConfig:
    """The run the flags ask for; ValueError naming what is wrong."""
    collectives = (tuple(COLLECTIVES) if args.collectives.strip() == "all"
                   else graphs.parse_list(args.collectives, "--collectives"))
    return graphs.GraphsConfig(
        sizes=graphs.parse_list(args.sizes, "--sizes", _size), collectives=collectives,
        impls=graphs.parse_list(args.impls, "--impls"), modes=graphs.parse_list(args.modes, "--modes"),
        variant=variant_of(args),
        calls=args.calls, replays=args.replays, runs=args.runs, warmup=args.warmup,
        graph_workspace_bytes=_size(args.graph_workspace, "--graph-workspace"))


def run(args) -> int:
    try:
        cfg = config(args)
    except ValueError as e:
        return fail("bench graphs", str(e))
    out = check_out_dir(args.out, "--out")
    world, why = gpu_world(args.gpus)
    if why:
        return fail("bench graphs", why)
    meta = environment(args.machine_kind, world)
    n = len(cfg.sizes) * len(cfg.collectives) * len(cfg.impls) * len(cfg.modes)
    print(f"# conccl bench graphs on {world} x {meta['device']} (torch {meta['torch']}, NCCL {meta['nccl']}): "
          f"{n} cases, {cfg.calls} calls per graph; progress on stderr", flush=True)
    res = run_per_gpu(run_all, cfg, nprocs=args.gpus, timeout_s=3600)[0]
    if under_torchrun() and int(os.environ["RANK"]) != 0:
        return EXIT_OK  # rank 0 holds the slowest-rank figures and writes the files
    out.mkdir(parents=True, exist_ok=True)
    doc = graphs.document(meta, cfg, res["results"], res["eager_path"])
    graphs.write(out, doc)
    print(graphs.markdown(doc))
    bad = [r for r in res["results"] if r.error is not None or r.wrong]
    return EXIT_FAILED if bad else EXIT_OK
