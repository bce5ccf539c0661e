#!/usr/bin/env bash
# 1. Issue 39: the op bench, both ops, `auto` from the H100 table with run5 folded in (its
#    GEMM+reduce-scatter too); 2. issue 40: FSDP2 mixed precision at 8192 tokens once more
#    (no code of it changed this session: one more run for "<= 1.04x in every run").
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session12/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt 2>&1
cat $R/gpus.txt
PYTHONPATH=src timeout 150 python3 -m conccl bench tp --out $R/ops --impls gemm_only,torch_async_tp,conccl,conccl_auto \
    --machine-kind $CONCCL_MACHINE_KIND > $R/ops.log 2>&1
echo "ops exit $? at $((SECONDS-t0)) s"
PYTHONPATH=src timeout $((560 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $R/mp8192 \
    --configs no_comm,stock,conccl_direct,conccl_direct_prefetch --tokens 8192 --mixed-precision \
    --train-steps 10 --warmup 3 --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > $R/mp8192.log 2>&1
echo "fsdp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $R/mp8192/fsdp.md | cut -d'|' -f2-10
tar -C $OUT -czf $OUT/run6.tgz r
