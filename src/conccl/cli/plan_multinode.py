"""``conccl plan --nodes N --gpus-per-node L``: a PREDICTION for a multi-node job no machine here
has: flat NCCL across the nodes against conccl's hierarchical collective (NCCL between nodes,
copy engines inside each), the time of each and the SM time the hierarchical one saves.
The model and its formulas: :mod:`conccl.planner.multinode`, docs/planner.md."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from ..collectives import REGISTRY as COLLECTIVES
from ..jsonfile import write_text
from ..planner import multinode
from ..planner.timing import MAX_WORLD
from ..units import format_size, parse_size
from .common import EXIT_OK, UsageError, about, float_range, int_range

MAX_NODES = 65536
DEFAULT_GPUS_PER_NODE = 8  # an HGX/DGX node
# Flags that only the multi-node prediction reads, and those it cannot honour.
OWN = ("gpus_per_node", "network_gbps", "nvlink_gbps", "nccl_ctas")
NOT_MODELLED = (("--gemm", "gemm"), ("--world", "world"), ("--evaluate", "evaluate"), ("--markdown", "markdown"))


def add_arguments(p) -> None:
    g = p.add_argument_group("beyond one node (a prediction: docs/planner.md#beyond-one-node-predictions)")
    g.add_argument("--nodes", type=int_range(1, MAX_NODES), default=None,
                   help="nodes of the job: predicts flat NCCL against the hierarchical collective for --collective "
                        "and --size (all_gather, reduce_scatter or all_reduce)")
    g.add_argument("--gpus-per-node", type=int_range(1, MAX_WORLD), default=None,
                   help=f"GPUs per node, 1 to {MAX_WORLD} (default {DEFAULT_GPUS_PER_NODE})")
    g.add_argument("--network-gbps", type=float_range(0, 1e6, "Gbit/s"), default=None,
                   help=f"network bandwidth per GPU in Gbit/s (default {multinode.DEFAULT_NETWORK_GBPS:g}: one 400G "
                        "NIC per GPU, its line rate; give what NCCL measures over it where you know it)")
    g.add_argument("--nvlink-gbps", type=float_range(0, 1e6, "Gbit/s"), default=None,
                   help="NVLink bandwidth per GPU that copy engines reach, in Gbit/s (default: the profile's; "
                        "3090 = its 386 GB/s on H200)")
    g.add_argument("--nccl-ctas", type=int_range(1, 1024), default=None,
                   help="CTAs (SMs) NCCL holds while it runs (default: the profile's, 32 on H200)")


def wanted(args) -> bool:
    """Whether the command line asks for the multi-node prediction; refuses its flags alone."""
    if args.nodes is None:
        given = [f"--{n.replace('_', '-')}" for n in OWN if getattr(args, n) is not None]
        if given:
            raise UsageError(f"{', '.join(given)} without --nodes: only a multi-node prediction reads it; give "
                             "--nodes N too")
        return False
    return True


def _ms(s: float) -> str:
    return f"{1e3 * s:.3f} ms"


def _rate(b: float) -> str:
    return f"{b / 1e9:.1f} GB/s ({8 * b / 1e9:.0f} Gbit/s)"


def table(pr: multinode.Prediction, links: multinode.Links) -> str:
    w = links.world
    rows = [("PREDICTION", "a model of a job no machine here has; nothing in it was measured across nodes "
                           "(docs/planner.md#beyond-one-node-predictions)"),
            ("profile", links.source.get("profile", "given")),
            ("job", f"{links.nodes} node(s) x {links.gpus_per_node} GPUs = {w} ranks"),
            ("collective", f"{pr.collective}, {pr.size} B ({format_size(pr.size)}) output per rank; whole tensor "
                           f"{format_size(pr.whole_bytes)}"),
            ("network per GPU", f"{_rate(links.network_bytes_per_s)}, {links.source.get('network', 'given')}"),
            ("NVLink per GPU", f"{_rate(links.nvlink_bytes_per_s)} copy engines ({links.source.get('nvlink', 'given')}); "
                               f"NCCL {links.nccl_nvlink_bytes_per_s / 1e9:.1f} GB/s"),
            ("predicted flat NCCL", f"{_ms(pr.flat_s)} (ring over {w} ranks: latency {_ms(pr.flat_latency_s)}, transfer "
                                    f"{_ms(pr.flat_transfer_s)} at {pr.flat_busbw / 1e9:.1f} GB/s bus)"),
            ("predicted hierarchical", f"{_ms(pr.hier_s)} ({' ; '.join(f'{s.where} {s.collective}' for s in pr.steps)}, "
                                       "one after the other)")]
    for s in pr.steps:
        what = (f"NCCL over {s.ranks} ranks of equal local index" if s.where == "network"
                else f"copy engines over {s.ranks} GPUs")
        summed = f" + sum {_ms(s.sum_s)} ({links.reduce_ctas} CTAs)" if s.sum_s else ""
        rows.append((f"  {s.where} {s.collective}", f"{_ms(s.seconds)}: {what}, {format_size(s.whole_bytes)} whole; "
                                                     f"latency {_ms(s.latency_s)} + transfer {_ms(s.transfer_s)}{summed}"))
    saved_pct = 100 * pr.sm_s_saved / pr.flat_sm_s
    rows += [("predicted SM time, flat", f"{1e3 * pr.flat_sm_s:.2f} SM-ms per GPU ({links.nccl_ctas} CTAs x its time)"),
             ("predicted SM time, hier.", f"{1e3 * pr.hier_sm_s:.2f} SM-ms per GPU (NCCL's CTAs in the network steps, "
                                          "the sums' CTAs; copy engines none)"),
             ("predicted SM time saved", f"{1e3 * pr.sm_s_saved:.2f} SM-ms per GPU per call ({saved_pct:.0f}% of flat's), "
                                         f"{pr.sm_s_saved * w:.4f} SM-s per call across the {w} GPUs"),
             ("hierarchical - flat", f"{1e3 * (pr.hier_s - pr.flat_s):+.3f} ms per call"),
             ("if pipelined (not built)", f">= {_ms(pr.pipelined_bound_s)}: its longest step")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run(args, prof) -> int:
    given = [flag for flag, name in NOT_MODELLED if getattr(args, name)]
    if args.strategy != "auto":
        given.append("--strategy")
    if given:
        raise UsageError(f"--nodes predicts one collective across nodes; {', '.join(given)} is not part of that "
                         "model: drop it")
    if not args.size:
        raise UsageError("--nodes: give --size BYTES (output bytes per rank) too")
    try:
        size = parse_size(args.size)
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"--size: {e}") from None
    if args.collective not in multinode.HIERARCHY:
        raise UsageError(f"--collective {args.collective}: no hierarchical {args.collective} is modelled; "
                         f"give one of {', '.join(multinode.HIERARCHY)}")
    gpn = args.gpus_per_node or DEFAULT_GPUS_PER_NODE
    world = args.nodes * gpn
    if world < 2:
        raise UsageError(f"--nodes {args.nodes} --gpus-per-node {gpn}: one rank has no collective; give 2 or more "
                         "in all")
    need = COLLECTIVES[args.collective].buffer_bytes(size, world)
    if need > prof.memory_bytes:
        raise UsageError(f"--size {args.size}: {args.collective} over {world} ranks needs {need / 2**30:.1f} GiB per "
                         f"GPU, the profile's GPU has {prof.memory_bytes / 2**30:.1f} GiB; give a smaller size")
    with about("--size", args.size):
        multinode.whole_bytes(args.collective, size, world)  # at least one byte per chunk
    links = multinode.links_from_profile(
        prof, args.nodes, gpn, multinode.gbps(args.network_gbps) if args.network_gbps else None,
        multinode.gbps(args.nvlink_gbps) if args.nvlink_gbps else None, args.nccl_ctas, args.collective, size)
    pr = multinode.predict(links, args.collective, size)
    doc = {"format": multinode.FORMAT, "prediction": True, "prediction_of": "a multi-node job no machine here has",
           "links": asdict(links), "result": pr.to_dict()}
    if args.json == "-":
        print(json.dumps(doc, indent=1))
        return EXIT_OK
    print(table(pr, links))
    if args.json:
        write_text(args.json, json.dumps(doc, indent=1) + "\n")
    return EXIT_OK
