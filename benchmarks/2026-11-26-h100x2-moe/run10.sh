#!/usr/bin/env bash
# Tenth run (2026-11-26, second session): bench moe with the layer's fixed-size variants (no host
# sync: the host queues the whole layer), then bench fsdp (issue 40: programs compiled and
# re-addressed during the timed steps, the driver's memory count beside the allocator's).
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run10.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 100 python3 -m conccl bench moe --out $OUT/moe --runs 8 > $OUT/moe.log 2>&1
echo "bench moe exit $? at $((SECONDS-t0)) s"; grep -A10 "^| layer" $OUT/moe.log
PYTHONPATH=src timeout $((575 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/fsdp --configs no_comm,stock,conccl_direct \
    --train-steps 12 --warmup 3 --machine-kind $CONCCL_MACHINE_KIND > $OUT/fsdp.log 2>&1
echo "bench fsdp exit $? at $((SECONDS-t0)) s"; grep "^|\|programs" $OUT/fsdp/fsdp.md | head -16
