#!/usr/bin/env bash
# Session 14, run5: the settled-pipeline GPU test after its expectations were fixed (run3: every
# result right, the counts asked too much); the decode shapes eagerly, aligned, settled graphs
# off (CONCCL_SETTLED_GRAPHS=0) and on, x the GEMM alone: what the graph does to GPU time.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session14/run5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run5; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 100 python3 -m pytest -q tests/gpu/test_gpu_tp.py -k settled > $R/gpu_test.log 2>&1
echo "gpu test exit $? at $((SECONDS-t0)) s: $(tail -1 $R/gpu_test.log)"
for graphs in 0 1; do
  CONCCL_SETTLED_GRAPHS=$graphs PYTHONPATH=src timeout 60 python3 -m conccl bench tp --out $R/eager_graphs$graphs \
      --ops gemm_rs --impls gemm_only,conccl --schedules direct --runs 30 --machine-kind nvidia-h100-x2 --align \
      --shapes 1024x3584x8192 > $R/eager_graphs$graphs.log 2>&1
  echo "graphs=$graphs exit $? at $((SECONDS-t0)) s: $(grep '^| gemm_rs' $R/eager_graphs$graphs/tp.md 2>/dev/null | cut -d'|' -f2-9 | tr '\n' ';')"
done
cd $OUT && tar czf run5.tgz run5 && rm -rf run5
