#!/usr/bin/env bash
# Second run: FSDP2's mixed precision on the direct path (cast homes, the widening reduction):
# its GPU tests and the rig's fsdp part (now with mixed precision) at worlds 2 and 3, then
# bench fsdp --mixed-precision (fp32 parameters, bf16 compute, fp32 reduce) at 2048 and 8192.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-session3/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 150 python3 -m pytest -v -s tests/gpu/test_gpu_reduce_scatter.py tests/gpu/test_gpu_fsdp.py > $OUT/gpu.log 2>&1
echo "gpu tests exit $? at $((SECONDS-t0)) s"; grep -c PASSED $OUT/gpu.log; grep "FAILED\|ERROR\|^E " $OUT/gpu.log | head -20; tail -1 $OUT/gpu.log
CUDA_VISIBLE_DEVICES=0 CONCCL_RIG_JSON=$OUT/rig PYTHONPATH=src timeout 100 python3 -m pytest -q tests/rig -k "fsdp-w2 or fsdp-w3" > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -2 $OUT/rig.log; grep -i "fail" $OUT/rig.log | head -10
PYTHONPATH=src timeout $((585 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/fsdp_mp --configs no_comm,stock,conccl_direct \
    --mixed-precision --train-steps 10 --warmup 3 --no-profile --machine-kind $CONCCL_MACHINE_KIND > $OUT/fsdp_mp.log 2>&1
echo "bench fsdp mp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/fsdp_mp/fsdp.md; grep "conccl_direct, " $OUT/fsdp_mp/fsdp.md | cut -c1-600
tail -5 $OUT/fsdp_mp.log
