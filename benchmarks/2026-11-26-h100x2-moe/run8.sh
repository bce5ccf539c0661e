#!/usr/bin/env bash
# Eighth run (2026-11-26, second session): run7 (never run) plus the rig at world 3. After the review: re-addressed
# programs built from a template, the tp layers through named groups and compiled with inductor,
# conccl.ep's combine backward without syncs and moe_layer. GPU tests, the rig's fsdp / ep /
# tp_layers parts at world 2, bench moe with the layer timing and training.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run8.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 190 python3 -m pytest -q tests/gpu/test_gpu_readdress.py tests/gpu/test_gpu_ep.py tests/gpu/test_moe_route_kernel.py tests/gpu/test_gather_sum_kernel.py tests/gpu/test_gpu_tp_compile.py "tests/gpu/test_gpu_tp.py::test_parallel_layers_match_the_unsharded_block_within_bf16_rounding" > $OUT/gpu.log 2>&1
echo "gpu tests exit $? at $((SECONDS-t0)) s"; tail -2 $OUT/gpu.log
CUDA_VISIBLE_DEVICES=0 CONCCL_RIG_JSON=$OUT/rig PYTHONPATH=src timeout 170 python3 -m pytest -q tests/rig -k "fsdp-w2 or ep-w2 or tp_layers-w2 or ep-w3 or tp_layers-w3" > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -2 $OUT/rig.log
PYTHONPATH=src timeout 225 python3 -m conccl bench moe --out $OUT/moe --runs 8 > $OUT/moe.log 2>&1
echo "bench moe exit $? at $((SECONDS-t0)) s"; tail -30 $OUT/moe.log
