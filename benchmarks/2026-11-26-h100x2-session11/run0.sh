#!/usr/bin/env bash
# Issue 38, eager `auto`: where an eager call routed to NCCL spends its host time (route_probe.py,
# 4K and 1M), and every collective eager, 4K-64M: NCCL, conccl on plain tensors, conccl_auto,
# conccl on conccl.empty tensors, in two turns.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session11/run0.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run0; mkdir -p $R; D=benchmarks/2026-11-26-h100x2-session11
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
for s in 4096 1048576; do
  PYTHONPATH=src timeout 120 python3 $D/route_probe.py $s > $R/route_$s.txt 2>&1
  echo "route $s exit $? at $((SECONDS-t0)) s"; head -1 $R/route_$s.txt
done
B="--modes eager --sizes 4K,64K,1M,4M,16M,64M --impls nccl,conccl,conccl_auto,conccl_symm_push"
for turn in 1 2; do
  PYTHONPATH=src timeout 200 python3 -m conccl bench graphs $B --out $R/eager$turn > $R/eager$turn.log 2>&1
  echo "eager$turn exit $? at $((SECONDS-t0)) s"
done
