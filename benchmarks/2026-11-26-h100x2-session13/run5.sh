#!/usr/bin/env bash
# Session 13, run5 (2 x H100): run3 again with more runs and turns (its 30-run medians moved
# 30% between turns): the decode GEMM+reduce-scatter in a CUDA graph, 100 runs, three turns of
# the control-stream reduction (3cc6631, _base/), the reduction behind the last GEMM step (new),
# and new with stream memory waits only (CONCCL_SPIN_WAITS=never: no spin kernel before the sum).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session13/run5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run5; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
bench() {  # name src extra-args...
  local name=$1 src=$2; shift 2
  PYTHONPATH=$src timeout 100 python3 -m conccl bench tp --out $R/$name --ops gemm_rs --impls gemm_only,conccl \
      --schedules direct --runs 100 --machine-kind nvidia-h100-x2 --graph --shapes 1024x3584x8192 "$@" > $R/$name.log 2>&1
  echo "$name exit $? at $((SECONDS-t0)) s: $(grep '^| gemm_rs' $R/$name/tp.md 2>/dev/null | grep 'conccl' | cut -d'|' -f3,5,6,7,8,9 | tr '\n' ';')"
}
for turn in 1 2 3; do
  bench base_$turn _base/src
  bench new_$turn src
  CONCCL_SPIN_WAITS=never bench new_nospin_$turn src
done
cd $OUT && tar czf run5.tgz run5 && rm -rf run5
