#!/usr/bin/env bash
# Session 16, run6 (written for the next session, not run): is FSDP2 mixed precision's last 4-5%
# (issue 40) the copies' interference, or the GPU's clocks, or the data? trace_gemms.py found the
# GEMMs 1.05x slower than no_comm's with nothing beside them. Each config alone per invocation,
# the order alternating by turn, at the default learning rate and at --lr 0 (same data in every config), with the
# GPUs' SM clock, power and temperature sampled every 100 ms (nvidia-smi).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session16/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=nvidia-h100-x2
OUT=${OUT:?}; R=$OUT/run6; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
for lr in 0 1e-4; do
  for turn in 1 2; do
    order="no_comm conccl_direct_prefetch"; [ $turn = 2 ] && order="conccl_direct_prefetch no_comm"
    for cfg in $order; do
      name=lr${lr}_${cfg}_$turn
      left=$((560 - (SECONDS - t0))); [ $left -lt 45 ] && { echo "$name skipped: $left s left"; continue; }
      [ $left -gt 75 ] && left=75
      nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu \
          --format=csv,noheader,nounits -lms 100 > $R/$name.smi.csv 2>/dev/null &
      smi=$!
      PYTHONPATH=src timeout $left python3 -m conccl bench fsdp --out $R/$name --configs $cfg --tokens 8192 \
          --mixed-precision --train-steps 12 --warmup 3 --no-deterministic-loss --no-profile --lr $lr \
          --machine-kind $CONCCL_MACHINE_KIND > $R/$name.log 2>&1
      rc=$?; kill $smi 2>/dev/null; wait $smi 2>/dev/null
      python3 - $R/$name.smi.csv <<'PY'
import csv, statistics, sys
def num(v):
    try:
        return float(v)
    except ValueError:  # [N/A]
        return None
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) >= 6 and all(num(v) is not None for v in r[2:6])]
busy = [r for r in rows if float(r[4]) > 300]  # the timed steps, not the set-up
if busy:
    print(f"  {len(busy)} busy samples: SM MHz median {statistics.median(float(r[2]) for r in busy):.0f}, "
          f"power W median {statistics.median(float(r[4]) for r in busy):.0f}, max temp {max(float(r[5]) for r in busy):.0f}")
PY
      echo "$name exit $rc at $((SECONDS-t0)) s: $(grep '^| 8192' $R/$name/fsdp.md 2>/dev/null | cut -d'|' -f3,4,7)"
    done
  done
done
cd $OUT && tar czf run6.tgz run6 && rm -rf run6
