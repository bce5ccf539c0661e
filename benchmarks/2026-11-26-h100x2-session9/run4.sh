#!/usr/bin/env bash
# The whole GPU tier at the session's last code commit (one pass by default, spin waits in
# graphs), and what it took.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session9/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run4; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 510 python3 -m pytest -q -rs tests/gpu > $R/gpu_tier.log 2>&1
echo "gpu tier exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_tier.log; grep "^FAILED\|^E " $R/gpu_tier.log | head -12
