#!/usr/bin/env bash
# Session 14, run2: where run1's settled pipeline graphs hung (diag_settled.py), one pipeline
# per process with a 60 s bound: a push all-gather+GEMM and a direct GEMM+reduce-scatter, then
# the same with the device synchronised before each graph is made.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session14/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run2; mkdir -p $R
t0=$SECONDS
for case in "direct rs" "push ag" "direct ag"; do
  set -- $case
  PYTHONPATH=src timeout 60 python3 benchmarks/2026-11-27-h100x2-session14/diag_settled.py $1 $2 > $R/diag_$1_$2.log 2>&1
  echo "$case exit $? at $((SECONDS-t0)) s"; grep -v "Warning\|warn" $R/diag_$1_$2.log | grep "rank\|File\|Thread" | head -40
done
CONCCL_DIAG_SYNC=1 PYTHONPATH=src timeout 60 python3 benchmarks/2026-11-27-h100x2-session14/diag_settled.py direct rs > $R/diag_sync.log 2>&1
echo "synced direct rs exit $? at $((SECONDS-t0)) s"; grep "rank" $R/diag_sync.log | tail -6
