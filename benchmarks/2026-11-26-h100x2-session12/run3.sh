#!/usr/bin/env bash
# Issue 39 push pipeline, third run (H100 x2 if served): the all-gather+GEMM op bench (the
# H100's pipelines table gains push), the decode shape captured in a CUDA graph (push's own step
# waits for no staging; issue 38's decode goal), the MLP block with auto, direct and push,
# and the GPU TP tests.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session12/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt 2>&1
cat $R/gpus.txt
for k in 1 2; do
  PYTHONPATH=src timeout 120 python3 -m conccl bench tp --out $R/ops$k --ops ag_gemm \
      --impls gemm_only,torch_async_tp,conccl,conccl_auto --machine-kind $CONCCL_MACHINE_KIND > $R/ops$k.log 2>&1
  echo "ops$k exit $? at $((SECONDS-t0)) s"
done
PYTHONPATH=src timeout 150 python3 -m conccl bench tp --out $R/graph --graph --ops ag_gemm --shapes 1024x8192x7168,8192x8192x7168 \
    --schedules direct,push,push-s2 --impls gemm_only,torch_async_tp,conccl --machine-kind $CONCCL_MACHINE_KIND > $R/graph.log 2>&1
echo "graph exit $? at $((SECONDS-t0)) s"; grep "ag_gemm" $R/graph/tp.md | cut -d'|' -f3-8
PYTHONPATH=src timeout 150 python3 -m conccl bench tp --out $R/block --block --schedules auto,direct,push \
    --machine-kind $CONCCL_MACHINE_KIND > $R/block.log 2>&1
echo "block exit $? at $((SECONDS-t0)) s"; grep "conccl\|async" $R/block/block.md | cut -d'|' -f3-7
PYTHONPATH=src timeout $((580 - (SECONDS - t0))) python3 -m pytest -q tests/gpu/test_gpu_tp.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -12
tar -C $OUT -czf $OUT/run3.tgz r
