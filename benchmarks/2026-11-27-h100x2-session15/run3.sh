#!/usr/bin/env bash
# Session 15, run3 (run2 again after its fix): settled pipelines captured with their marks as graph edges, and the host
# trims. The GPU TP tier; host stages with edges off and on; the decode shapes eager (aligned),
# edges off and on.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session15/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run3; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 200 python3 -m pytest -q tests/gpu/test_gpu_tp.py > $R/gpu_tp.log 2>&1
echo "gpu tp tests exit $? at $((SECONDS-t0)) s: $(tail -1 $R/gpu_tp.log)"
for edges in 0 1; do
  mkdir -p $R/stages_edges$edges
  CONCCL_GRAPH_MARK_EDGES=$edges OUT=$R/stages_edges$edges PYTHONPATH=src timeout 120 torchrun --nproc-per-node 2 \
      benchmarks/2026-11-27-h100x2-session15/host_stages.py > $R/stages_edges$edges/log 2>&1
  echo "stages edges=$edges exit $? at $((SECONDS-t0)) s"; grep -v "Warning\|^W11\|\*\*\*\*" $R/stages_edges$edges/log | head -6
done
for edges in 0 1; do
  CONCCL_GRAPH_MARK_EDGES=$edges PYTHONPATH=src timeout 90 python3 -m conccl bench tp --out $R/eager_edges$edges \
      --ops gemm_rs,ag_gemm --impls gemm_only,conccl --schedules direct,push-s2 --runs 30 --machine-kind nvidia-h100-x2 \
      --align --shapes 1024x3584x8192,1024x8192x7168 > $R/eager_edges$edges.log 2>&1
  echo "eager edges=$edges exit $? at $((SECONDS-t0)) s"; grep '^| \(gemm_rs\|ag_gemm\)' $R/eager_edges$edges/tp.md 2>/dev/null | cut -d'|' -f2-9
done
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
