#!/usr/bin/env bash
# First run of the day's third session (at 1caa87a): bench fsdp with the held gradients (their
# memory never measured: run13's bench ran out of its time), then the GPU tier from where run13's
# time ran out (test_gpu_tp.py onward), then the rig's fsdp and ep parts.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-session3/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 330 python3 -m conccl bench fsdp --out $OUT/fsdp --configs no_comm,stock,conccl_direct \
    --train-steps 10 --warmup 3 --no-profile --machine-kind $CONCCL_MACHINE_KIND > $OUT/fsdp.log 2>&1
echo "bench fsdp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/fsdp/fsdp.md
PYTHONPATH=src timeout 170 python3 -m pytest -v tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_tp_compile.py \
    tests/gpu/test_moe_route_kernel.py tests/gpu/test_oneshot_kernel.py tests/gpu/test_spin_wait.py > $OUT/gpu_rest.log 2>&1
echo "gpu rest exit $? at $((SECONDS-t0)) s"; grep -c PASSED $OUT/gpu_rest.log; grep "FAILED\|ERROR" $OUT/gpu_rest.log | head; tail -1 $OUT/gpu_rest.log
CUDA_VISIBLE_DEVICES=0 CONCCL_RIG_JSON=$OUT/rig PYTHONPATH=src timeout $((585 - (SECONDS - t0))) python3 -m pytest -q tests/rig -k "fsdp-w2 or ep-w2 or ep-w3" > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -2 $OUT/rig.log
