#!/usr/bin/env bash
# The captured decode all-gather+GEMM again (run7 measured push-s2 at 1.033x with a 17.5%
# spread): two passes of 60 replays each, direct, push, push-s2 and async-TP in turns.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session12/run8.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt 2>&1
cat $R/gpus.txt
for k in 1 2; do
  PYTHONPATH=src timeout 100 python3 -m conccl bench tp --out $R/graph$k --graph --ops ag_gemm --shapes 1024x8192x7168 \
      --schedules direct,push,push-s2 --impls gemm_only,torch_async_tp,conccl --runs 60 --machine-kind $CONCCL_MACHINE_KIND > $R/graph$k.log 2>&1
  echo "graph$k exit $? at $((SECONDS-t0)) s"; grep "ag_gemm" $R/graph$k/tp.md | cut -d'|' -f3-8
done
tar -C $OUT -czf $OUT/run8.tgz r
