#!/usr/bin/env bash
# Issue 40: the GPU tests of conccl.fsdp (with the new one: mixed precision, checkpointing or
# inductor-compiled blocks, clipping, step_and_prefetch, 20 AdamW steps against stock), the
# rig's fsdp part at worlds 2 and 3 (step_and_prefetch, casts read in backward), then bench fsdp
# under mixed precision at 8192 tokens with the prefetching config beside the others, profiled.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session6/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
mkdir -p $OUT/r
t0=$SECONDS
PYTHONPATH=src timeout 240 python3 -m pytest -q -s tests/gpu/test_gpu_fsdp.py > $OUT/r/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/r/gpu.log; grep "FAILED\|^E " $OUT/r/gpu.log | head -8
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 100 python3 -m pytest -q tests/rig -k "fsdp-w2 or fsdp-w3" > $OUT/r/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/r/rig.log; grep -i "failed\|false" $OUT/r/rig.log | head -5
PYTHONPATH=src timeout $((570 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/r/mp8192 \
    --configs no_comm,stock,conccl_direct,conccl_direct_prefetch --tokens 8192 --mixed-precision \
    --train-steps 10 --warmup 3 --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > $OUT/r/mp8192.log 2>&1
echo "bench mp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/r/mp8192/fsdp.md | cut -d'|' -f2-10; grep "^From first" $OUT/r/mp8192/fsdp.md
tar -C $OUT -czf $OUT/run1.tgz r
