#!/usr/bin/env bash
# NOT RUN this session (its device time was spent): the GPU check and first measurement of
# (a) captured reduce-scatters and all-reduces gated by the previous replay's FREE instead of a
#     READY round trip (c8aa842, bd2ee76): before (graphs.py of c8aa842^) and after, in turns, twice;
# (b) the all-gather's Algorithm.STAGED_PUSH (a08639c): in a graph and eager against NCCL, push
#     and in place; its GPU test; the GPU tests that capture reductions; the rig's graph part.
#   git show c8aa842^:src/conccl/graphs.py > old_graphs.py   (untracked, in the checkout's root: the fork, no FREE gating)
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session8/run6_next.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/r; mkdir -p $R
t0=$SECONDS
rm -rf /tmp/before && mkdir -p /tmp/before && cp -r src /tmp/before/ && cp old_graphs.py /tmp/before/src/conccl/graphs.py
PYTHONPATH=src timeout 200 python3 -m pytest -q tests/gpu/test_gpu_staged_push.py tests/gpu/test_gpu_graphs.py \
  > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -8
G="--modes graph --collectives reduce_scatter,all_reduce --sizes 4K,64K,1M,16M --impls nccl,conccl,conccl_symm_push"
for turn in 1 2; do
  for tree in before after; do
    src=src; [ $tree = before ] && src=/tmp/before/src
    PYTHONPATH=$src timeout 80 python3 -m conccl bench graphs $G --out $R/${tree}$turn > $R/${tree}$turn.log 2>&1
    echo "$tree$turn exit $? at $((SECONDS-t0)) s"
  done
done
AG="--collectives all_gather --sizes 4K,64K,1M,16M --impls nccl,conccl,conccl_staged_push,conccl_symm_push,conccl_symm_staged_push,conccl_symm_push_in_place"
PYTHONPATH=src timeout 120 python3 -m conccl bench graphs $AG --out $R/staged > $R/staged.log 2>&1
echo "staged exit $? at $((SECONDS-t0)) s"
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 120 python3 -m pytest -q tests/rig -k "graph-w2 or graph-w3" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log
tar -C $OUT -czf $OUT/run6_next.tgz r
