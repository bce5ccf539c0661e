#!/usr/bin/env bash
# Sixth run: re-addressed programs. Their GPU test, the rig at world 2 (its fsdp part checks the
# last step compiles nothing), bench moe and the host profile with a new routing every call,
# then the whole GPU tier.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt 2>&1
PYTHONPATH=src timeout 60 python3 -m pytest -q tests/gpu/test_gpu_readdress.py > $OUT/readdress.log 2>&1
echo "readdress test exit $? at $((SECONDS-t0)) s"; tail -2 $OUT/readdress.log
CUDA_VISIBLE_DEVICES=0 CONCCL_RIG_JSON=$OUT/rig PYTHONPATH=src timeout 100 python3 -m pytest -q tests/rig -k w2 > $OUT/rig_w2.log 2>&1
echo "rig w2 exit $? at $((SECONDS-t0)) s"; tail -2 $OUT/rig_w2.log
PYTHONPATH=src timeout 120 python3 -m conccl bench moe --out $OUT/moe --runs 6 --train-steps 0 > $OUT/moe.log 2>&1
echo "bench moe exit $? at $((SECONDS-t0)) s"; tail -14 $OUT/moe.log
PYTHONPATH=src timeout 60 python3 scripts/ep_profile.py > $OUT/ep_profile.txt 2>&1
echo "ep_profile exit $? at $((SECONDS-t0)) s"; grep "^==" $OUT/ep_profile.txt
PYTHONPATH=src timeout 270 python3 -m pytest -q tests/gpu > $OUT/gpu_tier.log 2>&1
echo "whole GPU tier exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/gpu_tier.log
