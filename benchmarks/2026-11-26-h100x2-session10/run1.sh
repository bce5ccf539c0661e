#!/usr/bin/env bash
# Issue 38 item 6: a push all-gather's own chunk read back from a peer (own_chunk_via_peer), its
# GPU test; every collective's completion beside running bf16 8192^3 GEMMs (bench graphs
# --modes beside); the read-back alone in a graph and eager against the same-GPU copy, twice;
# the rig's eager part (a mixed via-peer case) at worlds 2 and 3.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session10/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run1; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 240 python3 -m pytest -q -s tests/gpu/test_gpu_own_chunk_via_peer.py \
  tests/gpu/test_cuda_collectives.py tests/gpu/test_gpu_graphs.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -8
PYTHONPATH=src timeout 200 python3 -m conccl bench graphs --modes beside --sizes 64K,1M,16M \
  --impls nccl,conccl,conccl_symm_push,conccl_symm_push_in_place,conccl_symm_push_via_peer --runs 7 \
  --out $R/beside > $R/beside.log 2>&1
echo "beside exit $? at $((SECONDS-t0)) s"
B="--collectives all_gather --modes graph,eager --sizes 4K,64K,1M,4M,16M,64M --impls nccl,conccl_symm_push,conccl_symm_push_in_place,conccl_symm_push_via_peer"
for turn in 1 2; do
  PYTHONPATH=src timeout 120 python3 -m conccl bench graphs $B --out $R/alone$turn > $R/alone$turn.log 2>&1
  echo "alone$turn exit $? at $((SECONDS-t0)) s"
done
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 150 python3 -m pytest -q tests/rig -k "eager-w2 or eager-w3" \
  > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log
