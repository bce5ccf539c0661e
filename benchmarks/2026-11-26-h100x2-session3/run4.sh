#!/usr/bin/env bash
# Fourth run: the second shape under mixed precision, the 8192-token direct step's profile
# (run3's was not fetched: too many files), and the GPU tests of the other reducing paths
# after the reduction kernel gained its widening variants. Few files under $OUT (run3 lost some).
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-session3/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 250 python3 -m conccl bench fsdp --out $OUT/shape2_mp --configs no_comm,stock,conccl_direct \
    --dim 5120 --ffn 13824 --heads 40 --layers 6 --mixed-precision --train-steps 10 --warmup 3 --no-profile \
    --machine-kind $CONCCL_MACHINE_KIND > /dev/null 2>&1
echo "shape2 mp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/shape2_mp/fsdp.md
PYTHONPATH=src timeout 100 python3 -m conccl bench fsdp --out $OUT/profile --configs no_comm,conccl_direct \
    --tokens 8192 --train-steps 10 --warmup 3 --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > /dev/null 2>&1
echo "profile exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/profile/fsdp.md | cut -d'|' -f2-6
PYTHONPATH=src timeout $((585 - (SECONDS - t0))) python3 -m pytest -q tests/gpu/test_cuda_collectives.py tests/gpu/test_gpu_all_reduce.py \
    tests/gpu/test_gpu_graphs.py > $OUT/gpu.log 2>&1
echo "gpu tests exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/gpu.log; grep "FAILED\|ERROR" $OUT/gpu.log | head
