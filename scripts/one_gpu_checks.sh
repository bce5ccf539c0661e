#!/bin/bash
# On a machine of one GPU (nvidia-h100-x1 or nvidia-h200): what the house's restructure must
# show there, one step per call (a device call runs at most 600 s):
#
#   bash scripts/one_gpu_checks.sh STEP OUT_DIR [BASE_SRC]
#
#   gpu     the one-GPU tests of tests/gpu (the two-GPU ones skip, saying so) and the NVRTC compile test
#   bench   host time per call (scripts/launch_path_bench.py), BASE_SRC's conccl against src's, in turns;
#           BASE_SRC: an older checkout's src/, e.g. made here with
#           `mkdir -p .gpu/base && git archive 04def94 src scripts | tar -x -C .gpu/base` and carried (.gpu/base/src)
#   rig2, rig3, rig4   the shared-GPU rig at that world
#   readme  the README's test command, timed (<= 5 min on one GPU)
#
# Every step's exit code is written to OUT_DIR/STEP.rc; the script exits with it.
set -uo pipefail
STEP=${1:?usage: one_gpu_checks.sh STEP OUT_DIR [BASE_SRC]}
OUT=${2:?usage: one_gpu_checks.sh STEP OUT_DIR [BASE_SRC]}
BASE=${3:-}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=src
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
  git rev-parse HEAD 2>/dev/null || echo "commit: ${CONCCL_COMMIT:-unknown}"; } | tee "$OUT/machine.txt"
START=$(date +%s)
case "$STEP" in
  gpu)
    timeout 540 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/unit/test_kernel_sources.py 2>&1 | tee "$OUT/gpu.log"
    rc=$? ;;
  bench)
    [ -n "$BASE" ] || { echo "bench needs BASE_SRC"; exit 2; }
    rc=0
    for turn in 1 2; do
      for tree in "$BASE" src; do
        tag=$(echo "$tree" | tr '/.' '__')
        PYTHONPATH=$tree timeout 120 python3 scripts/launch_path_bench.py --world 2 --calls 2000 \
          --json "$OUT/launch_${turn}_${tag}.json" 2>&1 | tee -a "$OUT/bench.log" || rc=1
      done
    done ;;
  rig2|rig3|rig4)
    CUDA_VISIBLE_DEVICES=0 timeout 540 python3 -m pytest -q -p no:cacheprovider tests/rig -k "w${STEP#rig}" --durations=15 \
      2>&1 | tee "$OUT/$STEP.log"
    rc=$? ;;
  readme)
    ( time timeout 540 python3 -m pytest -q -p no:cacheprovider ) 2>&1 | tee "$OUT/readme.log"
    rc=$? ;;
  *) echo "unknown step $STEP"; exit 2 ;;
esac
echo "$rc" > "$OUT/$STEP.rc"
echo "[$STEP: rc $rc, $(( $(date +%s) - START )) s; conccl segments left in /dev/shm: $(ls /dev/shm | grep -c conccl)]"
exit "$rc"
