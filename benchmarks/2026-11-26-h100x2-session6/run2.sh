#!/usr/bin/env bash
# Where the mixed-precision 8192-token iteration's exposed copies are: bench fsdp with rank 0's
# profiled iteration kept as a trace (no_comm, conccl_direct, conccl_direct_prefetch), then the
# casts' A/B: conccl_direct with the shards cast at every gather (--cast-every-gather).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session6/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
mkdir -p $OUT/r
t0=$SECONDS
PYTHONPATH=src timeout 250 python3 -m conccl bench fsdp --out $OUT/r/mp8192 --trace-dir $OUT/r/traces \
    --configs no_comm,conccl_direct,conccl_direct_prefetch,conccl_direct --tokens 8192 --mixed-precision \
    --train-steps 12 --warmup 3 --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > $OUT/r/mp8192.log 2>&1
echo "bench mp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/r/mp8192/fsdp.md | cut -d'|' -f2-10; grep "^From first" $OUT/r/mp8192/fsdp.md
PYTHONPATH=src timeout $((540 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/r/mp8192_recast \
    --configs no_comm,conccl_direct --tokens 8192 --mixed-precision --cast-every-gather \
    --train-steps 12 --warmup 3 --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > $OUT/r/mp8192_recast.log 2>&1
echo "bench recast exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/r/mp8192_recast/fsdp.md | cut -d'|' -f2-10; grep "^From first" $OUT/r/mp8192_recast/fsdp.md
ls -la $OUT/r/traces
tar -C $OUT -czf $OUT/run2.tgz r
