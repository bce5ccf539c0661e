#!/usr/bin/env bash
# Session 15, run9: the rig's tp and tp_layers parts at world 4 (one GPU, four ranks) with this
# session's code (settled pipelines' edges, the new H100 table), then the MLP block bench with
# `auto` from the new table, as far as the device time lasts.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session15/run9.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run9; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
CONCCL_RIG_TIMEOUT=90 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 110 python3 -m pytest -q tests/rig \
    -k "tp-w4 or tp_layers-w4" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s: $(tail -1 $R/rig.log)"
PYTHONPATH=src timeout 85 python3 -m conccl bench tp --out $R/block --block --schedules auto,direct,push \
    --machine-kind nvidia-h100-x2 > $R/block.log 2>&1
echo "block exit $? at $((SECONDS-t0)) s"; grep "conccl\|async\|compute" $R/block/block.md 2>/dev/null | cut -d'|' -f2-8
cd $OUT && tar czf run9.tgz run9 && rm -rf run9
