#!/usr/bin/env bash
# Fifth run, the session's last device time: the GPU tests after the review's fixes (a cast
# home's next cast waits for the last gather's reads; the widening test's guard and AVG bits),
# then bench fsdp with the whole iteration timed (forward, backward, optimizer step, zero_grad),
# bf16 at 2048 and 8192, then mixed precision at 8192 in what time is left.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-session3/run5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 75 python3 -m pytest -q tests/gpu/test_gpu_reduce_scatter.py tests/gpu/test_gpu_fsdp.py -k "widening or mixed" > $OUT/gpu.log 2>&1
echo "gpu tests exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/gpu.log; grep "FAILED\|^E " $OUT/gpu.log | head
PYTHONPATH=src timeout 140 python3 -m conccl bench fsdp --out $OUT/iter --configs no_comm,stock,conccl_direct \
    --train-steps 10 --warmup 3 --no-profile --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > /dev/null 2>&1
echo "bench iter exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/iter/fsdp.md | cut -d'|' -f2-12
PYTHONPATH=src timeout $((265 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/iter_mp --configs no_comm,stock,conccl_direct \
    --tokens 8192 --mixed-precision --train-steps 10 --warmup 3 --no-profile --no-deterministic-loss \
    --machine-kind $CONCCL_MACHINE_KIND > /dev/null 2>&1
echo "bench iter mp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/iter_mp/fsdp.md | cut -d'|' -f2-12
