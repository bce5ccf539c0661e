#!/usr/bin/env bash
# Fourth run: the whole GPU tier, the README's test command as written, and the rig at world 2
# (every default part, ep included).
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 330 python3 -m pytest -q tests/gpu > $OUT/gpu_tier.log 2>&1
echo "whole GPU tier exit $? at $((SECONDS-t0)) s"; tail -4 $OUT/gpu_tier.log
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 200 python3 -m pytest -q tests/rig -k w2 > $OUT/rig_w2.log 2>&1
echo "rig w2 exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/rig_w2.log
