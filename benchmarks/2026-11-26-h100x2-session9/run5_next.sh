#!/usr/bin/env bash
# NOT RUN this session (its device time was spent): the GPU check of the review's fixes after
# run4 (330a333: a group default no longer chooses the all-reduce's form; the GPU test's
# in-place one pass on a stream per peer; 8c90d7f: settled in-place all-reduces post their row,
# which the all-reduce test's repeated calls and the rig's eager part do; 6a577f5: a staged push
# posts too) and a new baseline of every collective in a graph with one pass and spin waits, 4K-16M, twice; the rig's eager and graph parts at worlds 2-3.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session9/run5_next.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run5; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 200 python3 -m pytest -q -s tests/gpu/test_gpu_all_reduce.py tests/gpu/test_gpu_graphs.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -8
B="--modes graph --sizes 4K,64K,1M,4M,16M --impls nccl,conccl,conccl_symm_push,conccl_symm_push_in_place"
for turn in 1 2; do
  PYTHONPATH=src timeout 150 python3 -m conccl bench graphs $B --out $R/all$turn > $R/all$turn.log 2>&1
  echo "all$turn exit $? at $((SECONDS-t0)) s"
done
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 200 python3 -m pytest -q tests/rig -k "eager-w2 or graph-w2 or graph-w3" \
  > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log
