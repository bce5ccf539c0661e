#!/usr/bin/env bash
# Issue 38, second run on nvidia-h100-x2: captured staged pulls wait for the previous replay's
# FREE at their start (graphs.py). bench graphs in a graph, old (99aad54, in old_tree/) and new
# in turns; then the GPU tier's graph tests and the shared-GPU rig tier on GPU 0.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-latency/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
graphs() {  # $1 tree (src folder), $2 name
  PYTHONPATH=$1 timeout 150 python3 -m conccl bench graphs --out $OUT/graphs_$2 --sizes 4K,64K,1M,16M --modes graph \
    --collectives all_gather,all_to_all,reduce_scatter,all_reduce --impls nccl,conccl --runs 5 > $OUT/graphs_$2.log 2>&1
  echo "bench graphs $2 exit $? at $((SECONDS-t0)) s"
}
graphs old_tree/src old3
graphs src new3
graphs old_tree/src old4
graphs src new4
PYTHONPATH=src timeout 120 python3 -m pytest -q tests/gpu -k "graph or spin" > $OUT/gpu_graphs.log 2>&1
echo "GPU graph tests exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/gpu_graphs.log
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout $((580-SECONDS+t0)) python3 -m pytest -q tests/rig > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/rig.log
