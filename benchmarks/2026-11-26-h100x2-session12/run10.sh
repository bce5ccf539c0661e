#!/usr/bin/env bash
# The MLP block with auto, direct and push, now recording what auto ran.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-session12/run10.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt 2>&1
cat $R/gpus.txt
PYTHONPATH=src timeout 150 python3 -m conccl bench tp --out $R/block --block --schedules auto,direct,push \
    --machine-kind $CONCCL_MACHINE_KIND > $R/block.log 2>&1
echo "block exit $? at $((SECONDS-t0)) s"; grep "conccl\|async\|compute" $R/block/block.md | cut -d'|' -f3-7
