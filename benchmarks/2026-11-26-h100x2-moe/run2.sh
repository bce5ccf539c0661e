#!/usr/bin/env bash
# Issue 41, second run: conccl.ep's GPU tests, conccl bench moe (with the small model's
# training), the rig's ep part at worlds 2-4.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt 2>&1
PYTHONPATH=src timeout 150 python3 -m pytest -q tests/gpu/test_gpu_ep.py tests/gpu/test_gather_sum_kernel.py > $OUT/gpu_ep.log 2>&1
echo "gpu ep tests exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/gpu_ep.log
PYTHONPATH=src timeout 300 python3 -m conccl bench moe --out $OUT/moe --runs 8 > $OUT/moe.log 2>&1
echo "bench moe exit $? at $((SECONDS-t0)) s"; tail -22 $OUT/moe.log
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 120 python3 -m pytest -q tests/rig -k ep > $OUT/rig_ep.log 2>&1
echo "rig ep exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/rig_ep.log
