#!/usr/bin/env bash
# The own GEMM step waits for the staging only where the staging waits first (shards above
# 64 MiB): run7's decode-size all-gather+GEMM lost ~8% to that wait (1.11x against 1.05x in
# run2). All-gather+GEMM at decode size, a 64 MiB and two 128 MiB shards; the GPU tp tests.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session5/run8.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
PYTHONPATH=src timeout 150 python3 -m conccl bench tp --out $R/ops --ops ag_gemm \
    --shapes 1024x8192x7168,8192x8192x14336,16384x8192x7168,32768x4096x7168 --schedules direct,direct-p2 \
    --impls gemm_only,torch_async_tp,conccl,conccl_auto --machine-kind $CONCCL_MACHINE_KIND > $R/ops.log 2>&1
echo "ops exit $? at $((SECONDS-t0)) s"; grep "^| ag_gemm" $R/ops/tp.md | grep -v gemm_only | cut -d'|' -f3-9
PYTHONPATH=src timeout 120 python3 -m pytest -q tests/gpu/test_gpu_tp.py > $R/gpu_tp.log 2>&1
echo "gpu tp exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_tp.log
tar -C $OUT -czf $OUT/run8.tgz r && rm -rf $R
