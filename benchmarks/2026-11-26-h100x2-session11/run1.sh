#!/usr/bin/env bash
# Issue 38, eager `auto` planned from an eager sweep: the GPU tests of the study (a quick study,
# now with the eager sweep) and of the eager path; then the README's main job as written
# (`conccl study --out study`, with the eager sweep); then every collective eager with
# set_eager_path("auto") planned from that study's profile (CONCCL_PROFILE), two turns; the routed
# call's layers in turns (route_turns.py).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session11/run1.sh [tests|study|route|bench]...
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run1; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
for part in "$@"; do
  case $part in
  tests)
    PYTHONPATH=src timeout 300 python3 -m pytest -q -s tests/gpu/test_gpu_study.py tests/gpu/test_gpu_eager_path.py \
      > $R/gpu.log 2>&1
    echo "tests exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -8 ;;
  study)  # the README's main job, as a newcomer types it (from the checkout)
    python3 scripts/setup_env.py > $R/setup.log 2>&1; echo "setup exit $?"
    rm -rf study; PYTHONPATH=src timeout 540 python3 -m conccl study --out study > $R/study.log 2>&1
    echo "study exit $? at $((SECONDS-t0)) s"; tail -3 $R/study.log; cp -r study $R/ ;;
  route)  # the routed call's layers, in turns
    for s in 4096 1048576; do
      PYTHONPATH=src timeout 150 python3 benchmarks/2026-11-26-h100x2-session11/route_turns.py $s > $R/route_turns_$s.txt 2>&1
      echo "route $s exit $? at $((SECONDS-t0)) s"
    done ;;
  bench)
    P=$R/study/profile.json
    B="--modes eager --sizes 4K,64K,1M,4M,16M,64M,256M --impls nccl,conccl,conccl_auto"
    for turn in 1 2; do
      CONCCL_PROFILE=$P PYTHONPATH=src timeout 200 python3 -m conccl bench graphs $B --out $R/eager$turn \
        > $R/eager$turn.log 2>&1
      echo "eager$turn exit $? at $((SECONDS-t0)) s"
    done ;;
  esac
done
