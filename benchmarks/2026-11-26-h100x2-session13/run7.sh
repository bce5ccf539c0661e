#!/usr/bin/env bash
# Session 13, run7 (2 x H100): nothing lost elsewhere: the 8 default GEMM+reduce-scatter shapes,
# eager, ranks aligned (--align), `direct` and `auto`, base (_base/, as run6) against new, two turns.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session13/run7.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run7; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
for turn in 1 2; do
  for v in base new; do
    src=src; [ $v = base ] && src=_base/src
    PYTHONPATH=$src timeout 240 python3 -m conccl bench tp --out $R/${v}_$turn --ops gemm_rs --impls gemm_only,conccl,conccl_auto \
        --schedules direct --runs 20 --align --machine-kind nvidia-h100-x2 > $R/${v}_$turn.log 2>&1
    echo "${v}_$turn exit $? at $((SECONDS-t0)) s"
  done
done
cd $OUT && tar czf run7.tgz run7 && rm -rf run7
