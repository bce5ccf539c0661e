#!/usr/bin/env bash
# The session's last code (second review: no end marks in a captured whole-size push pipeline,
# graph_schedule's check of the FREE's slot): the GPU TP tests and the rig's tp parts at world 2.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session12/run9.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt 2>&1
cat $R/gpus.txt
PYTHONPATH=src timeout 150 python3 -m pytest -q tests/gpu/test_gpu_tp.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -12
CONCCL_RIG_TIMEOUT=100 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 110 python3 -m pytest -q tests/rig -k "tp-w2" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep "^FAILED\|^E " $R/rig.log | head -12
tar -C $OUT -czf $OUT/run9.tgz r
