#!/usr/bin/env bash
# Session 14, run7 (written, NOT run: the session's device time was spent): what the settled
# pipelines touch that run6 did not run after the PyTorch capture: the whole GPU TP tier (the
# push test's profiled call on driver calls, the MLP layers, torch.compile's custom ops), the
# settled-graph and graph tests, the rig's tp, tp_layers and graph parts at worlds 2 and 3,
# and the host bench again.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session14/run7.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run7; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 300 python3 -m pytest -q tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_tp_compile.py \
    tests/gpu/test_gpu_settled_graph.py tests/gpu/test_gpu_graphs.py > $R/gpu_tests.log 2>&1
echo "gpu tests exit $? at $((SECONDS-t0)) s: $(tail -1 $R/gpu_tests.log)"
CONCCL_RIG_TIMEOUT=200 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 240 python3 -m pytest -q tests/rig \
    -k "tp-w2 or tp-w3 or tp_layers-w2 or tp_layers-w3 or graph-w2" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s: $(tail -1 $R/rig.log)"
OUT=$R PYTHONPATH=src timeout 60 python3 benchmarks/2026-11-27-h100x2-session14/host_tp.py > $R/host_tp.log 2>&1
echo "host_tp exit $? at $((SECONDS-t0)) s"; grep -v Warning $R/host_tp.log | tail -6
cd $OUT && tar czf run7.tgz run7 && rm -rf run7
