#!/usr/bin/env bash
# Session 13, run9 (2 x H100): a captured pipeline's marks as graph edges (conccl.graphs.mark_edges,
# the default) against stream memory operations on pad words (CONCCL_GRAPH_MARK_EDGES=0): the GPU
# test of captured pipelines, the rig's captured TP cases, then decode-size all-gather+GEMM and
# GEMM+reduce-scatter in CUDA graphs, ranks aligned, two turns. Stops at the first failed test.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session13/run9.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run9; mkdir -p $R
t0=$SECONDS
finish() { cd $OUT && tar czf run9.tgz run9 && rm -rf run9; exit ${1:-0}; }
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 120 python3 -m pytest -q tests/gpu/test_gpu_tp.py -k captured > $R/gpu_test.log 2>&1
rc=$?; echo "gpu test exit $rc at $((SECONDS-t0)) s: $(tail -1 $R/gpu_test.log)"; [ $rc = 0 ] || { tail -30 $R/gpu_test.log; finish 1; }
CONCCL_RIG_TIMEOUT=80 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 100 python3 -m pytest -q tests/rig -k "tp-w2 or graph-w2" > $R/rig.log 2>&1
rc=$?; echo "rig exit $rc at $((SECONDS-t0)) s: $(tail -1 $R/rig.log)"; [ $rc = 0 ] || { tail -30 $R/rig.log; finish 1; }
bench() {  # name edges(1/0)
  CONCCL_GRAPH_MARK_EDGES=$2 PYTHONPATH=src timeout 70 python3 -m conccl bench tp --out $R/$1 --impls gemm_only,conccl \
      --schedules push-s2,direct --runs 30 --align --graph --machine-kind nvidia-h100-x2 \
      --shapes 1024x8192x7168,1024x3584x8192 > $R/$1.log 2>&1
  echo "$1 exit $? at $((SECONDS-t0)) s: $(grep '| conccl ' $R/$1/tp.md 2>/dev/null | cut -d'|' -f2,3,5,6,7,8 | tr '\n' ';')"
}
for turn in 1 2; do
  bench edges_$turn 1
  bench memops_$turn 0
done
finish 0
