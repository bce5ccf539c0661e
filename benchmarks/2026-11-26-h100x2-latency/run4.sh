#!/usr/bin/env bash
# Issue 38, fourth run on nvidia-h100-x2: the one-shot GPU test again (a name check fixed),
# the shared-GPU rig with one-shot calls, and the crossover in a graph (16K-256K).
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-latency/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 90 python3 -m pytest -q tests/gpu/test_gpu_one_shot.py > $OUT/one_shot_test.log 2>&1
echo "one-shot GPU test exit $? at $((SECONDS-t0)) s"; tail -2 $OUT/one_shot_test.log
CUDA_VISIBLE_DEVICES=0 CONCCL_ONE_SHOT_BELOW=1M PYTHONPATH=src timeout 110 python3 -m pytest -q tests/rig -k w2 > $OUT/rig_one_shot.log 2>&1
echo "rig w2 (one-shot) exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/rig_one_shot.log
for lim in 1M 0; do
  CONCCL_ONE_SHOT_BELOW=$lim PYTHONPATH=src timeout 60 python3 -m conccl bench graphs --out $OUT/graphs_x$lim --sizes 16K,64K,256K \
    --modes graph --collectives all_gather,all_to_all,reduce_scatter,all_reduce --impls nccl,conccl --runs 5 > $OUT/graphs_x$lim.log 2>&1
  echo "bench graphs (one-shot below $lim) exit $? at $((SECONDS-t0)) s"
done
