"""Several conccl ranks on ONE GPU: the shared-GPU rig (tests/rig/) from the command line.

The rig's parts are tests (``PYTHONPATH=src CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q tests/rig``);
this runs chosen parts at one world and prints the cases' count, the wrong ones and the kernels
seen, with a JSON mirror of every rank's report. Exit code 0 where every case is right, 1
otherwise, 2 on bad input or with no GPU.

    PYTHONPATH=src python scripts/shared_gpu_smoke.py [--world 2] [--json OUT.json] [--fsdp] [--only tp,...]
    PYTHONPATH=src python scripts/shared_gpu_smoke.py --world 4 --only hier   # 2 simulated hosts x 2
    PYTHONPATH=src python scripts/shared_gpu_smoke.py --world 4 --only fsdp_hosts   # HSDP, full sharding
    PYTHONPATH=src python scripts/shared_gpu_smoke.py --world 4 --only hier_faults  # a rank killed on host 1

``IpcPeerMemory`` and ``free_port_any`` stay importable from here (scripts/launch_path_bench.py).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from rig.harness import BY_NAME, IpcPeerMemory, default_parts, failures, free_port_any, parse_parts, run  # noqa: E402

__all__ = ["IpcPeerMemory", "free_port_any", "main"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--fsdp", action="store_true", help="also FSDP2 with conccl.fsdp.enable, plain and direct=True "
                    "(4 steps, 3 blocks): the fsdp part")
    ap.add_argument("--fsdp-dim", type=int, default=256, help="the FSDP blocks' width (default 256)")
    ap.add_argument("--only", default="", help=f"comma-separated parts of {', '.join(BY_NAME)} (default: all but fsdp "
                    "and hier_faults, which kills a rank; hier and fsdp_hosts at an even world of 4 or more: 2 simulated hosts)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for every rank's report (default 900)")
    a = ap.parse_args()
    if a.world < 1:
        print(f"shared_gpu_smoke: argument --world: {a.world} is out of range; expected 1 or more", file=sys.stderr)
        return 2
    try:
        parts = parse_parts(a.only) if a.only else default_parts(a.world)
    except ValueError as e:
        print(f"shared_gpu_smoke: argument --only: {e}", file=sys.stderr)
        return 2
    if a.fsdp:
        parts = parse_parts(",".join(parts + ("fsdp",)))
    if not torch.cuda.is_available():
        print("no CUDA GPU visible", file=sys.stderr)
        return 2
    os.environ["CONCCL_SMOKE_FSDP_DIM"] = str(a.fsdp_dim)  # the spawned ranks read it
    result = run(a.world, parts, timeout=a.timeout)
    total, wrong, errors = failures(result)
    first = result["reports"][0]
    print(f"world {a.world} on one GPU: {total - len(wrong)}/{total} cases right ({result['wall_s']} s); graph kernels "
          f"{first.get('graph_kernels')}; eager all-gather kernels {first.get('eager_all_gather_kernels')}; "
          f"tp kernels {first.get('tp_kernels')}")
    for rank, name in wrong:
        print(f"  WRONG rank {rank}: {name}")
    for rank, err in errors:
        print(f"  ERROR rank {rank}: {err}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if wrong or errors or total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
