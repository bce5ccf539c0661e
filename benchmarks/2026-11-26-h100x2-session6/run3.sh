#!/usr/bin/env bash
# bench fsdp with every block but the last resharded after forward (torchtitan's wrapping, every
# sharded config alike) and the profiled iteration after an unprofiled one: mixed precision at
# 8192 tokens (profiled, traces kept), bf16 at 2048 and 8192; then the loss after 20 AdamW
# steps under deterministic algorithms, stock against conccl_direct_prefetch, mixed precision.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session6/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
mkdir -p $OUT/r
t0=$SECONDS
PYTHONPATH=src timeout 200 python3 -m conccl bench fsdp --out $OUT/r/mp8192 --trace-dir $OUT/r/traces \
    --configs no_comm,stock,conccl_direct,conccl_direct_prefetch --tokens 8192 --mixed-precision \
    --train-steps 12 --warmup 3 --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > $OUT/r/mp8192.log 2>&1
echo "bench mp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/r/mp8192/fsdp.md | cut -d'|' -f2-10; grep "^From first" $OUT/r/mp8192/fsdp.md | cut -c1-400
PYTHONPATH=src timeout 220 python3 -m conccl bench fsdp --out $OUT/r/bf16 --no-profile \
    --configs no_comm,stock,conccl_direct,conccl_direct_prefetch --tokens 2048,8192 \
    --train-steps 12 --warmup 3 --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > $OUT/r/bf16.log 2>&1
echo "bench bf16 exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/r/bf16/fsdp.md | cut -d'|' -f2-13
PYTHONPATH=src timeout $((560 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/r/loss20 --no-profile \
    --configs stock,conccl_direct_prefetch --tokens 2048 --mixed-precision --train-steps 20 --warmup 3 \
    --machine-kind $CONCCL_MACHINE_KIND > $OUT/r/loss20.log 2>&1
echo "bench loss20 exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/r/loss20/fsdp.md | cut -d'|' -f2,3,14
tar -C $OUT -czf $OUT/run3.tgz r
