"""Ways to lower a tensor-parallel pipeline's losses, measured on one GPU (issue 30, item 3).

Per shape (M x K x N, bf16) and chunk count c, the same GEMM cut three ways, against the whole:

- ``rows``: c equal row chunks (what the pipelines run; the characterization's "rows");
- ``rows_waves``: c row chunks whose boundaries fall on whole waves of output tiles (128 x 256
  tiles, one per SM per wave): the rows that fill ``sm_count`` tiles, rounded, so no chunk ends
  in a part-empty wave (the last takes the rest);
- ``cols``: c column chunks of the weight (M x K x N/c each): the other dimension, which keeps
  every chunk's rows (for the arrival order of a pipeline it is no substitute, but it says where
  the loss comes from).

And the reduce-scatter's sum, two ways, for a ``world``-rank GEMM+reduce-scatter whose partial
products are ``world`` chunks of ``M / world`` rows:

- ``kernel``: each chunk's GEMM (``torch.mm``), then conccl's reduction kernel over the
  ``world`` partials (what ``conccl.tp.matmul_reduce_scatter`` runs: fp32 sum, one rounding,
  the serial result's bits);
- ``fold``: each chunk's GEMM adds the partial before it (``torch.addmm(acc, a, w)``, beta 1),
  as a ring would as partials arrive: no reduction kernel, but a bf16 rounding per step, so not
  the serial result's bits (``fold_differs``: the fraction of elements that differ from the
  kernel's; ``fold_max_rel``: the largest difference over the largest magnitude).

Every configuration of a shape is timed in turn, round by round, between CUDA events with the
GPU asleep while the host queues the run. Writes JSON and a markdown table.

    PYTHONPATH=src python3 benchmarks/2026-11-25-h100-tp-losses/tp_loss_probe.py --json OUT/loss_probe.json --markdown OUT/loss_probe.md
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import torch

from conccl.bench import tp as bench_tp

SHAPES = ((8192, 8192, 7168), (8192, 3584, 8192), (8192, 4096, 14336), (8192, 8192, 14336), (1024, 8192, 7168),
          (16384, 8192, 14336), (4096, 8192, 8192), (32768, 4096, 7168))
CHUNKS = (2, 4, 8, 16)
TILE_M, TILE_N = 128, 256


def wave_rows(N: int, sms: int) -> int:
    """The fewest rows whose output tiles (TILE_M x TILE_N) are a whole number of waves of
    ``sms`` tiles: no part-empty last wave."""
    per_row = math.ceil(N / TILE_N)
    return TILE_M * sms // math.gcd(sms, per_row)


def wave_cuts(M: int, c: int, N: int, sms: int) -> list[tuple[int, int]] | None:
    """c row chunks of M, each a whole number of waves (the last the rest), as near M / c as
    that allows; None where a chunk of M / c rows is under one such block."""
    w = wave_rows(N, sms)
    per = round(M / c / w) * w
    if per == 0:
        return None
    cuts, start = [], 0
    for i in range(c):
        end = M if i == c - 1 else min(M, start + per)
        if end <= start:
            break
        cuts.append((start, end))
        start = end
    return cuts


def timed_in_turn(fns: dict, warmup: int, runs: int) -> dict:
    """Median milliseconds of each of ``fns`` (name -> callable), timed in turn as `conccl bench tp` does."""
    times = bench_tp.timed_in_turn(torch, list(fns.values()), warmup, runs)
    return {k: statistics.median(v) for k, v in zip(fns, times)}


def decomposition(M, K, N, sms, warmup, runs) -> list[dict]:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    fns = {("whole", 1): lambda: torch.mm(a, w, out=out)}
    for c in CHUNKS:
        if M % c:
            continue
        r = M // c
        rows = [(a[i * r:(i + 1) * r], out[i * r:(i + 1) * r]) for i in range(c)]
        wc = wave_cuts(M, c, N, sms)
        waves = [(a[s:e], out[s:e]) for s, e in wc] if wc else None
        n = N // c
        cols = [(w[:, j * n:(j + 1) * n], torch.empty(M, n, device="cuda", dtype=torch.bfloat16)) for j in range(c)]
        fns[("rows", c)] = lambda rows=rows: [torch.mm(x, w, out=y) for x, y in rows]
        if waves:
            fns[("rows_waves", c)] = lambda waves=waves: [torch.mm(x, w, out=y) for x, y in waves]
        fns[("cols", c)] = lambda cols=cols: [torch.mm(a, wc, out=y) for wc, y in cols]
    ms = timed_in_turn(fns, warmup, runs)
    whole = ms[("whole", 1)]
    recs = []
    for (how, c), t in ms.items():
        rec = {"M": M, "K": K, "N": N, "how": how, "chunks": c, "ms": t, "loss": t / whole}
        if how == "rows_waves":
            rec["cuts"] = [e - s for s, e in wave_cuts(M, c, N, sms)]
        recs.append(rec)
    return recs


def reduce_sum(M, K, N, world, warmup, runs) -> dict:
    from conccl._driver import driver
    from conccl.executors.cuda_reduce import ReduceLaunch

    rows = M // world
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) / K ** 0.25
    w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / K ** 0.25
    parts = [torch.empty(rows, N, device="cuda", dtype=torch.bfloat16) for _ in range(world)]
    dst = torch.empty(rows, N, device="cuda", dtype=torch.bfloat16)
    acc = torch.empty(rows, N, device="cuda", dtype=torch.bfloat16)
    pieces = [a[d * rows:(d + 1) * rows] for d in range(world)]  # each stands for one rank's partial
    dev = torch.cuda.current_device()
    red = ReduceLaunch(dev, dst.data_ptr(), tuple(p.data_ptr() for p in parts), dst.numel() * 2, "bfloat16", 1.0)
    cu = driver()

    def kernel():
        for x, p in zip(pieces, parts):
            torch.mm(x, w, out=p)
        err = red.launch(cu, torch.cuda.current_stream().cuda_stream)
        assert not err[0], err

    def fold():
        torch.mm(pieces[0], w, out=acc)
        for x in pieces[1:]:
            acc.addmm_(x, w)

    ms = timed_in_turn({"gemm_whole": lambda: torch.mm(a, w), "kernel": kernel, "fold": fold}, warmup, runs)
    kernel()
    fold()
    torch.cuda.synchronize()
    differs = (dst != acc).float().mean().item()
    rel = ((dst.float() - acc.float()).abs().max() / dst.float().abs().max()).item()
    return {"M": M, "K": K, "N": N, "world": world, "gemm_whole_ms": ms["gemm_whole"], "kernel_ms": ms["kernel"],
            "fold_ms": ms["fold"], "fold_over_kernel": ms["fold"] / ms["kernel"], "fold_differs": differs,
            "fold_max_rel": rel}


def markdown(doc) -> str:
    lines = [f"# Lowering the tensor-parallel losses ({doc['device']}, bf16)", "",
             f"{doc['date']}, commit {doc['commit']}, torch {doc['torch']}. Each cell: all chunks' time over the "
             "whole GEMM's (median of the timed rounds).", "",
             "| M x K x N | whole (ms) | " + " | ".join(f"{how} {c}" for c in CHUNKS for how in ("rows", "waves", "cols"))
             + " |", "| --- | --- | " + " | ".join("---" for _ in CHUNKS for _ in range(3)) + " |"]
    by = {}
    for r in doc["decomposition"]:
        by.setdefault((r["M"], r["K"], r["N"]), {})[(r["how"], r["chunks"])] = r
    for (M, K, N), d in by.items():
        cells = []
        for c in CHUNKS:
            for how in ("rows", "rows_waves", "cols"):
                r = d.get((how, c))
                cells.append(f"{r['loss']:.2f}x" if r else "")
        lines.append(f"| {M}x{K}x{N} | {d[('whole', 1)]['ms']:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "## The reduce-scatter's sum: the reduction kernel, or folded into the GEMMs", "",
              "| M x K x N | world | GEMM whole (ms) | GEMMs + kernel (ms) | folded (ms) | folded / kernel | "
              "elements differing | max difference / max magnitude |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc["reduce"]:
        lines.append(f"| {r['M']}x{r['K']}x{r['N']} | {r['world']} | {r['gemm_whole_ms']:.3f} | {r['kernel_ms']:.3f} | "
                     f"{r['fold_ms']:.3f} | {r['fold_over_kernel']:.3f} | {100 * r['fold_differs']:.1f}% | {r['fold_max_rel']:.1e} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--markdown")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    import datetime

    doc = {"device": torch.cuda.get_device_name(0), "sm_count": sms, "torch": torch.__version__, "commit": a.commit,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "config": {"runs": a.runs, "warmup": a.warmup, "chunks": CHUNKS, "tile": [TILE_M, TILE_N]},
           "decomposition": [], "reduce": []}
    for M, K, N in SHAPES:
        doc["decomposition"] += decomposition(M, K, N, sms, a.warmup, a.runs)
        print(f"{M}x{K}x{N}: decomposition done", file=sys.stderr, flush=True)
    for M, K, N in ((8192, 14336, 8192), (8192, 3584, 8192), (1024, 3584, 8192), (32768, 7168, 4096)):
        for world in (2, 4, 8):
            doc["reduce"].append(reduce_sum(M, K, N, world, a.warmup, a.runs))
        print(f"{M}x{K}x{N}: reduce done", file=sys.stderr, flush=True)
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)
    text = markdown(doc)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
