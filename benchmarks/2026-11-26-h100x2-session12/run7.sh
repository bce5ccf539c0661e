#!/usr/bin/env bash
# Captured push pipelines now send their FREE behind the last GEMM step on its stream:
# 1. the decode shape and 8192x8192x7168 captured (direct, push, push-s2, async-TP), 40 runs;
# 2. GPU TP tests (captured push among them); 3. the rig's tp parts at worlds 2 and 3.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session12/run7.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt 2>&1
cat $R/gpus.txt
PYTHONPATH=src timeout 150 python3 -m conccl bench tp --out $R/graph --graph --ops ag_gemm --shapes 1024x8192x7168,8192x8192x7168 \
    --schedules direct,push,push-s2 --impls gemm_only,torch_async_tp,conccl --runs 40 --machine-kind $CONCCL_MACHINE_KIND > $R/graph.log 2>&1
echo "graph exit $? at $((SECONDS-t0)) s"; grep "ag_gemm" $R/graph/tp.md | cut -d'|' -f3-8
PYTHONPATH=src timeout 150 python3 -m pytest -q tests/gpu/test_gpu_tp.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -12
CONCCL_RIG_TIMEOUT=150 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 170 python3 -m pytest -q tests/rig -k "tp-w2 or tp-w3" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep "^FAILED\|^E " $R/rig.log | head -12
tar -C $OUT -czf $OUT/run7.tgz r
