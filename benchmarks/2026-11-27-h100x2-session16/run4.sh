#!/usr/bin/env bash
# Session 16, run4: the whole GPU tier (`pytest tests/gpu`, every file), as far as one call's
# limit allows, verbose so that a cut-off run still says what passed.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session16/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run4; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout ${TIER_S:-500} python3 -m pytest -v -rf -p no:cacheprovider tests/gpu > $R/gpu_tier.log 2>&1
echo "gpu tier exit $? at $((SECONDS-t0)) s"; tail -2 $R/gpu_tier.log
grep -c " PASSED" $R/gpu_tier.log; grep " FAILED\| ERROR" $R/gpu_tier.log | head -10
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
