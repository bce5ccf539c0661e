#!/usr/bin/env bash
# Every collective's completion beside running GEMMs again, the ranks' hosts now meeting on a
# gloo group right before the call (run1's figures include a peer host's lag), twice; then the
# whole GPU tier (the lowering's new batch split touches every batched schedule).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session10/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run2; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
for turn in 1 2; do
  PYTHONPATH=src timeout 150 python3 -m conccl bench graphs --modes beside --sizes 64K,1M,16M \
    --impls nccl,conccl,conccl_symm_push,conccl_symm_push_in_place,conccl_symm_push_via_peer --runs 7 \
    --out $R/beside$turn > $R/beside$turn.log 2>&1
  echo "beside$turn exit $? at $((SECONDS-t0)) s"
done
PYTHONPATH=src timeout 450 python3 -m pytest -q tests/gpu > $R/gpu_tier.log 2>&1
echo "gpu tier exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_tier.log; grep "^FAILED\|^ERROR" $R/gpu_tier.log | head -8
