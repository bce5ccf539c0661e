#!/usr/bin/env bash
# Issue 39, second run: the own chunk's copy moved behind the last GEMM step, or dropped where
# the gathered rows are not returned (run1's timeline: it raced the GEMM steps for the SMs);
# async-TP timed without its gathered A too. GPU tests, timeline, the MLP block, the op bench
# (both ops, 8 shapes each); then issue 38's eager host time per call with settled calls
# posting and not (bench.latency --phases).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session5/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 100 python3 -m pytest -q tests/gpu/test_gpu_tp.py > $OUT/gpu_tp.log 2>&1
echo "gpu tp exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/gpu_tp.log; grep "FAILED\|ERROR" $OUT/gpu_tp.log | head -5
PYTHONPATH=src timeout 90 python3 scripts/tp_timeline.py --shapes 8192x8192x14336,4096x8192x8192,32768x4096x7168 \
    --schedules direct,direct-p2,direct-p4,ring-p2 --rounds 7 --machine-kind $CONCCL_MACHINE_KIND \
    --json $OUT/tp_timeline.json --markdown $OUT/tp_timeline.md > $OUT/tp_timeline.log 2>&1
echo "timeline exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/tp_timeline.md | cut -d'|' -f2-5,9-13
PYTHONPATH=src timeout 90 python3 -m conccl bench tp --out $OUT/block --block --schedules auto,direct,direct-p2 \
    --runs 10 --machine-kind $CONCCL_MACHINE_KIND > $OUT/block.log 2>&1
echo "block exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/block/block.md | cut -d'|' -f3-8
PYTHONPATH=src timeout 300 python3 -m conccl bench tp --out $OUT/ops --schedules serial,direct,direct-p2,direct-p4,direct-p4-g2,ring-p2 \
    --machine-kind $CONCCL_MACHINE_KIND > $OUT/ops.log 2>&1
echo "ops exit $? at $((SECONDS-t0)) s"; grep "conccl_auto\|async" $OUT/ops/tp.md | cut -d'|' -f2-8
for post in 1 0; do
  CONCCL_POST_SETTLED=$post PYTHONPATH=src timeout $((575 - (SECONDS - t0))) python3 -m conccl.bench.latency --out $OUT/latency_post$post \
      --impls conccl,nccl --collectives all_gather,reduce_scatter --sizes 4096,65536,1048576 --phases -n 100 --reps 3 \
      > $OUT/latency_post$post.log 2>&1
  echo "latency post_settled=$post exit $? at $((SECONDS-t0)) s"; grep "^| all\|^| reduce" $OUT/latency_post$post/latency.md | head -12
done
