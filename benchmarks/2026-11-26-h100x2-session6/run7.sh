#!/usr/bin/env bash
# NOT RUN this session (its device time was spent): the review fixes made after run6 on the GPUs.
# step_and_prefetch now gathers on FSDP's all-gather stream (not a stream of its own), installs
# its hooks at the first call, drops a stale gather; a forward's cast is read once in backward.
# The GPU tests of conccl.fsdp, the rig's fsdp part at worlds 2 and 3, then mixed precision at
# 8192 tokens (conccl_direct against conccl_direct_prefetch: the prefetch's memory should now
# match conccl_direct's, its segment on the all-gather stream).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session6/run7.sh
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
PYTHONPATH=src timeout $((560 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/r/mp8192 \
    --configs no_comm,conccl_direct,conccl_direct_prefetch --tokens 8192 --mixed-precision \
    --train-steps 12 --warmup 3 --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > $OUT/r/mp8192.log 2>&1
echo "bench mp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/r/mp8192/fsdp.md | cut -d'|' -f2-13; grep "^From first" $OUT/r/mp8192/fsdp.md | cut -c1-300
tar -C $OUT -czf $OUT/run7.tgz r
