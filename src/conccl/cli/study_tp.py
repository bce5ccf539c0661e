"""``conccl study tp``: tensor parallelism's decomposition and contention losses on one GPU."""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

import torch

from ..bench.environment import environment
from ..jsonfile import write_text
from ..planner.profile import ProfileError, load_profile
from ..study import tp_measure, tp_report
from .common import COMMAND_HELP, EXIT_OK, UsageError, add_machine_kind, check_out_dir, check_out_file, int_range

JSON_NAME, MD_NAME, FIGURE_NAME = "tp_characterization.json", "tp_characterization.md", "tp_losses.png"


def parse_shapes(text: str) -> tuple:
    """'8192x8192x7168,1024x8192x7168' -> ((8192, 8192, 7168), ...): M x K x N, positive."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        try:
            dims = tuple(int(p) for p in parts)
        except ValueError:
            dims = ()
        if len(dims) != 3 or min(dims) <= 0:
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not MxKxN with three positive whole numbers")
        shapes.append(dims)
    return tuple(shapes)


def parse_chunks(text: str) -> tuple:
    try:
        chunks = tuple(sorted({int(c) for c in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not chunks or chunks[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: chunk counts must be >= 1")
    return chunks if 1 in chunks else (1, *chunks)  # the whole GEMM is what every loss divides by


def add_parser(sub) -> None:
    s = sub.add_parser(
        "study-tp", help=COMMAND_HELP["study-tp"],
        description="Measures, on one GPU, what cutting a tensor-parallel GEMM into row chunks costs (the "
                    "decomposition loss), what two streams buy back, and the loss with copy-engine copies beside "
                    "(the contention loss, over-stated on one GPU). Writes tp_characterization.json (the hardware "
                    "profile's tp table is made from it), tp_characterization.md and tp_losses.png.")
    s.add_argument("--out", required=True, help="folder to write into (created)")
    s.add_argument("--shapes", type=parse_shapes, default=tp_measure.DEFAULT_SHAPES,
                   help="comma-separated MxKxN (M: the gathered rows); default: 12 shapes of Llama-3 8B/70B layers")
    s.add_argument("--chunks", type=parse_chunks, default=tp_measure.DEFAULT_CHUNKS,
                   help="comma-separated row-chunk counts (default: 1,2,3,4,6,8,12,16,24,32)")
    s.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    s.add_argument("--world", type=int_range(2, 64), default=2,
                   help="world size whose pipeline the contention copies stand for (default 2)")
    s.add_argument("--runs", type=int_range(3, 1000), default=10, help="timed runs per configuration (default 10)")
    s.add_argument("--warmup", type=int_range(1, 100), default=3)
    s.add_argument("--quick", action="store_true", help="three shapes, chunks 1,2,4,8")
    s.add_argument("--profile", metavar="FILE",
                   help="also keep the characterization in this hardware profile (a `conccl study` profile.json, "
                        "rewritten in place): `conccl plan tp --profile FILE` then plans from it")
    add_machine_kind(s, "characterization")


def run(args) -> int:
    out = pathlib.Path(args.out)
    check_out_dir(out, "--out")
    if (out / JSON_NAME).exists():
        raise UsageError(f"--out {out} already holds {JSON_NAME}; choose another folder")
    if not torch.cuda.is_available():
        raise UsageError("conccl study tp measures GEMMs on a CUDA GPU and none is visible")
    profile = None
    if args.profile:  # read, and checked writable, before the measuring, not after
        try:
            profile = load_profile(args.profile)
        except ProfileError as e:
            raise UsageError(f"--profile: {e}") from None
        check_out_file(args.profile, "--profile")
        here = torch.cuda.get_device_name(torch.cuda.current_device())
        if profile.device != here:
            raise UsageError(f"--profile {args.profile} was measured on {profile.device!r}, this GPU is {here!r}: "
                             "keep the characterization in a profile of this GPU")
    shapes, chunks = args.shapes, args.chunks
    if args.quick:
        shapes, chunks = shapes[:3], (1, 2, 4, 8)
    out.mkdir(parents=True, exist_ok=True)

    def progress(done, total, text):
        print(f"[{done}/{total}] {text}", file=sys.stderr, flush=True)

    char = tp_measure.measure(shapes, chunks, dtype=args.dtype, world=args.world, warmup=args.warmup,
                              runs=args.runs, progress=progress)
    meta = environment(args.machine_kind, 1)
    char = tp_measure.TPCharacterization(char.dtype, char.world, char.timings, meta)
    write_text(out / JSON_NAME, json.dumps(char.to_dict(), indent=1))
    write_text(out / MD_NAME, tp_report.markdown(char))
    tp_report.figure(char, out / FIGURE_NAME)
    print(f"conccl study tp: wrote {out / JSON_NAME}, {out / MD_NAME} and {out / FIGURE_NAME}")
    if profile is not None:
        table = dict(tp_measure.profile_table(char),
                     source={k: meta.get(k) for k in ("machine_kind", "device", "date", "commit")}
                     | {"from": str(out / JSON_NAME)})
        write_text(args.profile, dataclasses.replace(profile, tp=table).to_json())
        print(f"conccl study tp: kept the characterization in {args.profile} (its tp table)")
    return EXIT_OK
