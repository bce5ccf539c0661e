#!/usr/bin/env bash
# Issue 41 (and last session's unchecked GPU paths), first run on nvidia-h100-x2:
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt 2>&1
PYTHONPATH=src timeout 150 python3 -m pytest -q tests/gpu/test_gpu_ep.py tests/gpu/test_gpu_one_shot.py > $OUT/gpu_ep_oneshot.log 2>&1
echo "gpu ep + one-shot tests exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/gpu_ep_oneshot.log
PYTHONPATH=src timeout 240 python3 -m conccl bench moe --out $OUT/moe --runs 8 > $OUT/moe.log 2>&1
echo "bench moe exit $? at $((SECONDS-t0)) s"; cat $OUT/moe.log | tail -16
CUDA_VISIBLE_DEVICES=0 CONCCL_ONE_SHOT_BELOW=1M PYTHONPATH=src timeout 150 python3 -m pytest -q tests/rig -k "w3" > $OUT/rig_w3_one_shot.log 2>&1
echo "rig w3 (one-shot) exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/rig_w3_one_shot.log
