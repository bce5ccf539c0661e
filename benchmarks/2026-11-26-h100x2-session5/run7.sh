#!/usr/bin/env bash
# Decode size eager and in CUDA graphs again (run6's graph run ran out of graph workspace for
# the reduce-scatter: the serial conccl call's share was not reserved), 40 runs each.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session5/run7.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
for mode in graph eager; do
  flag=""; [ $mode = graph ] && flag="--graph"
  PYTHONPATH=src timeout 150 python3 -m conccl bench tp --out $R/decode_$mode $flag --shapes 1024x8192x7168,1024x3584x8192 \
      --schedules serial,direct,direct-p2 --runs 40 --machine-kind $CONCCL_MACHINE_KIND > $R/decode_$mode.log 2>&1
  echo "decode $mode exit $? at $((SECONDS-t0)) s"; grep "^| ag_gemm | 1024x8192\|^| gemm_rs | 1024x3584" $R/decode_$mode/tp.md | cut -d'|' -f2-10
done
tar -C $OUT -czf $OUT/run7.tgz r && rm -rf $R
