#!/usr/bin/env bash
# Issue 39: the push all-gather+GEMM pipeline (schedules push, push-s2: shards pushed from the
# plain inputs into the peers' workspace, no staging copy).
# 1. GPU tests: tests/gpu/test_gpu_tp.py (every schedule against serial NCCL, the push test:
#    double-buffered and whole-workspace shards, what runs: GEMM kernels and PtoP copies only;
#    captured pipelines with push);
# 2. conccl bench tp, all-gather+GEMM, the 8 default shapes, every default schedule (push among
#    them), async-TP and auto, in turns.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session12/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt 2>&1
PYTHONPATH=src timeout 240 python3 -m pytest -q tests/gpu/test_gpu_tp.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -12
PYTHONPATH=src timeout $((585 - (SECONDS - t0))) python3 -m conccl bench tp --out $R/ops --ops ag_gemm \
    --impls gemm_only,torch_async_tp,conccl,conccl_auto --machine-kind $CONCCL_MACHINE_KIND > $R/ops.log 2>&1
echo "ops exit $? at $((SECONDS-t0)) s"; tail -3 $R/ops.log
tar -C $OUT -czf $OUT/run1.tgz r
