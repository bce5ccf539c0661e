#!/bin/bash
# On a machine of one GPU (nvidia-h100-x1 or nvidia-h200): what the house's restructure must
# show there. The one-GPU tests of tests/gpu, the shared-GPU rig at worlds 2-4, the README's
# test command (<= 5 min), and the launch path's host time per call beside an older checkout's,
# in turns (scripts/launch_path_bench.py).
#
#   bash scripts/one_gpu_checks.sh OUT_DIR [BASE_SRC]
#
# BASE_SRC: the older checkout's src/ to compare with (e.g. made here with
# `mkdir -p .gpu/base && git archive 04def94 src scripts | tar -x -C .gpu/base` and carried along:
# .gpu/base/src); without it the comparison is left out.
set -u
OUT=${1:?usage: one_gpu_checks.sh OUT_DIR [BASE_SRC]}
BASE=${2:-}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
START=$(date +%s)
took() { echo "[$(( $(date +%s) - START )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" | tee -a "$OUT/gpu.txt"
git rev-parse HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"

took "the one-GPU tests of tests/gpu (the rest skip, saying they need 2 GPUs)"
PYTHONPATH=src timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/unit/test_kernel_sources.py 2>&1 \
  | tail -30 | tee "$OUT/gpu_tier.log"

if [ -n "$BASE" ]; then
  took "host time per call: $BASE against src, in turns"
  for turn in 1 2; do
    for tree in "$BASE" src; do
      tag=$(echo "$tree" | tr '/.' '__')
      PYTHONPATH=$tree timeout 150 python3 scripts/launch_path_bench.py --world 2 --calls 2000 \
        --json "$OUT/launch_${turn}_${tag}.json" 2>&1 | tail -8
    done
  done
fi

took "the shared-GPU rig, worlds 2-4"
PYTHONPATH=src CUDA_VISIBLE_DEVICES=0 timeout 900 python3 -m pytest -q -p no:cacheprovider tests/rig --durations=15 2>&1 \
  | tail -40 | tee "$OUT/rig.log"

took "the README's test command"
( time PYTHONPATH=src timeout 600 python3 -m pytest -q -p no:cacheprovider ) 2>&1 | tail -25 | tee "$OUT/readme_tests.log"
took "done; /dev/shm holds: $(ls /dev/shm | grep -c conccl) conccl segments"
