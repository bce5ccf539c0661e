#!/usr/bin/env bash
# After run1: what a replay of captured calls runs (graph_replay_profile.py: the 64K cases
# that got slower), and conccl bench graphs over every collective, in a graph and eager.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session8/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/r; mkdir -p $R
t0=$SECONDS
PYTHONPATH=src timeout 200 python3 benchmarks/2026-11-26-h100x2-session8/graph_replay_profile.py --out $R/profile \
  > $R/profile.log 2>&1
echo "profile exit $? at $((SECONDS-t0)) s"; grep "^r0\|Error" $R/profile.log | head -20
PYTHONPATH=src timeout 330 python3 -m conccl bench graphs --sizes 4K,64K,1M,16M \
  --impls nccl,conccl,conccl_auto,conccl_symm_push,conccl_symm_push_in_place --out $R/graphs \
  --machine-kind nvidia-h100-x2 > $R/graphs.log 2>&1
echo "graphs exit $? at $((SECONDS-t0)) s"
tar -C $OUT -czf $OUT/run2.tgz r
