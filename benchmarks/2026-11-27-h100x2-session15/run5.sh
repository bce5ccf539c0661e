#!/usr/bin/env bash
# Session 15, run5: issue 39's op bench on the 8 default shapes of each op, ranks aligned, with
# settled pipelines' mark edges: `auto` against every schedule, async-TP and the GEMM alone
# (evaluate here with `conccl plan tp --evaluate run5/ops/tp.json --markdown ...`).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session15/run5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run5; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 420 python3 -m conccl bench tp --out $R/ops --impls gemm_only,torch_async_tp,conccl,conccl_auto \
    --align --machine-kind nvidia-h100-x2 > $R/ops.log 2>&1
echo "ops exit $? at $((SECONDS-t0)) s"; grep '^| \(gemm_rs\|ag_gemm\)' $R/ops/tp.md | grep "auto\|async" | cut -d'|' -f2-9
cd $OUT && tar czf run5.tgz run5 && rm -rf run5
