#!/usr/bin/env bash
# The all-reduce in one pass (Algorithm.STAGED_PUSH, automatic up to 16 MiB sent per rank): its
# GPU tests, the GPU tests that capture all-reduces, the rig's eager and graph parts (both
# forms) and bench graphs of both forms against NCCL, in a graph and eager, twice.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session9/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run1; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 240 python3 -m pytest -q -s tests/gpu/test_gpu_all_reduce.py tests/gpu/test_gpu_graphs.py \
  tests/gpu/test_gpu_settled_graph.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -8
B="--collectives all_reduce --sizes 4K,64K,1M,4M,16M,64M --impls nccl,conccl,conccl_symm_push,conccl_staged_push"
for turn in 1 2; do
  PYTHONPATH=src timeout 150 python3 -m conccl bench graphs $B --out $R/ar$turn > $R/ar$turn.log 2>&1
  echo "ar$turn exit $? at $((SECONDS-t0)) s"
done
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 200 python3 -m pytest -q tests/rig -k "graph-w2 or graph-w3 or eager-w2 or eager-w3" \
  > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log
