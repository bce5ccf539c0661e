"""DRAM and L2 bytes of each GEMM from Nsight Compute's counters, where ``ncu`` is installed.

The study runs this module under ``ncu`` on one GPU before the distributed part: each GEMM
runs once, preceded by a fill of its output (a marker kernel), and the counters of the
kernels after each marker are the GEMM's. The paper classifies a kernel by its measured
op-to-byte (flops / DRAM bytes) against the machine's; this gives the DRAM bytes for that.
Collectives are not profiled: NCCL's kernels wait on their peers under replay, and conccl
launches no kernel at all.

    ncu ... python3 -m conccl.study.ncu 8192x8192x8192 64x8192x28672
"""
from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys

import torch

from .scenarios import parse_gemm

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum")
MARKER = "fillfunctor"  # the output's fill kernel opens each GEMM's group
OTHER = "elementwise"  # random initialisation and other elementwise kernels belong to no GEMM


def available() -> str | None:
    return shutil.which("ncu")


def gemm_counters(gemms, device_index: int = 0, timeout_s: float = 240) -> dict:
    """{gemm tag: {"dram_bytes", "l2_bytes", "kernels"}} or {"error": why}."""
    ncu = available()
    if not ncu:
        return {"error": "ncu not found"}
    gemms = list(gemms)
    cmd = [ncu, "--clock-control", "none", "--metrics", ",".join(METRICS), "--csv", "--print-units", "base",
           sys.executable, "-m", "conccl.study.ncu", *[g.mnk for g in gemms]]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(device_index))
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"ncu did not finish in {timeout_s:.0f} s"}
    if p.returncode != 0:
        return {"error": f"ncu exited {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}"}
    try:
        per = parse(p.stdout, len(gemms))
    except ValueError as e:
        return {"error": str(e)}
    return {g.tag: v for g, v in zip(gemms, per)}


def parse(text: str, n_gemms: int) -> list[dict]:
    """Group ncu's CSV rows by kernel, then kernels into GEMMs at each marker kernel."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        raise ValueError("ncu printed no counter rows")
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        k = kernels.setdefault(row["ID"], {"name": row["Kernel Name"]})
        k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    groups: list[list[dict]] = []
    for _, k in sorted(kernels.items(), key=lambda kv: int(kv[0])):
        name = k["name"].lower()
        if MARKER in name:
            groups.append([])
        elif groups and OTHER not in name:
            groups[-1].append(k)
    groups = [g for g in groups if g]
    if len(groups) != n_gemms:
        raise ValueError(f"expected {n_gemms} GEMMs in ncu's output, found {len(groups)}")
    return [{"dram_bytes": sum(k.get("dram__bytes_read.sum", 0) + k.get("dram__bytes_write.sum", 0) for k in g),
             "l2_bytes": sum(k.get("lts__t_bytes.sum", 0) for k in g), "kernels": len(g)} for g in groups]


def _main(shapes: list[str]) -> None:
    for text in shapes:
        g = parse_gemm(text)
        a = torch.randn(g.m, g.k, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(g.k, g.n, dtype=torch.bfloat16, device="cuda")
        c = torch.empty(g.m, g.n, dtype=torch.bfloat16, device="cuda")
        c.fill_(0)  # the marker
        torch.mm(a, b, out=c)
        torch.cuda.synchronize()
        del a, b, c
        torch.cuda.empty_cache()


if __name__ == "__main__":
    _main(sys.argv[1:])
