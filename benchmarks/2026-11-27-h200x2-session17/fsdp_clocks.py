"""The SM clock, power and power-cap share of each bench fsdp invocation's nvidia-smi samples
(run6, run7, run9): samples above 300 W per GPU (the timed steps and warm-ups, not the set-up),
and of those the ones the software power cap held (clock-event reason 0x4; run7 and run9 only):
the GEMM-heavy phases, where the clock sets the time.

  python3 fsdp_clocks.py RUNDIR [RUNDIR ...]
"""
import csv
import glob
import os
import statistics as st
import sys


def rows(path):
    out = []
    for r in csv.reader(open(path)):
        try:  # [N/A] and cut lines are skipped
            if len(r) == 6:  # run6: timestamp, index, SM clock, memory clock, power, temperature
                out.append((int(r[1]), float(r[2]), float(r[4]), ""))
            else:  # run7, run9: timestamp, index, SM clock, power, clock-event reasons
                out.append((int(r[1]), float(r[2]), float(r[3]), r[4].strip()))
        except (ValueError, IndexError):
            pass
    return out


print("run | invocation | iteration ms | GPU | busy samples | SM MHz median | mean | power W median | power-capped "
      "| SM MHz median while capped")
for run in sys.argv[1:]:
    for f in sorted(glob.glob(f"{run}/*.smi.csv")):  # by name: the config, then the turn
        name = os.path.basename(f)[:-len(".smi.csv")]
        md = f"{run}/{name}/fsdp.md"
        it = ""
        if os.path.exists(md):
            line = next((ln for ln in open(md) if ln.startswith("| 8192")), "")
            it = line.split("|")[6].strip() if line else ""
        data = rows(f)
        for g in sorted({r[0] for r in data}):
            busy = [r for r in data if r[0] == g and r[2] > 300]
            if not busy:
                continue
            capped = [r for r in busy if r[3] and int(r[3], 16) & 0x4]
            cap = f"{len(capped)}/{len(busy)}" if any(r[3] for r in busy) else "not sampled"
            capped_mhz = f"{st.median(r[1] for r in capped):.0f}" if capped else ""
            print(f"{os.path.basename(run)} | {name} | {it} | {g} | {len(busy)} | {st.median(r[1] for r in busy):.0f} | "
                  f"{st.mean(r[1] for r in busy):.0f} | {st.median(r[2] for r in busy):.0f} | {cap} | {capped_mhz}")
