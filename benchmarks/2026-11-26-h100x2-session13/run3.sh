#!/usr/bin/env bash
# Session 13, run3 (2 x H100): the GEMM+reduce-scatter's reduction behind the last GEMM step
# (8ddada9) against the control-stream reduction (3cc6631, unpacked by `git archive 3cc6631 src`
# into _base/ beside the checkout and carried), in turns, at decode size in a CUDA graph and
# eager, and a large shape eager; then the new code with the reduction on every SM
# (CONCCL_REDUCE_CTAS=132) in a graph.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session13/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run3; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
bench() {  # name src extra-args...
  local name=$1 src=$2; shift 2
  PYTHONPATH=$src timeout 150 python3 -m conccl bench tp --out $R/$name --ops gemm_rs --impls gemm_only,conccl \
      --schedules direct --runs 30 --machine-kind nvidia-h100-x2 "$@" > $R/$name.log 2>&1
  echo "$name exit $? at $((SECONDS-t0)) s: $(grep '^| gemm_rs' $R/$name/tp.md 2>/dev/null | grep 'conccl' | cut -d'|' -f3,5,6,7,8,9 | tr '\n' ';')"
}
for turn in 1 2; do
  bench graph_base_$turn _base/src --graph --shapes 1024x3584x8192
  bench graph_new_$turn src --graph --shapes 1024x3584x8192
  bench eager_base_$turn _base/src --shapes 1024x3584x8192,8192x14336x4096
  bench eager_new_$turn src --shapes 1024x3584x8192,8192x14336x4096
done
CONCCL_REDUCE_CTAS=132 bench graph_new_ctas132 src --graph --shapes 1024x3584x8192
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
