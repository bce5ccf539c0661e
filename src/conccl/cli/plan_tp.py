"""``conccl plan tp``: the pipeline ``auto`` runs for a tensor-parallel op, and its predicted
time; or the planner's accuracy against one GPU's measurements (``--evaluate``)."""
from __future__ import annotations


from ..jsonfile import read_json
from ..planner import tp as tpp
from ..planner.profile import load_profile
from ..planner.timing import MAX_WORLD
from ..study import tp_evaluate
from ..study.tp_measure import TPCharacterization, profile_table
from .common import COMMAND_HELP, EXIT_OK, UsageError, about, check_out_file, int_range, print_and_write
from .study_tp import parse_shapes


def add_parser(sub) -> None:
    p = sub.add_parser("plan-tp", help=COMMAND_HELP["plan-tp"],
                       description="Prints the schedule conccl.tp's schedule='auto' runs for an all-gather+GEMM "
                                   "(ag_gemm) or GEMM+reduce-scatter (gemm_rs) of this shape and world size, its "
                                   "predicted time against the GEMM alone and the serial schedule, and the next "
                                   "best candidates. With --evaluate TP_JSON (a one-GPU `conccl bench tp` run), "
                                   "the model's error against it instead.")
    p.add_argument("--op", choices=tpp.OPS, default="ag_gemm")
    p.add_argument("--shape", type=parse_shapes, metavar="MxKxN",
                   help="M (gathered rows, or rows of the product) x K x N")
    p.add_argument("--world", type=int_range(1, MAX_WORLD), default=2)
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--profile", metavar="FILE",
                   help="hardware profile (default: the embedded H200 x4); its tp table, where it has one, is the "
                        "characterization")
    p.add_argument("--characterization", metavar="FILE",
                   help="a `conccl study tp` tp_characterization.json of this GPU (default: the embedded one of --gpu)")
    p.add_argument("--gpu", choices=sorted(tpp.EMBEDDED_TP), default=None,
                   help="the embedded characterization to use (default: with --evaluate, the run's GPU; else "
                        f"{tpp.DEFAULT_GPU})")
    p.add_argument("--json", metavar="FILE", help="also write it as JSON to FILE")
    p.add_argument("--evaluate", metavar="TP_JSON", help="judge the model on a one-GPU `conccl bench tp` tp.json")
    p.add_argument("--markdown", metavar="FILE", help="with --evaluate: write the evaluation as markdown")


def run(args) -> int:
    for flag in ("--json", "--markdown"):
        check_out_file(getattr(args, flag[2:]), flag)
    with about("--profile", args.profile or "(embedded)"):
        profile = load_profile(args.profile)
    table = None
    if args.characterization:
        with about("--characterization", args.characterization):
            data = read_json(args.characterization, ValueError, "conccl study tp characterization")
            try:
                table = profile_table(TPCharacterization.from_dict(data))
            except (KeyError, TypeError) as e:
                raise ValueError(f"not a whole characterization ({type(e).__name__}: {e})") from None
            if not table["rows_ms"]:
                raise ValueError("no row-chunk timings in it")
    if table is not None and args.gpu:
        raise UsageError("--gpu picks an embedded characterization; --characterization gives one: give one of them")
    if profile.tp and table is None and args.gpu:
        raise UsageError(f"--gpu picks an embedded characterization; --profile {args.profile} has its own tp table, "
                         "which is used: drop --gpu")
    bench = None
    if args.evaluate:
        if args.shape:
            raise UsageError("--evaluate judges the run's own shapes; --shape would be ignored: drop it")
        with about("--evaluate", args.evaluate):
            bench = read_json(args.evaluate, ValueError, "conccl bench tp results")
            if not isinstance(bench, dict) or not isinstance(bench.get("results"), list):
                raise ValueError("not a `conccl bench tp` tp.json (no results list)")
    meta = bench.get("meta") if bench else None
    gpu = tpp.embedded_gpu(args.gpu or (meta.get("device") if isinstance(meta, dict) else None))
    model = tpp.model_from(profile, table, device_name=gpu)
    source = args.characterization or (f"the tp table of {args.profile}" if profile.tp and table is None
                                       else f"the embedded {gpu} characterization")
    if bench is not None:
        ev, render = tp_evaluate.evaluate(bench, model, args.world), tp_evaluate.markdown
        if not ev["rows"]:  # a run on several GPUs: whole pipelines, judged as such
            ev, render = tp_evaluate.evaluate_pipelines(bench, model), tp_evaluate.pipelines_markdown
        if not ev["rows"]:
            raise UsageError(f"--evaluate {args.evaluate}: no schedule timings in it (run `conccl bench tp`)")
        ev["characterization"] = source
        print_and_write(render(ev) + f"\nModel: {source}.\n", args.markdown, args.json, ev)
        return EXIT_OK
    if args.markdown:
        raise UsageError("--markdown writes the evaluation: give it with --evaluate TP_JSON")
    if not args.shape or len(args.shape) != 1:
        raise UsageError("give one --shape MxKxN (or --evaluate TP_JSON)")
    M, K, N = args.shape[0]
    if M % args.world:
        raise UsageError(f"--shape: M ({M}) must be divisible by --world ({args.world})")
    c = tpp.choose(args.op, M, K, N, args.world, args.dtype, model=model)
    doc = {"format": "conccl-tp-plan/1", "op": args.op, "M": M, "K": K, "N": N, "world": args.world,
           "schedule": c.schedule.name, "predicted_s": c.predicted_s, "gemm_alone_s": c.gemm_alone_s,
           "serial_s": c.serial_s, "measured": c.measured, "from_runs": c.from_runs, "ranked": [list(x) for x in c.ranked],
           "characterization": source, "prediction": True}
    lines = [f"PREDICTION      {args.op} {M}x{K}x{N}, world {args.world}, {args.dtype}: from {source} "
             "(" + (f"this shape timed as whole pipelines on {c.from_runs} GPUs: the fastest measured" if c.from_runs
                    else 'this shape measured' if c.measured else 'shape not measured: interpolated or the tile-wave model')
             + ")",
             f"schedule        {c.schedule.name}",
             f"predicted       {1e3 * c.predicted_s:.3f} ms = {c.predicted_s / c.gemm_alone_s:.3f}x the GEMM alone "
             f"({1e3 * c.gemm_alone_s:.3f} ms); serial {1e3 * c.serial_s:.3f} ms = {c.serial_s / c.gemm_alone_s:.3f}x"]
    lines += [f"  then          {name:<16} {1e3 * s:.3f} ms" for name, s in c.ranked[1:6]]
    print_and_write("\n".join(lines), None, args.json, doc)
    return EXIT_OK
