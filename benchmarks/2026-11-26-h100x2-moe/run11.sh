#!/usr/bin/env bash
# Eleventh run (2026-11-26, second session), issue 40's memory: where conccl_direct's extra
# reserved memory sits (the caching allocator's segments per stream), stock against
# conccl_direct at 2048 and 8192 tokens, with the allocator's defaults and with expandable segments.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run11.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
for alloc in default expandable; do
  conf=""; [ $alloc = expandable ] && conf="expandable_segments:True"
  PYTORCH_CUDA_ALLOC_CONF=$conf PYTHONPATH=src timeout 280 python3 -m conccl bench fsdp --out $OUT/fsdp_$alloc \
      --configs stock,conccl_direct --tokens 2048,8192 --train-steps 8 --warmup 3 --no-profile --no-deterministic-loss \
      --machine-kind $CONCCL_MACHINE_KIND > $OUT/fsdp_$alloc.log 2>&1
  echo "bench fsdp ($alloc) exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]\|segments" $OUT/fsdp_$alloc/fsdp.md | cut -c1-700
done
