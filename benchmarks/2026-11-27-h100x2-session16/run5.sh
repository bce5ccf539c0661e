#!/usr/bin/env bash
# Session 16, run5 (written for the next session, not run): the one-shot path measured again
# (10c9e64: the bench's conccl_one_shot entry, Work.path "one_shot"), and the GPU tier's
# files run4 did not reach.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session16/run5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run5; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 150 python3 -m pytest -q tests/gpu/test_gpu_one_shot.py tests/gpu/test_oneshot_kernel.py \
    > $R/one_shot_tests.log 2>&1
echo "one-shot tests exit $? at $((SECONDS-t0)) s: $(tail -1 $R/one_shot_tests.log)"
for turn in 1 2; do
  PYTHONPATH=src timeout 90 python3 -m conccl bench graphs --out $R/one_shot_$turn --modes graph,eager \
      --sizes 4K,16K,64K,256K,1M --impls nccl,conccl,conccl_one_shot --machine-kind nvidia-h100-x2 \
      > $R/one_shot_$turn.log 2>&1
  echo "bench one-shot turn $turn exit $? at $((SECONDS-t0)) s"
done
PYTHONPATH=src timeout $((570 - (SECONDS - t0))) python3 -m pytest -q tests/gpu/test_gpu_tp_compile.py \
    tests/gpu/test_moe_route_kernel.py tests/gpu/test_spin_wait.py > $R/gpu_rest.log 2>&1
echo "gpu rest exit $? at $((SECONDS-t0)) s: $(tail -1 $R/gpu_rest.log)"
cd $OUT && tar czf run5.tgz run5 && rm -rf run5
