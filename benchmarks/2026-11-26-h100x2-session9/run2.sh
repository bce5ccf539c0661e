#!/usr/bin/env bash
# Four GPUs: the all-reduce's GPU test (one pass and two, against NCCL) and the GPU tests that
# capture all-reduces, at world 4; bench graphs of both forms against NCCL at worlds 4 and 2
# (GPUs 0,1): where one pass stops paying beyond two ranks (its rule, all_reduce.one_pass, is
# from the byte count there).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session9/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run2; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt; nvidia-smi topo -m >> $R/gpus.txt 2>&1
PYTHONPATH=src timeout 200 python3 -m pytest -q -s tests/gpu/test_gpu_all_reduce.py tests/gpu/test_gpu_graphs.py > $R/gpu4.log 2>&1
echo "gpu4 exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu4.log; grep "^FAILED\|^E " $R/gpu4.log | head -8
B="--collectives all_reduce --sizes 4K,64K,1M,2M,4M,8M,16M --impls nccl,conccl,conccl_symm_push,conccl_staged_push"
for turn in 1 2; do
  PYTHONPATH=src timeout 120 python3 -m conccl bench graphs $B --modes graph --out $R/w4_$turn > $R/w4_$turn.log 2>&1
  echo "w4_$turn exit $? at $((SECONDS-t0)) s"
done
CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=src timeout 100 python3 -m conccl bench graphs $B --modes graph --out $R/w2 > $R/w2.log 2>&1
echo "w2 exit $? at $((SECONDS-t0)) s"
