#!/usr/bin/env bash
# Twelfth run (2026-11-26, second session), issue 40 after the pooled unsharded parameters
# (fsdp_direct.reuse): the rig's fsdp part at world 2, the GPU tier's FSDP tests, then bench fsdp
# (no_comm, stock, conccl_direct at 2048 and 8192 tokens, the loss under deterministic algorithms).
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run12.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
CUDA_VISIBLE_DEVICES=0 CONCCL_RIG_JSON=$OUT/rig PYTHONPATH=src timeout 100 python3 -m pytest -q tests/rig -k "fsdp-w2" > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -2 $OUT/rig.log
PYTHONPATH=src timeout 150 python3 -m pytest -q tests/gpu/test_gpu_fsdp.py > $OUT/gpu_fsdp.log 2>&1
echo "gpu fsdp tests exit $? at $((SECONDS-t0)) s"; tail -2 $OUT/gpu_fsdp.log
PYTHONPATH=src timeout $((580 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/fsdp --configs no_comm,stock,conccl_direct \
    --train-steps 12 --warmup 3 --no-profile --machine-kind $CONCCL_MACHINE_KIND > $OUT/fsdp.log 2>&1
echo "bench fsdp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]\|segments" $OUT/fsdp/fsdp.md | cut -c1-600
