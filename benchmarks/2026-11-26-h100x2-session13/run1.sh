#!/usr/bin/env bash
# Session 13, run1 (2 x H100): where an eager call's host time goes (host_profile.py) and where
# a decode-size GEMM+reduce-scatter's and all-gather+GEMM's GPU time goes (tp_timeline.py).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session13/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run1; mkdir -p $R
D=benchmarks/2026-11-26-h100x2-session13
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
OUT=$R PYTHONPATH=src timeout 240 python3 $D/host_profile.py > $R/host_profile.log 2>&1
echo "host_profile exit $? at $((SECONDS-t0)) s"; grep "host us" $R/host_profile.log
PYTHONPATH=src timeout 150 python3 scripts/tp_timeline.py --op gemm_rs --shapes 1024x3584x8192,8192x14336x4096 \
    --schedules direct,direct-s2 --rounds 9 --machine-kind nvidia-h100-x2 --json $R/rs_timeline.json \
    --markdown $R/rs_timeline.md > $R/rs_timeline.log 2>&1
echo "rs timeline exit $? at $((SECONDS-t0)) s"; cat $R/rs_timeline.md
PYTHONPATH=src timeout 120 python3 scripts/tp_timeline.py --op ag_gemm --shapes 1024x8192x7168 \
    --schedules push,push-s2,direct --rounds 9 --machine-kind nvidia-h100-x2 --json $R/ag_timeline.json \
    --markdown $R/ag_timeline.md > $R/ag_timeline.log 2>&1
echo "ag timeline exit $? at $((SECONDS-t0)) s"; cat $R/ag_timeline.md
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
