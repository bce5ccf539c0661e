#!/usr/bin/env bash
# Session 17, run9: stock FSDP2 (NCCL) beside the same two configs, the SM clock sampled: does any
# NVLink collective lower the power-capped clock as conccl's copies do (run7, run8)? --lr 0, one
# turn in the order no_comm, stock, conccl_direct_prefetch, no_comm; nvidia-smi every 20 ms.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h200x2-session17/run9.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=nvidia-h100-x2
: "${CONCCL_COMMIT:?pass the commit that runs, e.g. CONCCL_COMMIT=$(git rev-parse --short HEAD)}"
OUT=${OUT:?}; R=$OUT/run9; mkdir -p $R; k=0
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
for turn in 1; do
  for cfg in no_comm stock conccl_direct_prefetch no_comm; do
    name=lr0_${cfg}_$((++k))
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
cd $OUT && tar czf run9.tgz run9 && rm -rf run9
