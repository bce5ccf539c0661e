#!/usr/bin/env bash
# Four GPUs (nvidia-h100-x4), after run4: the GPU tests whose checks against NCCL assumed one
# addition (world 2) or rounding-free operands, fixed: at world 4 on GPUs 0-3, then the same
# files' world-2 runs on GPUs 0-1 (the TP and all-reduce tests' operands changed there too).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session8/run5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/r; mkdir -p $R
t0=$SECONDS
F="tests/gpu/test_gpu_all_reduce.py tests/gpu/test_gpu_reduce_scatter.py tests/gpu/test_gpu_tp.py"
PYTHONPATH=src timeout 250 python3 -m pytest -q -s $F tests/gpu/test_gpu_fsdp.py > $R/gpu_w4.log 2>&1
echo "gpu w4 exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_w4.log; grep "^FAILED\|^E " $R/gpu_w4.log | head -12
CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=src timeout 110 python3 -m pytest -q $F > $R/gpu_w2.log 2>&1
echo "gpu w2 exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_w2.log; grep "^FAILED\|^E " $R/gpu_w2.log | head -12
tar -C $OUT -czf $OUT/run5.tgz r
