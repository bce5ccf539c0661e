#!/usr/bin/env bash
# After the review of own_chunk_via_peer (d9eb7f7..): its GPU test with the settled-graph case,
# the bench test (the beside set-up now made before any case), then run4.sh (conccl.tp at
# decode size in CUDA graphs).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session10/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run6; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 200 python3 -m pytest -q -s tests/gpu/test_gpu_own_chunk_via_peer.py tests/gpu/test_gpu_bench_graphs.py \
  > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -8
bash benchmarks/2026-11-26-h100x2-session10/run4.sh
