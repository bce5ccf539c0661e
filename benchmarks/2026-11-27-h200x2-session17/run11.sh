#!/usr/bin/env bash
# Session 17, run11: `conccl bench fsdp --clocks` (650ef5f) on the GPUs: mixed precision at 8192
# tokens, no_comm and conccl_direct_prefetch in one invocation, then the two again in the other
# order; each rank's SM clock while power-capped in fsdp.md.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h200x2-session17/run11.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
: "${CONCCL_COMMIT:?pass the commit that runs}"
OUT=${OUT:?}; R=$OUT/run11; mkdir -p $R; t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
k=0
for order in no_comm,conccl_direct_prefetch conccl_direct_prefetch,no_comm; do
  k=$((k+1))
  PYTHONPATH=src timeout 150 python3 -m conccl bench fsdp --out $R/turn$k --configs $order --tokens 8192 \
      --mixed-precision --train-steps 12 --warmup 3 --no-deterministic-loss --no-profile --lr 0 --clocks \
      --machine-kind nvidia-h100-x2 > $R/turn$k.log 2>&1
  echo "turn $k exit $? at $((SECONDS-t0)) s"
  grep '^| 8192' $R/turn$k/fsdp.md | cut -d'|' -f3,4,7,8; grep -o "SM clock[^;]*" $R/turn$k/fsdp.md
done
cd $OUT && tar czf run11.tgz run11 && rm -rf run11
