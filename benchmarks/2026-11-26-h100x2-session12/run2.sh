#!/usr/bin/env bash
# Issue 39, push pipeline, second run: the all-gather+GEMM op bench again (a second run for the
# pipelines table), the MLP block forward+backward with auto, direct and push, and the shared-GPU
# rig: tp at world 2; tp, tp_layers, bench_tp, ep, hier, hier_faults, fsdp_hosts, fsdp at world 4
# (session 11's run4 failed ep-w4: the TP part's graph held the graph workspace).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session12/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt 2>&1
PYTHONPATH=src timeout 120 python3 -m conccl bench tp --out $R/ops --ops ag_gemm \
    --impls gemm_only,torch_async_tp,conccl,conccl_auto --machine-kind $CONCCL_MACHINE_KIND > $R/ops.log 2>&1
echo "ops exit $? at $((SECONDS-t0)) s"
PYTHONPATH=src timeout 150 python3 -m conccl bench tp --out $R/block --block --schedules auto,direct,push \
    --machine-kind $CONCCL_MACHINE_KIND > $R/block.log 2>&1
echo "block exit $? at $((SECONDS-t0)) s"; tail -2 $R/block.log
CONCCL_RIG_TIMEOUT=$((560 - (SECONDS - t0))) CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout $((575 - (SECONDS - t0))) \
    python3 -m pytest -q tests/rig -k "tp-w2 or w4 and not eager and not graph and not persistent" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep "^FAILED\|^E " $R/rig.log | head -12
tar -C $OUT -czf $OUT/run2.tgz r
