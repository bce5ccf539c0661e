#!/usr/bin/env bash
# Ninth run (2026-11-26, second session): conccl.ep's fixed sizes in a CUDA graph (GPU test, the
# rig's ep part at worlds 2 and 3), the tp compile test after its fix, the ep kernels' tests,
# then bench moe with the conccl_graph implementation.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run9.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 200 python3 -m pytest -q tests/gpu/test_gpu_ep_graph.py tests/gpu/test_gpu_ep.py tests/gpu/test_moe_route_kernel.py tests/gpu/test_gpu_tp_compile.py > $OUT/gpu.log 2>&1
echo "gpu tests exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/gpu.log
CUDA_VISIBLE_DEVICES=0 CONCCL_RIG_JSON=$OUT/rig PYTHONPATH=src timeout 150 python3 -m pytest -q tests/rig -k "ep-w2 or ep-w3" > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -2 $OUT/rig.log
PYTHONPATH=src timeout 200 python3 -m conccl bench moe --out $OUT/moe --runs 8 > $OUT/moe.log 2>&1
echo "bench moe exit $? at $((SECONDS-t0)) s"; tail -32 $OUT/moe.log
