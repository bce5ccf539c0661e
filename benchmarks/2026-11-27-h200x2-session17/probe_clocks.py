"""Joins power_probe.py's modes with its nvidia-smi samples: SM clock, power and clock-event
reasons (0x4: the software power cap) per mode and GPU, beside the GEMMs' median time.

  python3 probe_clocks.py DIR [DIR ...]     (each holding probe.json and probe_smi.csv)
"""
import csv
import datetime as dt
import json
import statistics as st
import sys


def samples(path):
    rows = []
    for r in csv.reader(open(path)):
        try:  # nvidia-smi prints local time; the GPU machines run on UTC, as time.time() is read there. [N/A] and cut lines are skipped
            t = dt.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc)
            rows.append((t.timestamp(), int(r[1]), float(r[2]), float(r[3]), r[4].strip()))
        except (ValueError, IndexError):
            pass
    return rows


for folder in sys.argv[1:]:
    probe = json.load(open(f"{folder}/probe.json"))
    rows = samples(f"{folder}/probe_smi.csv")
    alone = {}
    for x in probe["results"]:
        if x["mode"] == "alone":
            alone.setdefault(x["device"], []).append(x["median_ms"])
    print(f"{folder}: every {probe['args']['every']} GEMMs, {probe['args']['copy_mib']} MiB, {probe['gpu']}")
    print("turn | mode | GPU | GEMM median ms | x alone (mean of turns) | apart from copies x alone | "
          "copy duty | SM MHz median | power W median | power-capped samples")
    for x in probe["results"]:
        d = x["device"]
        sel = [r for r in rows if r[1] == d and x["wall_start"] + 0.2 <= r[0] <= x["wall_end"]]
        base = st.mean(alone[d])
        apart = x.get("apart_median_ms")
        capped = sum(1 for r in sel if int(r[4], 16) & 0x4)
        print(f"{x['turn']} | {x['mode']} | {d} | {x['median_ms']:.4f} | {x['median_ms'] / base:.3f} | "
              f"{apart / base if apart else float('nan'):.3f} | {x.get('copy_duty', 0):.3f} | "
              f"{st.median(r[2] for r in sel) if sel else float('nan'):.0f} | "
              f"{st.median(r[3] for r in sel) if sel else float('nan'):.0f} | {capped}/{len(sel)}")
