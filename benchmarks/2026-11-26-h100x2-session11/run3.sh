#!/usr/bin/env bash
# After the review: the eager path's and the collectives' GPU tests; the shared-GPU rig's eager
# part (now with a routed all-reduce on one stream, then a copy-engine all-gather on another
# reading its result) at worlds 2 and 3.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session11/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run3; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 200 python3 -m pytest -q -s tests/gpu/test_gpu_eager_path.py tests/gpu/test_cuda_collectives.py \
  > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -8
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout $((480 - (SECONDS - t0))) python3 -m pytest -q tests/rig \
  -k "eager-w2 or eager-w3" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep "routed\|^FAILED\|^E " $R/rig.log | head -12
tar -C $OUT -czf $OUT/run3.tgz run3
