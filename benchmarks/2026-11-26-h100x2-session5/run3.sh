#!/usr/bin/env bash
# Issue 39, third run: the own rows' GEMM step waits for the staging copy (run2's timeline: at
# 128 MiB shards the GEMM took the SMs first and the staging, so the peer's pull, waited for
# the whole step). GPU tests, the rig's tp parts at worlds 2 and 3, the timeline on four
# shapes, the all-gather+GEMM op bench and the MLP block. Everything is packed into one
# archive (the device returns few files).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session5/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
PYTHONPATH=src timeout 100 python3 -m pytest -q tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_tp_compile.py > $R/gpu_tp.log 2>&1
echo "gpu tp exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_tp.log; grep "FAILED\|ERROR" $R/gpu_tp.log | head -5
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 120 python3 -m pytest -q tests/rig -k "tp-w2 or tp-w3 or tp_layers-w2 or tp_layers-w3" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep -i "failed" $R/rig.log | head -5
PYTHONPATH=src timeout 100 python3 scripts/tp_timeline.py --shapes 8192x8192x14336,4096x8192x8192,32768x4096x7168,16384x8192x7168 \
    --schedules direct,direct-p2,direct-p4,ring-p2 --rounds 7 --machine-kind $CONCCL_MACHINE_KIND \
    --json $R/tp_timeline.json --markdown $R/tp_timeline.md > $R/tp_timeline.log 2>&1
echo "timeline exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $R/tp_timeline.md | cut -d'|' -f2-5,9-12,15
PYTHONPATH=src timeout 200 python3 -m conccl bench tp --out $R/ops --ops ag_gemm --schedules serial,direct,direct-p2,direct-p4,direct-p4-g2,ring-p2 \
    --machine-kind $CONCCL_MACHINE_KIND > $R/ops.log 2>&1
echo "ops exit $? at $((SECONDS-t0)) s"; grep "^| ag_gemm" $R/ops/tp.md | grep -v serial_ | cut -d'|' -f3-6,8
PYTHONPATH=src timeout $((560 - (SECONDS - t0))) python3 -m conccl bench tp --out $R/block --block --schedules auto,direct,direct-p2 \
    --runs 10 --machine-kind $CONCCL_MACHINE_KIND > $R/block.log 2>&1
echo "block exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $R/block/block.md | cut -d'|' -f3-8
tar -C $OUT -czf $OUT/run3.tgz r && rm -rf $R
