#!/usr/bin/env bash
# Session 14, run1 (2 x H100): settled eager pipelines as one graph launch. The GPU TP tests
# (the new settled-pipeline test among them) and the settled-graph and graph tests; the rig's
# TP parts at worlds 2 and 3; host time per eager conccl.tp call, graphs against driver calls.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session14/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run1; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 240 python3 -m pytest -q tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_settled_graph.py tests/gpu/test_gpu_graphs.py > $R/gpu_tests.log 2>&1
echo "gpu tests exit $? at $((SECONDS-t0)) s: $(tail -1 $R/gpu_tests.log)"
CONCCL_RIG_TIMEOUT=200 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 200 python3 -m pytest -q tests/rig -k "tp-w2 or tp-w3" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s: $(tail -1 $R/rig.log)"
OUT=$R PYTHONPATH=src timeout 200 python3 benchmarks/2026-11-27-h100x2-session14/host_tp.py > $R/host_tp.log 2>&1
echo "host_tp exit $? at $((SECONDS-t0)) s"; cat $R/host_tp.log | grep -v Warning | tail -8
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
