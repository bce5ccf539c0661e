#!/usr/bin/env bash
# conccl.tp at decode size captured into CUDA graphs on 2 x H100 (issue 38's TP goals: in a
# graph 1024x8192x7168 all-gather+GEMM <= 1.04x the GEMM alone, 1024x3584x8192 GEMM+RS
# <= 1.15x; measured before only on 2 x H200, before session 5's run8 fix), and eager, 40 runs.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session10/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run4; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
for mode in graph eager; do
  flag=""; [ $mode = graph ] && flag="--graph"
  PYTHONPATH=src timeout 200 python3 -m conccl bench tp --out $R/decode_$mode $flag --shapes 1024x8192x7168,1024x3584x8192 \
      --schedules serial,direct,direct-p2 --runs 40 --machine-kind nvidia-h100-x2 > $R/decode_$mode.log 2>&1
  echo "decode $mode exit $? at $((SECONDS-t0)) s"; grep "^| ag_gemm | 1024x8192\|^| gemm_rs | 1024x3584" $R/decode_$mode/tp.md | cut -d'|' -f2-12
done
