#!/usr/bin/env bash
# After the pooled free's change (one event per freeing stream, recorded again; no Stream
# object): the direct path's GPU tests, the rig's fsdp part at worlds 2 and 3, and the host
# profile at 2048 tokens (bf16 and mixed precision) with Python's garbage collections counted.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-session4/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 150 python3 -m pytest -q tests/gpu/test_gpu_fsdp.py > $OUT/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/gpu.log; grep "FAILED\|ERROR" $OUT/gpu.log | head
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 120 python3 -m pytest -q tests/rig -k "fsdp-w2 or fsdp-w3" > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/rig.log; grep -i "failed" $OUT/rig.log | head -5
PYTHONPATH=src timeout 110 python3 -m conccl bench fsdp --out $OUT/bf16 --configs stock,conccl_direct --tokens 2048 \
    --train-steps 10 --warmup 3 --no-profile --no-deterministic-loss --host-profile \
    --machine-kind $CONCCL_MACHINE_KIND > $OUT/bf16.log 2>&1
echo "bf16 exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/bf16/fsdp.md | cut -d'|' -f2-6; grep "garbage" $OUT/bf16/fsdp.md
PYTHONPATH=src timeout $((580 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/mp --configs stock,conccl_direct \
    --tokens 2048 --mixed-precision --train-steps 10 --warmup 3 --no-profile --no-deterministic-loss --host-profile \
    --machine-kind $CONCCL_MACHINE_KIND > $OUT/mp.log 2>&1
echo "mp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/mp/fsdp.md | cut -d'|' -f2-6; grep "garbage" $OUT/mp/fsdp.md
rm -f $OUT/bf16.log $OUT/mp.log
