#!/usr/bin/env bash
# Captured reductions waiting for their signals by the spin-wait kernel (CONCCL_SPIN_WAITS,
# default "graphs"): the GPU tests that capture reductions, with it and with "never"; bench
# graphs of reduce-scatter and all-reduce with it and without, in turns, twice; the rig's
# graph and tp parts.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session9/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run3; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 240 python3 -m pytest -q tests/gpu/test_gpu_graphs.py tests/gpu/test_spin_wait.py \
  tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_reduce_scatter.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -8
CONCCL_SPIN_WAITS=never PYTHONPATH=src timeout 60 python3 -m pytest -q tests/gpu/test_gpu_graphs.py > $R/gpu_never.log 2>&1
echo "gpu never exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_never.log
B="--modes graph --collectives reduce_scatter,all_reduce --sizes 4K,64K,1M,4M,16M --impls nccl,conccl"
for turn in 1 2; do
  for mode in never graphs; do
    CONCCL_SPIN_WAITS=$mode PYTHONPATH=src timeout 80 python3 -m conccl bench graphs $B --out $R/${mode}$turn \
      > $R/${mode}$turn.log 2>&1
    echo "$mode$turn exit $? at $((SECONDS-t0)) s"
  done
done
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 150 python3 -m pytest -q tests/rig -k "graph-w2 or graph-w3 or tp-w2" \
  > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep "FAIL\|False" $R/rig.log | head -5
