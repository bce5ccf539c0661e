#!/usr/bin/env bash
# Session 15, run8: the op bench, two turns, with the H100 pipelines table rebuilt from run7 (ship_pipelines.py):
# `auto` live from it, and the model checked on runs it was not fitted to.

#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session15/run8.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run8; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
for turn in 1 2; do
  PYTHONPATH=src timeout 200 python3 -m conccl bench tp --out $R/ops_$turn --impls gemm_only,torch_async_tp,conccl,conccl_auto \
      --align --machine-kind nvidia-h100-x2 > $R/ops_$turn.log 2>&1
  echo "ops turn $turn exit $? at $((SECONDS-t0)) s"; grep '^| \(gemm_rs\|ag_gemm\)' $R/ops_$turn/tp.md | grep "auto\|async\|gemm_only" | cut -d'|' -f2-8
done
cd $OUT && tar czf run8.tgz run8 && rm -rf run8
