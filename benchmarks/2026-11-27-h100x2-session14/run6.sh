#!/usr/bin/env bash
# Session 14, run6: settled pipelines captured by PyTorch's CUDAGraph into the executor's pool
# (the GEMMs' cuBLAS workspace lives there, safe from torch._C._cuda_clearCublasWorkspaces()):
# the GPU TP tests, the rig's tp part at world 2, host time graphed or not.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session14/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run6; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 75 python3 -m pytest -q tests/gpu/test_gpu_tp.py -k "settled or push or serial" > $R/gpu_tests.log 2>&1
echo "gpu tests exit $? at $((SECONDS-t0)) s: $(tail -1 $R/gpu_tests.log)"
CONCCL_RIG_TIMEOUT=60 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 45 python3 -m pytest -q tests/rig -k "tp-w2" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s: $(tail -1 $R/rig.log)"
OUT=$R PYTHONPATH=src timeout 40 python3 benchmarks/2026-11-27-h100x2-session14/host_tp.py > $R/host_tp.log 2>&1
echo "host_tp exit $? at $((SECONDS-t0)) s"; grep -v Warning $R/host_tp.log | tail -6
cd $OUT && tar czf run6.tgz run6 && rm -rf run6
