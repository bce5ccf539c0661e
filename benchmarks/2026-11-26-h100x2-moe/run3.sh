#!/usr/bin/env bash
# Issue 41, third run: the routing kernel; conccl.ep's GPU tests, conccl bench moe, the host
# profile (scripts/ep_profile.py), the rig's ep part.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt 2>&1
PYTHONPATH=src timeout 150 python3 -m pytest -q tests/gpu/test_moe_route_kernel.py tests/gpu/test_gpu_ep.py tests/gpu/test_gather_sum_kernel.py > $OUT/gpu_ep.log 2>&1
echo "gpu ep tests exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/gpu_ep.log
PYTHONPATH=src timeout 300 python3 -m conccl bench moe --out $OUT/moe --runs 8 > $OUT/moe.log 2>&1
echo "bench moe exit $? at $((SECONDS-t0)) s"; tail -22 $OUT/moe.log
PYTHONPATH=src timeout 100 python3 scripts/ep_profile.py > $OUT/ep_profile.txt 2>&1
echo "ep_profile exit $? at $((SECONDS-t0)) s"; grep "^==" $OUT/ep_profile.txt
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 120 python3 -m pytest -q tests/rig -k ep > $OUT/rig_ep.log 2>&1
echo "rig ep exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/rig_ep.log
