#!/usr/bin/env bash
# Issue 39 (TP) first run of the session: conccl.tp's GPU tests with the two-stream GEMM
# schedules (-s2), the rig's tp and eager parts (the eager part has the settled calls of
# issue 38), where an all-gather+GEMM's time goes (scripts/tp_timeline.py, in turn), and the
# SwiGLU MLP block forward+backward (bench tp --block).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session5/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/gpus.txt 2>&1
PYTHONPATH=src timeout 150 python3 -m pytest -q tests/gpu/test_gpu_tp.py > $OUT/gpu_tp.log 2>&1
echo "gpu tp exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/gpu_tp.log; grep "FAILED\|ERROR" $OUT/gpu_tp.log | head -5
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 100 python3 -m pytest -q tests/rig -k "tp-w2 or eager-w2" > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/rig.log; grep -i "failed" $OUT/rig.log | head -5
PYTHONPATH=src timeout 170 python3 scripts/tp_timeline.py --shapes 8192x8192x14336,4096x8192x8192,32768x4096x7168 \
    --schedules direct,direct-p2,ring-p2,direct-s2,direct-p2-s2 --rounds 7 --machine-kind $CONCCL_MACHINE_KIND \
    --json $OUT/tp_timeline.json --markdown $OUT/tp_timeline.md > $OUT/tp_timeline.log 2>&1
echo "timeline exit $? at $((SECONDS-t0)) s"; grep -v "^$" $OUT/tp_timeline.md | cut -c1-160 | tail -24
PYTHONPATH=src timeout $((560 - (SECONDS - t0))) python3 -m conccl bench tp --out $OUT/block --block \
    --schedules auto,direct-s2,direct-p2-s2 --runs 10 --machine-kind $CONCCL_MACHINE_KIND > $OUT/block.log 2>&1
echo "block exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/block/block.md; tail -3 $OUT/block.log
