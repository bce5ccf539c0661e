#!/usr/bin/env bash
# The README's main job as written, on 2 x H100: conccl study --out study (the whole default suite).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session6/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}
mkdir -p $OUT/r
t0=$SECONDS
PYTHONPATH=src timeout 480 python3 -m conccl study --out $OUT/r/study > $OUT/r/study.log 2>&1
echo "study exit $? at $((SECONDS-t0)) s"; tail -4 $OUT/r/study.log
rm -rf $OUT/r/study/figures
tar -C $OUT -czf $OUT/run6.tgz r
