#!/usr/bin/env bash
# Settled calls post their row and go on without waiting for the peers' (Options.post_settled,
# HostBoard.post): the rig (ranks sharing one GPU) eager and fsdp parts, FSDP2's GPU tests, and
# bench fsdp at 2048 tokens with the host profile and the board's post count. Short: the
# session's device time is nearly spent.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-session4/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 90 python3 -m pytest -q tests/rig -k "eager-w2 or fsdp-w2 or eager-w3" \
    > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/rig.log; grep -i "failed" $OUT/rig.log | head -5
PYTHONPATH=src timeout 60 python3 -m pytest -q tests/gpu/test_gpu_fsdp.py > $OUT/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/gpu.log; grep "FAILED\|ERROR" $OUT/gpu.log | head
PYTHONPATH=src timeout $((235 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/bf16 --configs stock,conccl_direct \
    --tokens 2048 --train-steps 10 --warmup 3 --no-profile --no-deterministic-loss --host-profile \
    --machine-kind $CONCCL_MACHINE_KIND > $OUT/bf16.log 2>&1
echo "bf16 exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/bf16/fsdp.md | cut -d'|' -f2-6; grep -o "[0-9]* of its [0-9]* calls" $OUT/bf16/fsdp.md
rm -f $OUT/bf16.log
