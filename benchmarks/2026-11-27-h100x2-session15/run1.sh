#!/usr/bin/env bash
# Session 15, run1: where a settled eager call's host time goes (host_stages.py), 2 ranks.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session15/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run1; mkdir -p $R
nvidia-smi -L > $R/gpus.txt
OUT=$R PYTHONPATH=src timeout 400 torchrun --nproc-per-node 2 benchmarks/2026-11-27-h100x2-session15/host_stages.py \
    > $R/host_stages.log 2>&1
echo "host_stages exit $?"; grep -v Warning $R/host_stages.log | tail -20
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
