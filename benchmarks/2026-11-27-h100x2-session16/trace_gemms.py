"""Where FSDP2 mixed precision's GEMMs lose time: session 6 run3's profiled iterations (rank 0,
2 x H100, 8192 tokens), no_comm against `direct=True` with `step_and_prefetch`, read offline.

The compute stream's kernels of the two traces are aligned by name (difflib; the optimizer's
kernels, which no_comm runs on every parameter, fall out), and each GEMM's time in the conccl
iteration is divided by the same GEMM's in no_comm: along the iteration, and by what ran
on the other streams (copies, kernels) during it and in the 2 ms before.

    python3 benchmarks/2026-11-27-h100x2-session16/trace_gemms.py > trace_gemms.txt
"""
import collections
import difflib
import gzip
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "..", "2026-11-26-h100x2-session6", "run3", "traces")
COMPUTE_STREAM = 7  # the tid of the compute stream in both traces


def load(name):
    with gzip.open(os.path.join(TRACES, name + ".json.gz")) as f:
        t = json.load(f)
    ev = t["traceEvents"] if isinstance(t, dict) else t
    return [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def compute(events):
    return sorted((e for e in events if e.get("tid") == COMPUTE_STREAM and e["cat"] == "kernel"), key=lambda e: e["ts"])


def is_gemm(name):
    return name.startswith("nvjet") or "gemm" in name.lower() or "flash" in name


def overlap(s, t, intervals):
    return sum(min(y, t) - max(x, s) for x, y in intervals if y > s and x < t)


def main():
    nc, cc = load("no_comm_8192"), load("conccl_direct_prefetch_8192")
    a, b = compute(nc), compute(cc)
    na, nb = [e["name"] for e in a], [e["name"] for e in b]
    pairs = [(i, j) for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, na, nb, autojunk=False).get_opcodes()
             if tag == "equal" for i, j in zip(range(i1, i2), range(j1, j2))]
    copies = [(e["ts"], e["ts"] + e["dur"]) for e in cc if e.get("tid") != COMPUTE_STREAM and e["cat"] == "gpu_memcpy"]
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in cc if e.get("tid") != COMPUTE_STREAM and e["cat"] == "kernel"]
    t0 = b[0]["ts"]
    rows = []
    for i, j in pairs:
        if not is_gemm(na[i]):
            continue
        ea, eb = a[i], b[j]
        s = eb["ts"]
        rows.append(((s - t0) / 1e3, eb["dur"] / ea["dur"], overlap(s - 2000, s, copies) / 2000,
                     overlap(s, s + eb["dur"], copies) / eb["dur"], ea["dur"], eb["dur"],
                     overlap(s, s + eb["dur"], kernels) / eb["dur"]))
    print(f"compute kernels: no_comm {len(a)}, conccl {len(b)}, aligned {len(pairs)}; GEMMs and attention aligned: {len(rows)}")
    print(f"their time: no_comm {sum(r[4] for r in rows) / 1e3:.1f} ms, conccl {sum(r[5] for r in rows) / 1e3:.1f} ms")
    print("\nms into the iteration | GEMMs | median conccl / no_comm | copies in the 2 ms before | copies during")
    for lo in range(0, 240, 20):
        sel = [r for r in rows if lo <= r[0] < lo + 20]
        if sel:
            print(f"{lo:3d}-{lo + 20:3d} | {len(sel):3d} | {statistics.median(r[1] for r in sel):.3f} | "
                  f"{statistics.mean(r[2] for r in sel):.2f} | {statistics.mean(r[3] for r in sel):.2f}")
    print("\nby what ran beside the GEMM on other streams: GEMMs, median conccl / no_comm")
    groups = (("no copy during it", lambda r: r[3] == 0), ("copies during it", lambda r: r[3] > 0),
              ("neither a copy nor another stream's kernel", lambda r: r[3] == 0 and r[6] == 0),
              ("another stream's kernel during it", lambda r: r[6] > 0))
    for name, keep in groups:
        sel = [r for r in rows if keep(r)]
        if sel:
            print(f"{name}: {len(sel)}, {statistics.median(r[1] for r in sel):.3f}")
    names = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for i, j in pairs:
        if is_gemm(na[i]):
            g = names[na[i]]
            g[0] += a[i]["dur"]
            g[1] += b[j]["dur"]
            g[2] += 1
    print("\nper kernel: calls, no_comm ms, conccl ms, ratio")
    for name, (x, y, k) in sorted(names.items(), key=lambda kv: -kv[1][0]):
        print(f"{k:3d} {x / 1e3:7.2f} {y / 1e3:7.2f} {y / x:.3f} {name[-80:]}")


if __name__ == "__main__":
    main()
