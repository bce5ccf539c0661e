#!/usr/bin/env bash
# Session 15, run6: the one-GPU characterization of 4096x8192x8192 measured again (the shipped H100
# table's whole-GEMM entry, 0.685 ms, against 0.612 ms for the same GEMM in every two-GPU bench).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session15/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run6; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
for turn in 1 2; do
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 200 python3 -m conccl study tp --out $R/study_$turn \
      --shapes 4096x8192x8192,8192x8192x7168 --runs 30 --machine-kind nvidia-h100-x1 > $R/study_$turn.log 2>&1
  echo "study turn $turn exit $? at $((SECONDS-t0)) s"; tail -2 $R/study_$turn.log
done
cd $OUT && tar czf run6.tgz run6 && rm -rf run6
