#!/usr/bin/env bash
# Issue 38: the own-shard copy forked off a captured call's signal chain (conccl/graphs.py,
# _own_copy_forked). In a graph, per call: NCCL, conccl on plain tensors, on conccl.empty
# tensors (push, pull, push in place), before (graphs.py of BASE) and after, in turns, twice.
#   OUT=<folder> CONCCL_COMMIT=<sha> BASE=<sha> bash benchmarks/2026-11-26-h100x2-session8/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/r; mkdir -p $R
t0=$SECONDS
# "before": this tree with graphs.py as BASE had it (the only file the change touches on the GPU path)
rm -rf /tmp/before && mkdir -p /tmp/before && cp -r src /tmp/before/ && cp old_graphs.py /tmp/before/src/conccl/graphs.py  # old_graphs.py: BASE:src/conccl/graphs.py, untracked
(which nsys; nvidia-smi --query-gpu=name,driver_version --format=csv) > $R/env.txt 2>&1
G="--modes graph --collectives all_gather,all_to_all --sizes 4K,64K,1M,16M --runs 5 --replays 10 --calls 20"
I="--impls nccl,conccl,conccl_symm_push,conccl_symm_pull,conccl_symm_push_in_place"
for turn in 1 2; do
  for tree in before after; do
    src=src; [ $tree = before ] && src=/tmp/before/src
    PYTHONPATH=$src timeout 240 python3 -m conccl bench graphs $G $I --out $R/${tree}$turn --machine-kind nvidia-h100-x2 \
      > $R/${tree}$turn.log 2>&1
    echo "$tree$turn exit $? at $((SECONDS-t0)) s"
  done
done
PYTHONPATH=src timeout 200 python3 -m pytest -q tests/gpu/test_gpu_graphs.py > $R/gpu_graphs.log 2>&1
echo "gpu graphs exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_graphs.log
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 120 python3 -m pytest -q tests/rig -k "graph-w2 or graph-w3" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log
tar -C $OUT -czf $OUT/run1.tgz r
