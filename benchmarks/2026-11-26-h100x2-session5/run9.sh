#!/usr/bin/env bash
# After the graph-capture review fixes (each captured pipeline its own block of marks: the pad
# grew; a failing capture breaks the group): the GPU tests of conccl.tp (with the captured
# case), of the flat collectives' graphs and of one-shot calls (their abort word moved with the
# pad), and the rig's tp and graph parts at world 2.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session5/run9.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 170 python3 -m pytest -q tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_graphs.py tests/gpu/test_gpu_one_shot.py \
    > $OUT/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/gpu.log; grep "FAILED\|Error" $OUT/gpu.log | head -5
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 80 python3 -m pytest -q tests/rig -k "tp-w2 or graph-w2" > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/rig.log; grep -i "failed" $OUT/rig.log | head -5
