"""The table of docs/planner.md "Beyond one node: predictions": predicted FSDP2 all-gather and
reduce-scatter times per training step, and the SM time the hierarchical collectives save, for
`conccl bench fsdp`'s model at several node counts. A PREDICTION (conccl.planner.multinode),
nothing measured.

What one step (forward + backward) of that model runs under FSDP2 (`fully_shard` on every block
and the root, reshard after forward, the default), counted on CPU with gloo and torch 2.13 (the
hooked `all_gather_single` / `reduce_scatter_single` calls of the same Model at small width):
per block, one all-gather in the forward and one again in the backward, and one reduce-scatter
in the backward; the root holds no parameter of its own. A block's all-gather output is its
parameters in bf16, each parameter's dim 0 padded to a multiple of the world (FSDP2's
sharding); the reduce-scatter's output per rank is that over the world.

Run (prints the markdown docs/planner.md holds; tests/unit/test_multinode.py checks they agree):
``PYTHONPATH=src python3 scripts/multinode_fsdp_table.py [--nodes 2,8,64] [--gpus-per-node 8]
[--network-gbps 400] [--profile FILE]``
"""
from __future__ import annotations

import argparse
import math

import torch

from conccl.bench.fsdp import Block, ModelShape
from conccl.planner import multinode
from conccl.planner.profile import load_profile

DTYPE_BYTES = 2  # bf16, as conccl bench fsdp trains


def block_bytes(shape: ModelShape, world: int) -> int:
    """A block's FSDP2 all-gather output: its parameters, dim 0 padded to a multiple of ``world``."""
    with torch.device("meta"):
        blk = Block(shape)
    total = 0
    for p in blk.parameters():
        rows = math.ceil(p.shape[0] / world) * world
        total += rows * (p.numel() // p.shape[0])
    return DTYPE_BYTES * total


def step_rows(shape: ModelShape, nodes_list, gpus_per_node: int, profile=None, network_gbps=None) -> list[dict]:
    """Per node count: per-step sums of 2 x layers all-gathers and layers reduce-scatters."""
    prof = load_profile(profile)
    rows = []
    for nodes in nodes_list:
        world = nodes * gpus_per_node
        b = block_bytes(shape, world)
        net = multinode.gbps(network_gbps) if network_gbps else None
        links = multinode.links_from_profile(prof, nodes, gpus_per_node, net, collective="all_gather", size=b)
        ag = multinode.predict(links, "all_gather", b)
        rs = multinode.predict(links, "reduce_scatter", b // world)
        n_ag, n_rs = 2 * shape.layers, shape.layers
        rows.append({"nodes": nodes, "world": world, "block_bytes": b, "ag": ag, "rs": rs, "n_ag": n_ag, "n_rs": n_rs,
                     "flat_sm_s": n_ag * ag.flat_sm_s + n_rs * rs.flat_sm_s,
                     "saved_sm_s": n_ag * ag.sm_s_saved + n_rs * rs.sm_s_saved})
    return rows


def markdown(shape: ModelShape, rows: list[dict], gpus_per_node: int) -> str:
    ms = lambda s: f"{1e3 * s:.2f}"  # noqa: E731
    first = rows[0]
    out = [f"PREDICTION for `conccl bench fsdp`'s model ({shape.parameters() / 1e9:.2f} B parameters, {shape.layers} "
           f"blocks of {first['block_bytes'] / 2**20:.0f} MiB in bf16): per step {first['n_ag']} all-gathers and "
           f"{first['n_rs']} reduce-scatters, nodes of {gpus_per_node} GPUs, one 400 Gb/s NIC per GPU, links of the "
           "embedded H200 profile. Times are the collectives' own, summed over the step (FSDP overlaps them with "
           "compute; what stays exposed is not predicted); SM-s are SM-seconds.",
           "",
           "| nodes | ranks | all-gather per call, flat NCCL / hierarchical (ms) | reduce-scatter per call (ms) "
           "| per step: flat NCCL / hierarchical (ms) | per step, hierarchical pipelined (not built; ms, at least) "
           "| SM-s per GPU per step: flat NCCL | saved | saved, whole job |",
           "| ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        ag, rs = r["ag"], r["rs"]
        flat = r["n_ag"] * ag.flat_s + r["n_rs"] * rs.flat_s
        hier = r["n_ag"] * ag.hier_s + r["n_rs"] * rs.hier_s
        piped = r["n_ag"] * ag.pipelined_bound_s + r["n_rs"] * rs.pipelined_bound_s
        out.append(f"| {r['nodes']} | {r['world']} | {ms(ag.flat_s)} / {ms(ag.hier_s)} | {ms(rs.flat_s)} / "
                   f"{ms(rs.hier_s)} | {ms(flat)} / {ms(hier)} | {ms(piped)} | {r['flat_sm_s']:.3f} | {r['saved_sm_s']:.3f} "
                   f"({100 * r['saved_sm_s'] / r['flat_sm_s']:.0f}%) | {r['saved_sm_s'] * r['world']:.1f} |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="2,8,64", help="node counts, comma-separated")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--network-gbps", type=float, default=None, help="per GPU (default: the model's, 400)")
    ap.add_argument("--profile", default=None, help="hardware profile (default: the embedded H200 x4)")
    args = ap.parse_args(argv)
    shape = ModelShape()
    nodes = [int(n) for n in args.nodes.split(",")]
    print(markdown(shape, step_rows(shape, nodes, args.gpus_per_node, args.profile, args.network_gbps),
                   args.gpus_per_node))


if __name__ == "__main__":
    main()
