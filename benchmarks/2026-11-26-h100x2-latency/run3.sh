#!/usr/bin/env bash
# Issue 38, third run on nvidia-h100-x2: the one-shot path (CONCCL_ONE_SHOT_BELOW). Its GPU
# tests; bench graphs with one-shot calls up to 1M and with copy engines only, in turns; the
# shared-GPU rig with one-shot calls; then the whole GPU tier (copy engines, the default).
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-latency/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 150 python3 -m pytest -q -x -s tests/gpu/test_oneshot_kernel.py tests/gpu/test_gpu_one_shot.py > $OUT/one_shot_tests.log 2>&1
echo "one-shot GPU tests exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/one_shot_tests.log
graphs() {  # $1 one-shot limit, $2 name
  CONCCL_ONE_SHOT_BELOW=$1 PYTHONPATH=src timeout 100 python3 -m conccl bench graphs --out $OUT/graphs_$2 --sizes 4K,64K,1M,16M \
    --collectives all_gather,all_to_all,reduce_scatter,all_reduce --impls nccl,conccl --runs 5 > $OUT/graphs_$2.log 2>&1
  echo "bench graphs $2 exit $? at $((SECONDS-t0)) s"
}
graphs 1M oneshot1
graphs 0 ce1
graphs 1M oneshot2
CUDA_VISIBLE_DEVICES=0 CONCCL_ONE_SHOT_BELOW=1M PYTHONPATH=src timeout 120 python3 -m pytest -q -x tests/rig > $OUT/rig_one_shot.log 2>&1
echo "rig (one-shot) exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/rig_one_shot.log
PYTHONPATH=src timeout $((585-SECONDS+t0)) python3 -m pytest -q tests/gpu > $OUT/gpu_tier.log 2>&1
echo "GPU tier exit $? at $((SECONDS-t0)) s"; tail -4 $OUT/gpu_tier.log
