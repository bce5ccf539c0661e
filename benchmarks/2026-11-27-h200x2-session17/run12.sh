#!/usr/bin/env bash
# Session 17, run12: `bench fsdp --clocks` after a review (sampling now only the timed steps, the
# period measured, nvidia-smi failures tolerated): the default model, mixed precision at 8192,
# one config per invocation as the docs now advise.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h200x2-session17/run12.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
: "${CONCCL_COMMIT:?pass the commit that runs}"
OUT=${OUT:?}; R=$OUT/run12; mkdir -p $R; t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
for cfg in no_comm conccl_direct_prefetch; do
  PYTHONPATH=src timeout 100 python3 -m conccl bench fsdp --out $R/$cfg --configs $cfg --tokens 8192 \
      --mixed-precision --train-steps 12 --warmup 3 --no-deterministic-loss --no-profile --lr 0 --clocks \
      --machine-kind nvidia-h100-x2 > $R/$cfg.log 2>&1
  echo "$cfg exit $? at $((SECONDS-t0)) s"
  grep '^| 8192' $R/$cfg/fsdp.md | cut -d'|' -f3,4,7; grep "SM clock" $R/$cfg/fsdp.md
done
cd $OUT && tar czf run12.tgz run12 && rm -rf run12
