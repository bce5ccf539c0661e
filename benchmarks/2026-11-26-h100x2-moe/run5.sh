#!/usr/bin/env bash
# Fifth run: rows with their slots and weights in one call, the expansion kernel; a new routing
# every call in bench moe and in the host profile.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt 2>&1
PYTHONPATH=src timeout 120 python3 -m pytest -q tests/gpu/test_moe_route_kernel.py tests/gpu/test_gpu_ep.py > $OUT/gpu_ep.log 2>&1
echo "gpu ep tests exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/gpu_ep.log
PYTHONPATH=src timeout 240 python3 -m conccl bench moe --out $OUT/moe --runs 8 > $OUT/moe.log 2>&1
echo "bench moe exit $? at $((SECONDS-t0)) s"; tail -22 $OUT/moe.log
PYTHONPATH=src timeout 80 python3 scripts/ep_profile.py > $OUT/ep_profile.txt 2>&1
echo "ep_profile exit $? at $((SECONDS-t0)) s"; grep "^==" $OUT/ep_profile.txt
