#!/usr/bin/env bash
# Session 13, run6 (2 x H100): run5 with the ranks aligned on the GPU before each run
# (`bench tp --align`: a one-element NCCL all-reduce after the sleep), three turns of base
# (_base/: 3cc6631's src with this commit's bench/tp.py and cli/bench_tp.py, which add --align
# only), new, and new without the spin wait; graph and eager.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session13/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run6; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
bench() {  # name src extra-args...
  local name=$1 src=$2; shift 2
  PYTHONPATH=$src timeout 100 python3 -m conccl bench tp --out $R/$name --ops gemm_rs --impls gemm_only,conccl,torch_async_tp \
      --schedules direct --runs 60 --machine-kind nvidia-h100-x2 --align --shapes 1024x3584x8192 "$@" > $R/$name.log 2>&1
  echo "$name exit $? at $((SECONDS-t0)) s: $(grep '^| gemm_rs' $R/$name/tp.md 2>/dev/null | grep 'conccl\|async' | cut -d'|' -f4,5,6,7,8,9 | tr '\n' ';')"
}
for turn in 1 2 3; do
  bench graph_base_$turn _base/src --graph
  bench graph_new_$turn src --graph
  CONCCL_SPIN_WAITS=never bench graph_new_nospin_$turn src --graph
  bench eager_base_$turn _base/src
  bench eager_new_$turn src
done
cd $OUT && tar czf run6.tgz run6 && rm -rf run6
