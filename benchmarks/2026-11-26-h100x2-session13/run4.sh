#!/usr/bin/env bash
# Session 13, run4 (2 x H100): the GPU TP tests, the rig's TP parts at world 2 on one GPU, and
# the decode GEMM+reduce-scatter's timeline with the reduction behind the last GEMM step.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session13/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run4; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 200 python3 -m pytest -q tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_graphs.py > $R/gpu_tests.log 2>&1
echo "gpu tests exit $? at $((SECONDS-t0)) s: $(tail -1 $R/gpu_tests.log)"
CONCCL_RIG_TIMEOUT=200 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 260 python3 -m pytest -q tests/rig -k "tp-w2 or tp_layers-w2 or tp-w3 or graph-w2" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s: $(tail -1 $R/rig.log)"
PYTHONPATH=src timeout 100 python3 scripts/tp_timeline.py --op gemm_rs --shapes 1024x3584x8192 \
    --schedules direct --rounds 9 --machine-kind nvidia-h100-x2 --json $R/rs_timeline.json \
    --markdown $R/rs_timeline.md > $R/rs_timeline.log 2>&1
echo "rs timeline exit $? at $((SECONDS-t0)) s"; grep "direct" $R/rs_timeline.md
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
