#!/usr/bin/env bash
# How this folder's files were made (nvidia-h200-x2, from the repository root, PYTHONPATH=src):
# reduce-scatter alone, the GPU tests of reduce-scatter and FSDP, `conccl bench` of
# reduce-scatter (nccl-tests columns, GEMM beside it) and `conccl bench fsdp`. OUT: where to write.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/src CONCCL_MACHINE_KIND=nvidia-h200-x2
OUT=${OUT:?}
timeout 90 python3 scripts/reduce_kernel.py > $OUT/reduce_kernel.log 2>&1; grep -v scalar $OUT/reduce_kernel.log | tail -5
timeout 90 python3 scripts/rs_speed.py > $OUT/rs_speed.log 2>&1; grep -E "MiB" $OUT/rs_speed.log
timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_fsdp.py tests/gpu/test_gpu_reduce_scatter.py \
  > $OUT/gpu_tests.log 2>&1; grep -E "passed|failed" $OUT/gpu_tests.log | tail -2
timeout 150 python3 -m conccl bench -b 64M -e 1G --collective reduce_scatter --impl conccl,conccl_symm_push,nccl \
  --json $OUT/bench_rs.json --markdown $OUT/bench_rs.md > $OUT/bench_rs.log 2>&1; tail -3 $OUT/bench_rs.log
timeout 300 python3 -m conccl bench fsdp --out $OUT > $OUT/bench_fsdp.log 2>&1; grep "^|" $OUT/bench_fsdp.log | head -9
