#!/usr/bin/env bash
# Session 17, run7: is FSDP2 mixed precision's last gap (issue 40) the SM clock? power_probe.py
# (GEMM chains with and without copy-engine pulls beside them, no FSDP), then the two configs at
# --lr 0 in alternating turns with nvidia-smi sampling every 20 ms, clock-event reasons included.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h200x2-session17/run7.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=nvidia-h100-x2
: "${CONCCL_COMMIT:?pass the commit that runs, e.g. CONCCL_COMMIT=$(git rev-parse --short HEAD)}"
OUT=${OUT:?}; R=$OUT/run7; mkdir -p $R/probe10 $R/probe40
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
nvidia-smi -q -d POWER,CLOCK > $R/smi_power_clock.txt 2>&1
D=benchmarks/2026-11-27-h200x2-session17
PYTHONPATH=src timeout 90 python3 $D/power_probe.py --out $R/probe10 --every 10 > $R/probe10.log 2>&1
echo "probe every 10 exit $? at $((SECONDS-t0)) s"
PYTHONPATH=src timeout 90 python3 $D/power_probe.py --out $R/probe40 --every 40 > $R/probe40.log 2>&1
echo "probe every 40 exit $? at $((SECONDS-t0)) s"
for turn in 1 2; do
  order="no_comm conccl_direct_prefetch"; [ $turn = 2 ] && order="conccl_direct_prefetch no_comm"
  for cfg in $order; do
    name=lr0_${cfg}_$turn
    left=$((560 - (SECONDS - t0))); [ $left -lt 45 ] && { echo "$name skipped: $left s left"; continue; }
    [ $left -gt 75 ] && left=75
    nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,clocks_event_reasons.active \
        --format=csv,noheader,nounits -lms 20 > $R/$name.smi.csv 2>/dev/null &
    smi=$!
    PYTHONPATH=src timeout $left python3 -m conccl bench fsdp --out $R/$name --configs $cfg --tokens 8192 \
        --mixed-precision --train-steps 12 --warmup 3 --no-deterministic-loss --no-profile --lr 0 \
        --machine-kind $CONCCL_MACHINE_KIND > $R/$name.log 2>&1
    rc=$?; kill $smi 2>/dev/null; wait $smi 2>/dev/null
    echo "$name exit $rc at $((SECONDS-t0)) s: $(grep '^| 8192' $R/$name/fsdp.md 2>/dev/null | cut -d'|' -f3,4,7)"
  done
done
cd $OUT && tar czf run7.tgz run7 && rm -rf run7
